"""Inference speed (images/s) of the ACL network's eval forward through every engine, measured in one run (one
environment after the other, so they never share the CPU):

  MindSpore env: eager (op by op), compiled (test.py's TEST.JIT graph, what the API's "compiled"
                 engine runs), its MINDIR file (GraphCell), its ONNX file (onnxruntime)
  torch env:     eager, its ONNX file (onnxruntime)
  both:          the Python API's default engine (reid.deploy.FeatureExtractor, engine auto, given the config
                 and weights), end to end from decoded HxWx3 uint8 images at the input size

at demo size (BASE_WIDTH 8, DEPTH 26x, 64x32) and full size (BASE_WIDTH 64, DEPTH 50x, 256x128), at batch 1
and 32 (MindSpore writes fixed-batch files: one export per batch), each engine in a process of its own (its
peak RSS is its own; one stopped above MAX_RSS_MB is reported, not measured). The ONNX rows time the file the
API exported (its deploy cache, shared by the runs). Prints images/s, the ratio to each backend's eager
model, the peak RSS and the setup time; the last lines compare the API's default engine with torch eager at
each size and batch. Exports and graph builds compile the network (a minute or more per file at full size
on 2 cores).

    python bench/infer.py [--sizes demo,full] [--batches 1,32] [--repeats 3]
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, run_isolated, size_args  # noqa: E402

SIZES = {
    "demo": dict(width=8, depth="26x", height=64),
    "full": dict(width=64, depth="50x", height=256),
}
API = "API default"


ENGINES = {"mindspore": ("eager", "compiled", "mindir", "api", "onnx"), "torch": ("eager", "api", "onnx")}
LABELS = {"eager": "eager", "compiled": "compiled (TEST.JIT graph)", "mindir": "MINDIR file (GraphCell)",
          "onnx": "ONNX file (onnxruntime)"}
# A process whose resident memory passes this is stopped and its row says so (a MINDIR GraphCell of the full
# network at batch 32 can pass it); the machine's other jobs keep their memory
MAX_RSS_MB = 12000


def measure(engine, width, depth, height, batch, repeats, folder):
    """Seconds per batch of one engine on the active backend (one process per engine, so that each row's peak
    RSS is its own and one engine's memory cannot take the others down), its setup (export / compile) time and,
    for a file, its largest difference from the eager features. "api": the FeatureExtractor's default engine,
    end to end from uint8 images, which exports into `folder` (its deploy cache); "onnx" times the file it
    wrote there (of this batch size on MindSpore, dynamic on torch). `folder` also holds the weights."""
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
    out = {"setup": None, "diff": None, "label": LABELS.get(engine)}

    def eager_features(model):
        with compat.no_grad():
            return compat.to_numpy(model(tensor))
    start = time.perf_counter()
    if engine == "eager":
        model = fresh()
        call = lambda: eager_features(model)   # noqa: E731
    elif engine == "compiled":
        forward = _compiled_forward(fresh())
        call = lambda: eager_features(forward)   # noqa: E731
        call()
        out["setup"] = ("graph build", time.perf_counter() - start)
    elif engine == "api":
        api = FeatureExtractor(config=cfg, engine="auto", batch_size=batch)
        assert api.net is not None       # built (and exported) now, not inside the first timed call
        out["setup"] = ("build, export unless cached", time.perf_counter() - start)
        out["label"] = "%s (%s)" % (API, api.engine)
        uint8 = [np.ascontiguousarray(img.transpose(1, 2, 0)).astype(np.uint8) for img in images]
        call = lambda: api(uint8)   # noqa: E731
    else:
        if engine == "mindir":
            path = os.path.join(folder, "bench-b%d.mindir" % batch)
            export_model(cfg, path, "mindir", batch=batch, check=False, model=fresh())
            out["setup"] = ("export", time.perf_counter() - start)
        else:    # the API's file: it ran first
            api = FeatureExtractor(config=cfg, engine="onnx", batch_size=batch)
            assert api.net is not None
            path = api.model_path
        file = ExportedModel(path)
        out["diff"] = float(np.abs(file.run(images) - eager_features(fresh())).max())
        call = lambda: file.run(images)   # noqa: E731
    out["seconds"] = median_seconds([(engine, call)], repeats)[engine]
    import onnxruntime
    out["layer"] = layer_name() + ", onnxruntime %s" % onnxruntime.__version__
    return out


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
                got = {backend: {} for backend in ENGINES}
                for backend, engines in ENGINES.items():
                    for engine in engines:
                        got[backend][engine] = run_isolated(backend, "bench.infer:measure", dict(
                            spec, engine=engine, batch=batch, repeats=args.repeats, folder=folder),
                            max_rss_mb=MAX_RSS_MB)
                base = {backend: batch / got[backend]["eager"]["seconds"] for backend in got}
                print("  batch %d" % batch)
                for backend, engines in ENGINES.items():
                    for engine in engines:
                        row = got[backend][engine]
                        if "killed_above_mb" in row:
                            print("    %-9s %-32s not measured: stopped above %d MB of resident memory"
                                  % (backend, LABELS.get(engine, API), row["killed_above_mb"]), flush=True)
                            continue
                        layers[backend] = row["layer"]
                        rate = batch / row["seconds"]
                        setup = " (once: %s %.1f s)" % row["setup"] if row["setup"] else ""
                        diff = "; max |file - eager| %.2g" % row["diff"] if row["diff"] is not None else ""
                        print("    %-9s %-32s %9.1f images/s   x%6.2f vs eager MindSpore   x%6.2f vs eager torch   "
                              "peak RSS %5.0f MB%s%s" % (backend, row["label"], rate, rate / base["mindspore"],
                                                         rate / base["torch"], row["peak_rss_mb"], setup, diff),
                              flush=True)
                        if engine == "api":
                            summary.append("%s batch %d: %s %s %.1f images/s, x%.2f torch eager (%.1f)" % (
                                size, batch, backend, row["label"], rate, rate / base["torch"], base["torch"]))
    print("the API's default engine against torch eager:")
    for line in summary:
        print("  " + line)
    print("MindSpore: %s; torch: %s" % (layers["mindspore"], layers["torch"]))


if __name__ == "__main__":
    main()
