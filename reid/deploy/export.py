"""Export a trained model to ONNX / MINDIR with a JSON sidecar, and load such a file back as an evaluation
engine (`test.py --engine onnx|mindir --model PATH`)."""
import json
import os

import numpy as np

import compat
from compat import export as backend_export
from compat import torch
from reid.errors import UserError

from reid.deploy.inference import InferenceNet

FORMATS = backend_export.FORMATS
SUFFIX = backend_export.SUFFIX
SIDECAR_VERSION = 1


def format_of(path, fmt=None):
    """The format named, else the one of the file suffix; the two must agree."""
    by_suffix = {v: k for k, v in SUFFIX.items()}.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        if by_suffix is None:
            raise UserError("cannot tell the format of %r from its suffix; name it *.onnx or *.mindir, or give "
                            "--format / --engine" % path)
        return by_suffix
    fmt = str(fmt).lower()
    if fmt not in FORMATS:
        raise UserError("unknown model format %r; use one of: %s" % (fmt, ", ".join(FORMATS)))
    if by_suffix != fmt:
        raise UserError("%s does not end with %s, the suffix of format %s; rename it or pick the matching format"
                        % (path, SUFFIX[fmt], fmt))
    return fmt


def sidecar_path(path):
    return path + ".json"


def example_images(batch, size, seed=0):
    """A reproducible batch of float32 RGB images in 0..255, (batch, 3, H, W)."""
    h, w = size
    return (np.random.RandomState(seed).rand(batch, 3, h, w) * 255).astype(np.float32)


def model_description(cfg):
    return {"meta_architecture": cfg.MODEL.META_ARCHITECTURE, "backbone": cfg.MODEL.BACKBONE.NAME,
            "depth": cfg.MODEL.BACKBONE.DEPTH,
            "base_width": int(cfg.MODEL.BACKBONE.BASE_WIDTH), "num_experts": int(cfg.MODEL.BACKBONE.NUM_EXPERTS)}


