"""Inference speed (images/s) of the ACL network's eval forward through every engine, measured in one run (one
environment after the other, so they never share the CPU):

  MindSpore env: eager (MSAdapter, op by op), the inference network op by op (BN folded), the inference
                 network compiled by mindspore.jit (and the eager model compiled, where it compiles), its
                 MINDIR file (GraphCell), its ONNX file (onnxruntime)
  torch env:     eager, the inference network, its ONNX file (onnxruntime)

at demo size (BASE_WIDTH 8, DEPTH 26x, 64x32, batch 64) and full size (BASE_WIDTH 64, DEPTH 50x, 256x128,
batch 4). Prints images/s and the ratio to each backend's eager model. Exports compile the network (minutes
per file on 2 cores).

    python bench/infer.py [--sizes demo,full] [--repeats 3]
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, on_both_backends, size_args  # noqa: E402

SIZES = {
    "demo": dict(width=8, depth="26x", height=64, batch=64),
    "full": dict(width=64, depth="50x", height=256, batch=4),
}


def measure(width, depth, height, batch, repeats):
    """{engine: seconds per batch} on the active backend, plus the export / compile times."""
    import time

    import compat
    from compat.export import CompiledRunner
    from reid.config import get_cfg
    from reid.deploy import InferenceNet, export_model
    from reid.deploy.export import ExportedModel, example_images
    from reid.modeling import build_model

    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = width
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [100, 100, 100]
    cfg.MODEL.NUM_SPLITS = 1
    cfg.INPUT.SIZE_TEST = [height, height // 2]
    size = (height, height // 2)

    def fresh():
        np.random.seed(0)
        return build_model(cfg).eval()

    images = example_images(batch, size, seed=1)
    tensor = compat.as_tensor(images)
    model = fresh()
    net = InferenceNet(fresh(), size).eval()

    def eager():
        with compat.no_grad():
            return compat.to_numpy(model(tensor))

    def inference_net():
        with compat.no_grad():
            return compat.to_numpy(net(tensor))

    calls = [("eager", eager), ("inference net", inference_net)]
    setup, unavailable = {}, {}
    if compat.IS_MINDSPORE:
        start = time.perf_counter()
        compiled = CompiledRunner(InferenceNet(fresh(), size).eval())
        compiled.run(images)
        setup["compiled"] = time.perf_counter() - start
        calls.append(("compiled (mindspore.jit)", lambda: compiled.run(images)))
        # the eager model itself compiled, once its layers are graph-friendly
        try:
            compiled_model = CompiledRunner(fresh())
            compiled_model.run(images)
            calls.append(("compiled eager model", lambda: compiled_model.run(images)))
        except Exception as exc:  # noqa: BLE001  (reported, not hidden: the row says why it is missing)
            unavailable["compiled eager model"] = str(exc).strip().splitlines()[0][:100]
    formats = ("mindir", "onnx") if compat.IS_MINDSPORE else ("onnx",)
    reference = eager()
    diffs = {}
    with tempfile.TemporaryDirectory(prefix="bench-infer-") as tmp:
        for fmt in formats:
            path = os.path.join(tmp, "acl.%s" % fmt)
            start = time.perf_counter()
            export_model(cfg, path, fmt, batch=batch, check=False, model=fresh())
            setup["export " + fmt] = time.perf_counter() - start
            engine = ExportedModel(path)
            diffs[fmt] = float(np.abs(engine.run(images) - reference).max())
            label = "MINDIR (GraphCell)" if fmt == "mindir" else "ONNX (onnxruntime)"
            calls.append((label, lambda engine=engine: engine.run(images)))
        result = median_seconds(calls, repeats)
    result.update(setup={k: float(v) for k, v in setup.items()}, diffs=diffs, unavailable=unavailable,
                  layer=layer_name(),
                  order=[name for name, _ in calls])
    import onnxruntime
    result["layer"] += ", onnxruntime %s" % onnxruntime.__version__
    return result


def main():
    args = size_args(__doc__, SIZES)
    layers = {}
    for size in args.sizes.split(","):
        spec = dict(SIZES[size], repeats=args.repeats)
        got = on_both_backends("bench.infer:measure", spec)
        base = {backend: spec["batch"] / got[backend]["eager"] for backend in got}
        print("%s: %s w%d %dx%d batch %d" % (size, spec["depth"], spec["width"], spec["height"], spec["height"] // 2,
                                              spec["batch"]))
        for backend in ("mindspore", "torch"):
            layers[backend] = got[backend]["layer"]
            for name in got[backend]["order"]:
                rate = spec["batch"] / got[backend][name]
                print("  %-9s %-26s %9.1f images/s   x%6.2f vs eager MindSpore   x%6.2f vs eager torch"
                      % (backend, name, rate, rate / base["mindspore"], rate / base["torch"]), flush=True)
            for name, seconds in got[backend]["setup"].items():
                print("  %-9s %-26s %9.1f s (once)" % (backend, name, seconds))
            for name, reason in got[backend]["unavailable"].items():
                print("  %-9s %-26s not available: %s" % (backend, name, reason))
            for fmt, diff in got[backend]["diffs"].items():
                print("  %-9s %-26s max |file - eager| = %.2g" % (backend, fmt, diff))
    print("MindSpore: %s; torch: %s" % (layers["mindspore"], layers["torch"]))


if __name__ == "__main__":
    main()
