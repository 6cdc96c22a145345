"""Inference speed (images/s) of the ACL network's eval forward through every engine, measured in one run (one
environment after the other, so they never share the CPU):

  MindSpore env: eager (MSAdapter, op by op), compiled (test.py's TEST.JIT graph, what the API's "compiled"
                 engine runs), its MINDIR file (GraphCell), its ONNX file (onnxruntime)
  torch env:     eager, its ONNX file (onnxruntime)
  both:          the Python API's default engine (reid.deploy.FeatureExtractor, engine auto, given the config
                 and weights), end to end from decoded HxWx3 uint8 images at the input size

at demo size (BASE_WIDTH 8, DEPTH 26x, 64x32) and full size (BASE_WIDTH 64, DEPTH 50x, 256x128), at batch 1
and 32 (MindSpore writes fixed-batch files: one export per batch). Prints images/s and the ratio to each
backend's eager model; the last lines compare the API's default engine with torch eager at each size and
batch. Exports and graph builds compile the network (minutes per file at full size on 2 cores).

    python bench/infer.py [--sizes demo,full] [--batches 1,32] [--repeats 3]
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, on_both_backends, size_args  # noqa: E402

SIZES = {
    "demo": dict(width=8, depth="26x", height=64),
    "full": dict(width=64, depth="50x", height=256),
}
API = "API default"


def measure(width, depth, height, batches, repeats):
    """{batch: {engine: seconds per batch}} on the active backend, the setup (export / compile) times, each
    file's largest difference from the eager features, and the engine the API picks."""
    with tempfile.TemporaryDirectory(prefix="bench-infer-") as tmp:
        return _measure(tmp, width, depth, height, batches, repeats)


def _measure(tmp, width, depth, height, batches, repeats):
    import time

    import compat
    from reid.config import get_cfg
    from reid.deploy import ExportedModel, FeatureExtractor, export_model
    from reid.deploy.export import example_images
    from reid.evaluation.extract import _compiled_forward
    from reid.modeling import build_model

    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = width
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [100, 100, 100]
    cfg.MODEL.NUM_SPLITS = 1
    cfg.MODEL.COMPILE_CACHE = "off"
    cfg.INPUT.SIZE_TEST = [height, height // 2]
    cfg.OUTPUT_DIR = tmp
    size = (height, height // 2)

    def fresh():
        np.random.seed(0)
        return build_model(cfg).eval()

    weights = os.path.join(tmp, "model.pth")
    compat.checkpoint.save(compat.checkpoint.state_dict(fresh()), weights)
    cfg.MODEL.WEIGHTS = weights
    model = fresh()
    setup, diffs, seconds = {}, {}, {}
    start = time.perf_counter()
    api = FeatureExtractor(config=cfg, engine="auto")
    setup["%s (%s): build%s" % (API, api.engine, ", export" if api.model_path else "")] = time.perf_counter() - start
    formats = ("mindir", "onnx") if compat.IS_MINDSPORE else ("onnx",)
    files = {}
    for batch in batches:
        images = example_images(batch, size, seed=1)
        tensor = compat.as_tensor(images)
        uint8 = [np.ascontiguousarray(img.transpose(1, 2, 0)).astype(np.uint8) for img in images]

        def eager():
            with compat.no_grad():
                return compat.to_numpy(model(tensor))
        reference = eager()
        calls = [("eager", eager)]
        if compat.IS_MINDSPORE:
            graph_model = fresh()
            start = time.perf_counter()
            forward = _compiled_forward(graph_model)
            with compat.no_grad():
                forward(tensor)
            setup["compiled, batch %d: graph build" % batch] = time.perf_counter() - start

            def compiled(forward=forward):
                with compat.no_grad():
                    return compat.to_numpy(forward(tensor))
            calls.append(("compiled (TEST.JIT graph)", compiled))
        for fmt in formats:
            dynamic = not compat.IS_MINDSPORE
            path = files.get(fmt) if dynamic else None
            if path is None:
                path = os.path.join(tmp, "acl-b%d.%s" % (batch, fmt))
                start = time.perf_counter()
                export_model(cfg, path, fmt, batch=batch, check=False, model=fresh())
                setup["export %s%s" % (fmt, "" if dynamic else ", batch %d" % batch)] = time.perf_counter() - start
                files[fmt] = path
            engine = ExportedModel(path)
            diffs[fmt] = max(diffs.get(fmt, 0.0), float(np.abs(engine.run(images) - reference).max()))
            label = "MINDIR file (GraphCell)" if fmt == "mindir" else "ONNX file (onnxruntime)"
            calls.append((label, lambda engine=engine: engine.run(images)))
        api.batch_size = batch
        calls.append(("%s (%s)" % (API, api.engine), lambda: api(uint8)))
        seconds[batch] = median_seconds(calls, repeats)
    result = {"seconds": seconds, "setup": {k: float(v) for k, v in setup.items()}, "diffs": diffs,
              "api_engine": api.engine, "order": [name for name, _ in calls]}
    import onnxruntime
    result["layer"] = layer_name() + ", onnxruntime %s" % onnxruntime.__version__
    return result


def main():
    def extra(parser):
        parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    args = size_args(__doc__, SIZES, extra=extra)
    batches = [int(b) for b in args.batches.split(",") if b]
    layers, summary = {}, []
    for size in args.sizes.split(","):
        spec = dict(SIZES[size], batches=batches, repeats=args.repeats)
        got = on_both_backends("bench.infer:measure", spec)
        print("%s: %s w%d %dx%d" % (size, spec["depth"], spec["width"], spec["height"], spec["height"] // 2))
        for batch in batches:
            base = {backend: batch / got[backend]["seconds"][batch]["eager"] for backend in got}
            print("  batch %d" % batch)
            for backend in ("mindspore", "torch"):
                for name in got[backend]["order"]:
                    rate = batch / got[backend]["seconds"][batch][name]
                    print("    %-9s %-32s %9.1f images/s   x%6.2f vs eager MindSpore   x%6.2f vs eager torch"
                          % (backend, name, rate, rate / base["mindspore"], rate / base["torch"]), flush=True)
            for backend in ("mindspore", "torch"):
                name = "%s (%s)" % (API, got[backend]["api_engine"])
                rate = batch / got[backend]["seconds"][batch][name]
                summary.append("%s batch %d: %s %s %.1f images/s, x%.2f torch eager (%.1f)" % (
                    size, batch, backend, name, rate, rate / base["torch"], base["torch"]))
        for backend in ("mindspore", "torch"):
            layers[backend] = got[backend]["layer"]
            for name, seconds in got[backend]["setup"].items():
                print("  %-9s %-46s %7.1f s (once)" % (backend, name, seconds))
            for fmt, diff in got[backend]["diffs"].items():
                print("  %-9s %-46s max |file - eager| = %.2g" % (backend, fmt + " file", diff))
    print("the API's default engine against torch eager:")
    for line in summary:
        print("  " + line)
    print("MindSpore: %s; torch: %s" % (layers["mindspore"], layers["torch"]))


if __name__ == "__main__":
    main()