def onnx_opset(path):
    """Default-domain operator set version recorded in an ONNX file (ModelProto field 8), read without onnx."""
    with open(path, "rb") as fh:
        data = fh.read()

    def varint(pos):
        value = shift = 0
        while True:
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            pos += 1
            if byte < 0x80:
                return value, pos
            shift += 7

    def fields(start, end):
        pos = start
        while pos < end:
            key, pos = varint(pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = varint(pos)
                yield number, value
            elif wire == 2:
                size, pos = varint(pos)
                yield number, (pos, pos + size)
                pos += size
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                return
    for number, value in fields(0, len(data)):
        if number == 8:
            entry = dict(fields(*value))
            domain = entry.get(1)
            if domain is None or data[domain[0]:domain[1]] in (b"", b"ai.onnx"):
                return int(entry.get(2, 0))
    return None


def export_model(cfg, output, fmt=None, batch=1, check=True, model=None, identity=None):
    """Write cfg's model with MODEL.WEIGHTS (or `model`, a network cfg describes, which the export takes over)
    to `output` (ONNX or MINDIR, from `fmt` or the suffix) and its JSON sidecar `output.json`; returns the
    sidecar dict. `batch`: the batch size of fixed-batch formats (MindSpore exports) and of the check, which
    runs the written file on `batch` random images against the eager model. `identity`: the weights and config
    the file holds (reid.deploy.extractor.exported_identity), recorded so that its features count as theirs."""
    from reid.runtime import build_eval_model
    fmt = backend_export.check_format(format_of(output, fmt))
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UserError("--batch must be a positive integer, got %r" % (batch,))
    size = tuple(int(v) for v in cfg.INPUT.SIZE_TEST)
    if model is None:
        if not cfg.MODEL.WEIGHTS:
            raise UserError("export needs trained weights: add MODEL.WEIGHTS path/to/model_final.pth")
        model = build_eval_model(cfg)
    model.eval()
    images = example_images(batch, size)
    with torch.no_grad():  # the example images onto the model's device (compat.to_device: the current one)
        eager = np.asarray(model(compat.to_device(torch.tensor(images))).detach().cpu().numpy(), np.float32)
    net = InferenceNet(model, size)
    net.eval()
    info = backend_export.export(net, images, output, fmt)
    runner = backend_export.make_runner(output, fmt) if check or fmt == "onnx" else None
    dynamic = bool(info["dynamic_batch"])
    sidecar = {
        "sidecar_version": SIDECAR_VERSION,
        "format": fmt,
        "file": os.path.basename(output),
        "model": dict(model_description(cfg), feature_size=int(eager.shape[1]), weights=cfg.MODEL.WEIGHTS),
        "input": {"name": getattr(runner, "input_name", None), "shape": [None if dynamic else batch, 3] + list(size),
                  "dtype": "float32", "layout": "NCHW, RGB", "range": [0, 255]},
        "normalisation": {"pixel_mean": [float(v) for v in cfg.MODEL.PIXEL_MEAN],
                          "pixel_std": [float(v) for v in cfg.MODEL.PIXEL_STD], "inside_model": True},
        "output": {"shape": [None if dynamic else batch, int(eager.shape[1])],
                   "content": "BNNeck feature (running statistics), compared by TEST.METRIC",
                   "metric": cfg.TEST.METRIC},
        "test_flip": bool(cfg.TEST.FLIP),    # test.py's TEST.FLIP: average each image's feature with its mirror's
        "dynamic_batch": dynamic,
        "batch": None if dynamic else batch,
        "opset": onnx_opset(output) if fmt == "onnx" else None,
        "exported_by": {"backend": compat.BACKEND, "framework": str(compat.info()["framework"]),
                        "framework_version": backend_export.framework_version()},
    }
    if identity is not None:
        sidecar["identity"] = identity     # the same model as its weights, whatever the engine
    if check:
        got = runner.run(images)
        sidecar["check"] = {"images": batch, "max_abs_diff_vs_eager": float(np.abs(got - eager).max()),
                            "max_abs_feature": float(np.abs(eager).max())}
    path = sidecar_path(output)
    with open(path + ".tmp", "w") as fh:
        json.dump(sidecar, fh, indent=2)
    os.replace(path + ".tmp", path)
    return sidecar


def read_sidecar(path):
    side = sidecar_path(path)
    if not os.path.exists(path):
        raise UserError("model file %s does not exist; write it with tools/export.py" % path)
    if not os.path.exists(side):
        raise UserError("%s has no sidecar %s (input size, normalisation, batch); export with tools/export.py, "
                        "which writes both" % (path, side))
    try:
        with open(side) as fh:
            sidecar = json.load(fh)
        fmt, size = sidecar["format"], sidecar["input"]["shape"][2:]
    except (ValueError, KeyError, TypeError, IndexError):
        raise UserError("%s is not a sidecar written by tools/export.py; export the model again" % side) from None
    if fmt not in FORMATS or len(size) != 2:
        raise UserError("%s is not a sidecar written by tools/export.py; export the model again" % side)
    return sidecar


def check_against_cfg(sidecar, cfg, path):
    """The config must describe the exported model and feed it the images it was exported for."""
    size = [int(v) for v in cfg.INPUT.SIZE_TEST]
    if list(sidecar["input"]["shape"][2:]) != size:
        raise UserError("%s takes %s images but the config's INPUT.SIZE_TEST is %s; use the config the model was "
                        "exported with" % (path, "x".join(map(str, sidecar["input"]["shape"][2:])),
                                           "x".join(map(str, size))))
    exported = {k: sidecar["model"].get(k) for k in model_description(cfg)}
    exported["depth"] = exported["depth"] or "50x"   # sidecars written before MODEL.BACKBONE.DEPTH existed
    if exported != model_description(cfg):
        diff = ", ".join("%s %s (config: %s)" % (k, exported[k], v) for k, v in model_description(cfg).items()
                         if exported[k] != v)
        raise UserError("%s was exported from another model: %s; use the config the model was exported with"
                        % (path, diff))
    norm = sidecar["normalisation"]
    same_norm = np.allclose(norm["pixel_mean"], cfg.MODEL.PIXEL_MEAN) and np.allclose(norm["pixel_std"],
                                                                                 cfg.MODEL.PIXEL_STD)
    if not same_norm:
        raise UserError("%s normalises with PIXEL_MEAN %s / PIXEL_STD %s, the config with %s / %s; use the config the "
                        "model was exported with" % (path, norm["pixel_mean"], norm["pixel_std"],
                                                     list(cfg.MODEL.PIXEL_MEAN), list(cfg.MODEL.PIXEL_STD)))


class ExportedModel:
    """An exported file behind the interface evaluation uses for a model in eval mode: images (N,3,H,W) 0..255
    tensor -> (N, D) tensor. Fixed-batch files get the images in chunks of their batch size, the last chunk
    padded with zeros (every image is computed independently in eval mode)."""

    training = False

    def __init__(self, path, fmt=None, runner=None):
        self.path = path
        self.format = backend_export.check_format(format_of(path, fmt), action="run")
        self.sidecar = read_sidecar(path)
        if self.sidecar["format"] != self.format:
            raise UserError("%s: the sidecar says %s, the file suffix %s; export the model again"
                            % (path, self.sidecar["format"], self.format))
        self.runner = runner or backend_export.make_runner(path, self.format)
        self.batch = None if self.sidecar.get("dynamic_batch") else int(self.sidecar["batch"])

    def eval(self):
        return self

    def train(self, mode=True):
        if mode:
            raise UserError("an exported model (%s) can only be evaluated, not trained" % self.path)
        return self

    def run(self, images):
        """numpy (N, 3, H, W) -> numpy (N, D)."""
        images = np.asarray(images, np.float32)
        if self.batch is None:
            return self.runner.run(images)
        out = []
        for start in range(0, len(images), self.batch):
            chunk = images[start:start + self.batch]
            n = len(chunk)
            if n < self.batch:
                chunk = np.concatenate([chunk, np.zeros((self.batch - n,) + chunk.shape[1:], np.float32)])
            out.append(self.runner.run(chunk)[:n])
        return np.concatenate(out)

    def __call__(self, images):
        if torch.is_tensor(images):
            images = images.detach().cpu().numpy()
        return compat.to_device(torch.tensor(self.run(images)))  # on the current device, as a model's output


def load_engine(cfg, engine="eager", model_path=None):
    """The model test.py evaluates: the eager network with MODEL.WEIGHTS, or an exported file."""
    from reid.runtime import build_eval_model
    if engine == "eager":
        if model_path:
            raise UserError("--model %s is an exported file: add --engine %s (eager evaluates MODEL.WEIGHTS)"
                            % (model_path, format_of(model_path)))
        return build_eval_model(cfg)
    if not model_path:
        raise UserError("--engine %s needs the exported file: add --model path/to/model%s"
                        % (engine, SUFFIX.get(engine, "")))
    model = ExportedModel(model_path, engine)
    check_against_cfg(model.sidecar, cfg, model_path)
    return model
