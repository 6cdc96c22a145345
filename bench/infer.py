"""Inference speed (images/s) of the ACL network's eval forward through every engine, measured in one run (one
environment after the other, so they never share the CPU):

  MindSpore env: eager (MSAdapter, op by op), compiled (test.py's TEST.JIT graph, what the API's "compiled"
                 engine runs), its MINDIR file (GraphCell), its ONNX file (onnxruntime)
  torch env:     eager, its ONNX file (onnxruntime)
  both:          the Python API's default engine (reid.deploy.FeatureExtractor, engine auto, given the config
                 and weights), end to end from decoded HxWx3 uint8 images at the input size

at demo size (BASE_WIDTH 8, DEPTH 26x, 64x32) and full size (BASE_WIDTH 64, DEPTH 50x, 256x128), at batch 1
and 32 (MindSpore writes fixed-batch files: one export per batch), one process per backend and batch size
(each engine built, timed and dropped in turn: at full size MindSpore's graphs take GBs each). The ONNX
rows time the file the API exported (its deploy cache, shared by the runs). Prints images/s, the ratio to
each backend's eager model and the process's peak RSS; the last lines compare the API's default engine with
torch eager at each size and batch. Exports and graph builds compile the network (minutes per file at full
size on 2 cores).

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


def measure(width, depth, height, batch, repeats, folder):
    """{engine: seconds per batch} on the active backend at one batch size, the setup (export / compile) times,
    each file's largest difference from the eager features, and the engine the API picks. Each engine is built,
    timed and dropped before the next, so that the process holds one at a time (at full size MindSpore's graphs
    and exports take GBs each). `folder`: the weights and the API's deploy cache, shared by the runs."""
    import gc
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
    cfg.OUTPUT_DIR = folder
    size = (height, height // 2)

    def fresh():
        np.random.seed(0)
        return build_model(cfg).eval()

    weights = os.path.join(folder, "model-%s-w%d-%s.pth" % (compat.BACKEND, width, depth))
    if not os.path.exists(weights):
        compat.checkpoint.save(compat.checkpoint.state_dict(fresh()), weights)
    cfg.MODEL.WEIGHTS = weights
    images = example_images(batch, size, seed=1)
    tensor = compat.as_tensor(images)
    uint8 = [np.ascontiguousarray(img.transpose(1, 2, 0)).astype(np.uint8) for img in images]
    seconds, setup, diffs, order = {}, {}, {}, []

    def timed(name, call):
        seconds.update(median_seconds([(name, call)], repeats))
        order.append(name)
        gc.collect()

    model = fresh()

    def eager():
        with compat.no_grad():
            return compat.to_numpy(model(tensor))
    reference = eager()
    timed("eager", eager)
    model = None     # each engine dropped before the next
    if compat.IS_MINDSPORE:
        start = time.perf_counter()
        forward = _compiled_forward(fresh())
        with compat.no_grad():
            forward(tensor)
        setup["compiled: graph build"] = time.perf_counter() - start

        def compiled():
            with compat.no_grad():
                return compat.to_numpy(forward(tensor))
        timed("compiled (TEST.JIT graph)", compiled)
        forward = None
        start = time.perf_counter()
        path = os.path.join(folder, "bench-b%d.mindir" % batch)
        export_model(cfg, path, "mindir", batch=batch, check=False, model=fresh())
        setup["export mindir"] = time.perf_counter() - start
        engine = ExportedModel(path)
        diffs["mindir"] = float(np.abs(engine.run(images) - reference).max())
        timed("MINDIR file (GraphCell)", lambda: engine.run(images))
        engine = None
    start = time.perf_counter()
    api = FeatureExtractor(config=cfg, engine="auto", batch_size=batch)
    setup["%s (%s): build, export unless cached" % (API, api.engine)] = time.perf_counter() - start
    if api.model_path:    # the API's own file: dynamic batch (torch), or of this batch size (MindSpore)
        engine = ExportedModel(api.model_path)
        diffs["onnx"] = float(np.abs(engine.run(images) - reference).max())
        timed("ONNX file (onnxruntime)", lambda: engine.run(images))
        engine = None
    name = "%s (%s)" % (API, api.engine)
    timed(name, lambda: api(uint8))
    import onnxruntime
    return {"seconds": seconds, "setup": {k: float(v) for k, v in setup.items()}, "diffs": diffs, "order": order,
            "api": name, "layer": layer_name() + ", onnxruntime %s" % onnxruntime.__version__}


def main():
    def extra(parser):
        parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    args = size_args(__doc__, SIZES, extra=extra)
    batches = [int(b) for b in args.batches.split(",") if b]
    layers, summary = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-infer-") as folder:
        for size in args.sizes.split(","):
            spec = SIZES[size]
            print("%s: %s w%d %dx%d" % (size, spec["depth"], spec["width"], spec["height"], spec["height"] // 2))
            for batch in batches:
                got = on_both_backends("bench.infer:measure", dict(spec, batch=batch, repeats=args.repeats,
                                                                    folder=folder))
                base = {backend: batch / got[backend]["seconds"]["eager"] for backend in got}
                print("  batch %d" % batch)
                for backend in ("mindspore", "torch"):
                    layers[backend] = got[backend]["layer"]
                    for name in got[backend]["order"]:
                        rate = batch / got[backend]["seconds"][name]
                        print("    %-9s %-32s %9.1f images/s   x%6.2f vs eager MindSpore   x%6.2f vs eager torch   "
                              "peak RSS %5.0f MB" % (backend, name, rate, rate / base["mindspore"],
                                                      rate / base["torch"], got[backend]["peak_rss_mb"]), flush=True)
                for backend in ("mindspore", "torch"):
                    for name, seconds in got[backend]["setup"].items():
                        print("    %-9s %-52s %7.1f s (once)" % (backend, name, seconds))
                    for fmt, diff in got[backend]["diffs"].items():
                        print("    %-9s %-52s max |file - eager| = %.2g" % (backend, fmt + " file", diff))
                    rate = batch / got[backend]["seconds"][got[backend]["api"]]
                    summary.append("%s batch %d: %s %s %.1f images/s, x%.2f torch eager (%.1f)" % (
                        size, batch, backend, got[backend]["api"], rate, rate / base["torch"], base["torch"]))
    print("the API's default engine against torch eager:")
    for line in summary:
        print("  " + line)
    print("MindSpore: %s; torch: %s" % (layers["mindspore"], layers["torch"]))


if __name__ == "__main__":
    main()
