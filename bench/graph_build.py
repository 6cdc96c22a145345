"""What building each compiled MindSpore graph of the demo-size network costs: seconds and resident memory.

Graphs, each built in a fresh process (`--graphs`, default eval,basic):
  eval   the evaluation forward (compiled extract_features' graph) of the demo network (BASE_WIDTH 8, DEPTH 26x,
         3 domains)
         on a batch of 64 images of 64x32, then 3 timed calls of the built graph;
  basic  the compiled basic training step (MODEL.JIT True) at bench/train_step.py's demo size, then timed steps;
  steps  all three training-step graphs (basic, meta-train, meta-test) as a demo run with MODEL.JIT True builds
         them, then timed basic and meta steps.
For each graph its build line from compat.jit is printed: build seconds (first call included), resident memory
the build added and what stays after its leftovers are released; plus the process's peak resident memory and
the seconds per call of the built graph. The machine's load average is printed at the start and at the end
(builds are single-threaded Python + type inference: a loaded machine slows them).

    python bench/graph_build.py [--graphs eval,basic,steps] [--repeats 3] [--jit-level O1]
"""
import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import run_isolated  # noqa: E402


def _context(jit_level, env):
    import compat
    graphs = []
    compat.jit.log = graphs.append
    if jit_level:
        compat.jit.set_jit_level(jit_level)
    return graphs


def eval_graph(repeats=3, jit_level="", env=None):
    """Build the demo network's evaluation graph on a batch of 64 and time `repeats` calls of it."""
    import time

    import numpy as np

    import compat
    from reid.config import get_cfg
    from reid.modeling import build_model
    graphs = _context(jit_level, env)
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = 8
    cfg.MODEL.BACKBONE.DEPTH = "26x"  # the demo's (configs/synthetic/acl.yml)
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [80, 80, 80]
    np.random.seed(0)
    model = build_model(cfg)
    compat.jit.prepare(model)
    model.eval()
    images = compat.as_tensor((np.random.RandomState(1).rand(64, 3, 64, 32) * 255).astype(np.float32))

    def eval_forward(images):  # as reid.evaluation.extract compiles it (no compile cache: always built)
        return model(images)
    forward = compat.jit.compiled(eval_forward, "eval_forward")
    times = []
    with compat.no_grad():
        forward(images)
        for _ in range(repeats):
            start = time.perf_counter()
            compat.to_numpy(forward(images))
            times.append(time.perf_counter() - start)
    graph = forward.graph
    return {"graphs": graphs, "build_s": graph.compile_seconds, "memory": graph.memory,
            "call_s": float(np.median(times))}


def step_graphs(repeats=3, jit_level="", steps=("basic",), env=None):
    """bench/train_step.py's demo-size measurement with MODEL.JIT True: the graphs of `steps` built."""
    from bench.train_step import SIZES, measure
    from reid.data.synthetic import ensure_synthetic
    _context(jit_level, env)
    with tempfile.TemporaryDirectory(prefix="bench-graphs-") as root:
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        return measure(SIZES["demo"], root, repeats, jit=True, steps=tuple(steps))


def _load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="eval,basic", help="comma-separated: eval, basic, steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jit-level", default="", help="MindSpore JitConfig jit_level for every graph (O0-O2)")
    args = parser.parse_args()
    print("start: %s" % _load(), flush=True)
    for which in args.graphs.split(","):
        if which == "eval":
            got = run_isolated("mindspore", "bench.graph_build:eval_graph",
                               {"repeats": args.repeats, "jit_level": args.jit_level})
            print("eval   built in %.1f s; resident MB before / after build: %s; peak %.0f MB; "
                  "call %.3f s (batch 64)" % (got["build_s"], " / ".join("%.0f" % m for m in got["memory"] if m),
                                              got["peak_rss_mb"], got["call_s"]), flush=True)
        elif which in ("basic", "steps"):
            steps = ("basic",) if which == "basic" else ("basic", "meta")
            got = run_isolated("mindspore", "bench.graph_build:step_graphs",
                               {"repeats": args.repeats, "jit_level": args.jit_level, "steps": steps})
            for line in got["graphs"]:
                print("%-6s %s" % (which, line), flush=True)
            print("%-6s first basic step (build included) %.1f s; warm-up %.1f s; peak %.0f MB; resident after "
                  "warm-up %.0f MB; %s" % (which, got["first_basic_s"], got["warm_up_s"], got["peak_rss_mb"],
                                           got["rss_after_warm_up_mb"],
                                           "; ".join("%s step %.3f s" % (s, got[s]) for s in steps)), flush=True)
        else:
            raise SystemExit("unknown graph %r: eval, basic or steps" % which)
        print("after %s: %s" % (which, _load()), flush=True)


if __name__ == "__main__":
    main()
