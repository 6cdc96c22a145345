"""Speed of the ACL network, MindSpore vs torch, measured in one run (one process after the other, so they
never share the CPU), at full size (DEPTH 50x, BASE_WIDTH 64, 256x128, batch 8, Protocol-2 class counts) and at
demo size (configs/synthetic/acl.yml: BASE_WIDTH 8, DEPTH 26x, 64x32, batch 64, NUM_SPLITS 1):

  eval forward (what evaluation runs), one process each: MindSpore op by op, MindSpore compiled (TEST.JIT,
      reid/evaluation/extract.py's path; its graph-building time is printed), torch; seconds per image, the
      ratio to torch, and each process's peak resident memory;
  train-mode forward and forward + backward w.r.t. every trainable parameter (compat.value_and_grad), op by
      op, one process per backend (--eval-only skips them).

Forwards that need no gradient run without gradient recording on both sides (torch under no_grad), so like is
timed against like. Times are medians of --repeats calls after one warm-up call (which builds the graph).

    python bench/model.py [--sizes demo,full] [--repeats 3] [--eval-only] [--threads N] [--stacks ms27]

`--stacks ms27` times the MindSpore stack of .venv against torch from any interpreter.

Run it from either environment; the other backend runs in its own virtual environment (tests/crossenv.py).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, on_both_backends, stack_variants  # noqa: E402

SIZES = {
    "demo": dict(width=8, depth="26x", height=64, batch=64, splits=1, classes=[100, 100, 100]),
    "full": dict(width=64, depth="50x", height=256, batch=8, splits=1, classes=[11934, 751, 1041]),
}
TRAIN_PARTS = ("forward", "forward+backward")


def measure(width, depth, height, batch, splits, classes, repeats, parts=TRAIN_PARTS + ("eval forward",),
            jit=False, threads=None):
    """Seconds per batch (median of `repeats` after one warm-up) of each of `parts`: a train-mode forward, a
    forward + backward w.r.t. every trainable parameter through compat.value_and_grad, the eval-mode forward
    (compiled when `jit`, through extract_features' own compiled forward), and for the eval forward the
    process's CPU seconds per batch too (all its threads; on a loaded machine the less load-dependent figure,
    exact with one thread). Forwards that need no gradient run under compat.no_grad() on both backends
    (MindSpore records nothing outside value_and_grad; torch would). `threads`: kernel threads of either
    framework (default: MindSpore one per core, torch its own default)."""
    import time

    import compat
    if threads:
        if compat.IS_MINDSPORE:
            compat.jit.set_threads(threads)
        else:
            compat.torch.set_num_threads(int(threads))
    from reid.config import get_cfg
    from reid.evaluation.extract import _compiled_forward
    from reid.modeling import build_model
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = width
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.HEADS.NUM_CLASSES = list(classes)
    cfg.MODEL.NUM_SPLITS = splits
    cfg.TEST.JIT = bool(jit)
    np.random.seed(0)
    model = build_model(cfg)
    model.train()
    images = compat.as_tensor((np.random.RandomState(1).rand(batch, 3, height, height // 2) * 255).astype(np.float32))
    params = [p for _, p in model.named_parameters() if p.requires_grad]

    def forward():
        with compat.no_grad():   # like for like: MindSpore records nothing outside value_and_grad, torch would
            out = model(images)
        return compat.to_numpy(out["feat_norm"])        # reading a result waits for the computation

    def eval_forward():
        model.eval()
        try:
            with compat.no_grad():
                # as extract_features runs it: the compiled forward when model.jit_eval (MindSpore), else the model
                run = _compiled_forward(model) if model.jit_eval else model
                return compat.to_numpy(run(images))
        finally:
            model.train()

    def loss_fn(x):
        out = model(x)
        loss = (out["feat_norm"] * out["feat_norm"]).sum() + out["center_dist"].mean() + out["paths"].sum()
        return loss + sum(l.mean() for l in out["logits"])

    grad_fn = compat.value_and_grad(loss_fn, params) if "forward+backward" in parts else None

    def forward_backward():
        _, _, grads = grad_fn(images)
        return compat.to_numpy(grads[0])

    calls = {"forward": forward, "forward+backward": forward_backward, "eval forward": eval_forward}
    result = {}
    if jit and "eval forward" in parts:
        start = time.perf_counter()
        eval_forward()                                 # builds the graph (median_seconds' warm-up then reuses it)
        result["compile seconds"] = time.perf_counter() - start
    result.update(median_seconds([(name, calls[name]) for name in parts], repeats))
    if "eval forward" in parts:
        cpu = []
        for _ in range(repeats):
            start = time.process_time()
            eval_forward()
            cpu.append(time.process_time() - start)
        result["eval forward cpu"] = float(np.median(cpu))
    result["layer"] = layer_name()
    return result


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated: %s" % ", ".join(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eval-only", action="store_true", help="only the eval-forward rows")
    parser.add_argument("--threads", type=int, default=0, help="kernel threads of both frameworks (0: defaults)")
    parser.add_argument("--stacks", default="", help="MindSpore stacks to time: ms27 (default: "
                        "this environment's)")
    args = parser.parse_args()
    # per MindSpore stack: op by op and compiled; torch last
    variants = stack_variants(args.stacks, {" compiled": {"jit": True}})
    stacks = [label for label in variants if label != "torch" and not label.endswith(" compiled")]
    layers = {}
    for size in args.sizes.split(","):
        spec = dict(SIZES[size], repeats=args.repeats, threads=args.threads or None)
        label = "%-5s %s w%-2d %dx%d b%-2d" % (size, spec["depth"], spec["width"], spec["height"], spec["height"] // 2,
                                              spec["batch"])
        evals = on_both_backends("bench.model:measure", spec, {
            name: (v[0], dict(v[1], parts=("eval forward",))) + tuple(v[2:]) for name, v in variants.items()})
        layers.update({k: v["layer"] for k, v in evals.items() if not k.endswith(" compiled")})
        torch_s = evals["torch"]["eval forward"] / spec["batch"]
        torch_cpu = evals["torch"]["eval forward cpu"] / spec["batch"]
        for name in variants:
            got = evals[name]
            per_image, cpu = got["eval forward"] / spec["batch"], got["eval forward cpu"] / spec["batch"]
            extra = ", graph built in %.0f s" % got["compile seconds"] if "compile seconds" in got else ""
            print("%s eval forward  %-18s %8.4f s/img (%5.2fx torch)  CPU %8.4f s/img (%5.2fx)  peak RSS %6.0f MB%s"
                  % (label, name, per_image, per_image / torch_s, cpu, cpu / torch_cpu, got["peak_rss_mb"], extra),
                  flush=True)
        for stack in stacks:
            print("%s eval forward  %s compiled / op by op: time %.2fx, CPU %.2fx" % (
                label, stack, evals[stack + " compiled"]["eval forward"] / evals[stack]["eval forward"],
                evals[stack + " compiled"]["eval forward cpu"] / evals[stack]["eval forward cpu"]), flush=True)
        if args.eval_only:
            continue
        train_variants = {k: (v[0], dict(v[1], parts=TRAIN_PARTS)) + tuple(v[2:])
                          for k, v in variants.items() if not k.endswith(" compiled")}
        got = on_both_backends("bench.model:measure", spec, train_variants)
        tr = got["torch"]
        for stack in stacks:
            for name in TRAIN_PARTS:
                ms = got[stack][name] / spec["batch"]
                print("%s %-17s %-9s %8.4f s/img   torch %8.4f s/img   ratio %5.2fx"
                      % (label, name, stack, ms, tr[name] / spec["batch"], ms * spec["batch"] / tr[name]), flush=True)
        print("%s train-mode processes' peak RSS: %s, torch %.0f MB" % (label, ", ".join(
            "%s %.0f MB" % (stack, got[stack]["peak_rss_mb"]) for stack in stacks), tr["peak_rss_mb"]), flush=True)
    print("; ".join("%s: %s" % (k, v) for k, v in layers.items()))

if __name__ == "__main__":
    main()
