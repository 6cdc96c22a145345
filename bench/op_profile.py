"""Where an op-by-op training step's time goes, by layer and by op, on each MindSpore stack side by side (torch
for reference): op-by-op basic steps (MODEL.JIT False) of the demo network through the real Trainer, each stack
in a fresh process of its environment, one after the other.

    python bench/op_profile.py [--stacks ms27,msadapter] [--steps 4] [--top 12]

Per stack: the seconds per step without a profiler (median of --steps), then the same steps under cProfile, each
function's own time given to the layer its file belongs to:

  reid            the network, losses, trainer (ours)
  compat          the adaptation layer (ours)
  torch-API layer msadapter / mindtorch's Python (argument handling, its Tensor wrapping)
  MindSpore       MindSpore's Python (op wrappers, executor calls, tensor classes) and the native work its
                  executor objects do when called (cProfile sees no separate entry for those: op dispatch, the
                  backward pass of the differentiated call, kernels launched synchronously)
  native calls    C functions called from Python with an entry of their own: MindSpore 2.6's generated op
                  functions (pyboost), attribute writes on tensors, numpy
  other           the standard library, the data pipeline

A kernel's time shows wherever the first call that needs its result waits: in an op launch, or on MindSpore 2.6
in the torch-API layer setting a flag on the op's output (mindtorch's `Tensor.__init__`, a "native call"). So the
split says where the stacks differ, not what each kernel costs (bench/kernels.py --op-by-op). cProfile's own
overhead (~1 us per Python call) inflates the Python layers; the plain seconds are the step time.

Per op: the torch-API functions that reid/ and compat/ call (the layer boundary), with calls per step and
milliseconds per step including everything below them (dispatch and kernels), the --top of each stack.
"""
import cProfile
import os
import pstats
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, run_isolated, size_args, stack_variants  # noqa: E402
from bench.train_step import COMMON, SIZES  # noqa: E402

LAYERS = ("reid", "compat", "torch-API layer", "MindSpore", "native calls", "other")


def _layer(filename):
    path = filename.replace("\\", "/")
    if path.startswith("~") or path.startswith("<built-in") or path.startswith("{"):
        return "native calls"
    if "/site-packages/msadapter/" in path or "/site-packages/mindtorch/" in path:
        return "torch-API layer"
    if "/site-packages/mindspore/" in path:
        return "MindSpore"
    if "/site-packages/torch/" in path:
        return "torch-API layer"
    if path.startswith(os.path.join(ROOT, "reid")):
        return "reid"
    if path.startswith(os.path.join(ROOT, "compat")):
        return "compat"
    return "other"


def _is_layer_api(filename):
    return _layer(filename) == "torch-API layer"


def measure(overrides, root, steps):
    import compat
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", "False"])
    trainer = Trainer(cfg, quiet=True)
    trainer.iter = 1
    for _ in range(2):  # the first steps build MindSpore's backward-graph cache
        trainer.basic_step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.basic_step()
        times.append(time.perf_counter() - start)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(steps):
        trainer.basic_step()
    profile.disable()
    profiled = (time.perf_counter() - start) / steps
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, callers)}
    layers = dict.fromkeys(LAYERS, 0.0)
    for (filename, _, _), (_, _, own, _, _) in stats.items():
        layers[_layer(filename)] += own / steps
    ops = {}
    for (filename, line, name), (calls, _, _, _, callers) in stats.items():
        if not _is_layer_api(filename) or name == "__call__":  # (a module's call holds the modules it calls)
            continue
        # calls and time from our code only: what the network and compat ask of the layer
        from_ours = [(c, cum) for (cf, _, _), (c, _, _, cum) in callers.items() if _layer(cf) in ("reid", "compat")]
        if from_ours:
            key = "%s (%s)" % (name, os.path.basename(filename))
            ops[key] = (sum(c for c, _ in from_ours) / steps, 1000.0 * sum(cum for _, cum in from_ours) / steps)
    times.sort()
    return {"step_s": times[len(times) // 2], "profiled_step_s": profiled, "layers": layers, "ops": ops,
            "layer": layer_name(), "backend": compat.BACKEND}


def main():
    def extra(parser):
        parser.add_argument("--steps", type=int, default=4, help="basic steps timed, then profiled (default 4)")
        parser.add_argument("--top", type=int, default=12, help="ops listed per stack (default 12)")
    args = size_args(__doc__, SIZES, default="demo", extra=extra)
    from reid.data.synthetic import ensure_synthetic
    variants = stack_variants(args.stacks or "ms27,msadapter")
    with tempfile.TemporaryDirectory(prefix="bench-op-profile-") as root:
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        for size in args.sizes.split(","):
            got = {label: run_isolated(v[0], "bench.op_profile:measure",
                                       {"overrides": SIZES[size], "root": root, "steps": args.steps}, python=v[2])
                   for label, v in variants.items()}
            labels = list(got)
            print("%s op-by-op basic step: %s" % (size, "; ".join("%s = %s" % (k, got[k]["layer"]) for k in labels)))
            print("  %-22s %s" % ("", "".join("%22s" % k for k in labels)))
            print("  %-22s %s" % ("seconds per step", "".join("%22.3f" % got[k]["step_s"] for k in labels)))
            print("  %-22s %s" % ("profiled, s per step", "".join("%22.3f" % got[k]["profiled_step_s"]
                                                                  for k in labels)))
            for layer in LAYERS:
                print("  %-22s %s" % (layer, "".join(
                    "%13.0f ms %5.1f%%" % (1000 * got[k]["layers"][layer],
                                           100 * got[k]["layers"][layer] / max(sum(got[k]["layers"].values()), 1e-9))
                    for k in labels)))
            for k in labels:
                if got[k]["backend"] != "mindspore":
                    continue
                print("  %s: the torch-API layer's functions as reid/ and compat/ call them (per step)" % k)
                top = sorted(got[k]["ops"].items(), key=lambda kv: -kv[1][1])[:args.top]
                for name, (calls, ms) in top:
                    print("    %-58s %6.0f calls %8.1f ms" % (name[:58], calls, ms))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
