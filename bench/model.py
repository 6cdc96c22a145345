"""Speed of the ACL network, MindSpore vs torch, measured in one run (one backend after the other, so they
never share the CPU): train-mode forward, forward+backward and eval forward time per image, MindSpore op by
op and with the eval forward compiled (MODEL.JIT), at full size (BASE_WIDTH 64, 256x128, batch 8, Protocol-2
class counts) and at demo size (configs/synthetic/acl.yml: BASE_WIDTH 8, 64x32, batch 64, NUM_SPLITS 1).
Prints seconds per image and the MindSpore/torch ratio. Forwards run without gradient recording on both
sides (torch under no_grad), so like is timed against like.

    python bench/model.py [--sizes demo,full] [--repeats 3] [--stacks msadapter,mindtorch]

Run it from either environment; the other backend runs in its own virtual environment (tests/crossenv.py).
`--stacks msadapter,mindtorch` times both MindSpore stacks (.venv, .venv-mindtorch) against torch in one run.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, on_both_backends, size_args, stack_variants  # noqa: E402

SIZES = {
    "demo": dict(width=8, height=64, batch=64, splits=1, classes=[100, 100, 100]),
    "full": dict(width=64, height=256, batch=8, splits=1, classes=[11934, 751, 1041]),
}


def measure(width, height, batch, splits, classes, repeats, jit=False):
    """Seconds per batch (median of `repeats` after one warm-up) of a train-mode forward, of a forward +
    backward w.r.t. every trainable parameter through compat.value_and_grad, and of the eval-mode forward
    (compiled when `jit`, as MODEL.JIT runs evaluation). Forwards that need no gradient run under
    compat.no_grad() on both backends (MindSpore records nothing outside value_and_grad; torch would)."""
    import compat
    from reid.config import get_cfg
    from reid.modeling import build_model
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = width
    cfg.MODEL.HEADS.NUM_CLASSES = list(classes)
    cfg.MODEL.NUM_SPLITS = splits
    np.random.seed(0)
    model = build_model(cfg)
    model.train()
    images = compat.as_tensor((np.random.RandomState(1).rand(batch, 3, height, height // 2) * 255).astype(np.float32))
    params = [p for _, p in model.named_parameters() if p.requires_grad]

    def forward():
        with compat.no_grad():   # like for like: MindSpore records nothing outside value_and_grad, torch would
            out = model(images)
        return compat.to_numpy(out["feat_norm"])        # reading a result waits for the computation

    def eval_model(x):
        return model(x)
    eval_forward_fn = compat.jit.compiled(eval_model, "bench_eval_forward") if jit else eval_model

    def eval_forward():
        model.eval()
        try:
            with compat.no_grad():
                return compat.to_numpy(eval_forward_fn(images))
        finally:
            model.train()

    def loss_fn(x):
        out = model(x)
        loss = (out["feat_norm"] * out["feat_norm"]).sum() + out["center_dist"].mean() + out["paths"].sum()
        return loss + sum(l.mean() for l in out["logits"])

    grad_fn = compat.value_and_grad(loss_fn, params)

    def forward_backward():
        _, _, grads = grad_fn(images)
        return compat.to_numpy(grads[0])

    if jit:
        compat.jit.prepare(model)
    result = median_seconds((("forward", forward), ("forward+backward", forward_backward),
                             ("eval forward", eval_forward)), repeats)
    result["layer"] = layer_name()
    return result


def main():
    args = size_args(__doc__, SIZES)
    variants = stack_variants(args.stacks, {"-jit": {"jit": True}})
    stacks = [label for label in variants if label != "torch" and not label.endswith("-jit")]
    layers = {}
    for size in args.sizes.split(","):
        spec = dict(SIZES[size], repeats=args.repeats)
        got = on_both_backends("bench.model:measure", spec, variants)
        layers.update((label, got[label]["layer"]) for label in stacks + ["torch"])
        shape = "%-5s w%-2d %dx%d b%-2d" % (size, spec["width"], spec["height"], spec["height"] // 2, spec["batch"])
        tr = {name: got["torch"][name] / spec["batch"] for name in ("forward", "forward+backward", "eval forward")}
        for stack in stacks:
            side = "MindSpore" if stack == "mindspore" else stack
            ms = got[stack + "-jit"]["eval forward"] / spec["batch"]
            print("%s %-17s compiled %-9s %8.4f s/img   torch %8.4f s/img   ratio %5.2fx"
                  % (shape, "eval forward", side, ms, tr["eval forward"], ms / tr["eval forward"]), flush=True)
            for name in ("forward", "forward+backward", "eval forward"):
                ms = got[stack][name] / spec["batch"]
                print("%s %-17s %-9s %8.4f s/img   torch %8.4f s/img   ratio %5.2fx"
                      % (shape, name, side, ms, tr[name], ms / tr[name]), flush=True)
    print("; ".join("%s: %s" % ("MindSpore" if k == "mindspore" else k, v) for k, v in layers.items()))


if __name__ == "__main__":
    main()
