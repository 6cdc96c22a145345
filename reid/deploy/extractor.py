"""Features of person crops from a trained model: the Python API that tools/index.py and tools/search.py use.

    from reid.deploy import FeatureExtractor
    extractor = FeatureExtractor(config="output/synthetic/acl/config.yaml",
                                 weights="output/synthetic/acl/model_final.pth")   # or model="acl.onnx"
    features = extractor(["a.jpg", "b.jpg"])     # (2, D) float32, L2-normalised
    features = extractor("crops/")               # every image under the folder (recursive, sorted)
    features = extractor(rgb)                    # an HxWx3 RGB uint8 array, a list of them, or (N, H, W, 3)

What runs is what test.py runs: images are read by reid.data.common (grayscale, RGBA and 16-bit files come
back as 8-bit RGB), resized by the test transform of reid.data.transforms (INPUT.SIZE_TEST), and passed in
batches through reid.evaluation.extract_features (TEST.FLIP averages each image's feature with its mirror's)
on the engine picked:

  eager     the network with MODEL.WEIGHTS, op by op
  compiled  the same network compiled (MindSpore graph mode, test.py's TEST.JIT path, kept in the compile cache)
  onnx      an exported .onnx file in onnxruntime (either backend); given weights, the network is exported
            once into the user cache (CACHE_DIR, else $REID_CACHE, else ~/.cache/acl-reid: reid.runtime's
            user_cache_dir; tools/export.py's code) and that file runs (MindSpore: two fixed-batch files, of the
            batch size and of batch 1)
  mindir    an exported .mindir file as a MindSpore GraphCell (MindSpore backend), likewise
  auto      the fastest of these for what was given (`default_engine`, measured by bench/infer.py)

An exported file needs no config: its sidecar gives the input size (TEST.FLIP then comes from the sidecar, or
False for files exported before it was recorded); given a config too, the two are checked against each other.

One-time work (an export from weights, a compiled graph's build) happens before the first images are read and
is announced by one line on stderr (what, why, roughly how long, where it is kept; `notices=False` leaves it
out), so that a progress bar that follows times the images alone.
"""
import hashlib
import json
import os
import sys

import numpy as np

from reid.errors import UserError

ENGINES = ("auto", "eager", "compiled", "onnx", "mindir")
DEFAULT_BATCH = 32
IDENTITY_VERSION = 1
# MODEL keys that change nothing in the eval features of given weights: runtime settings, training-only parts
_NOT_IN_FEATURES = ("WEIGHTS", "DEVICE", "JIT", "JIT_SHARED_GRAPH", "JIT_HELPER_THREAD", "NUM_THREADS",
                    "COMPILE_CACHE", "NUM_SPLITS", "CHUNK_FORWARDS", "LOSSES")
# Rough seconds of the one-time work per file or graph, for the line announcing it: the full-size network on a
# 2-core CPU, export with its check against the eager model (docs/retrieval.md#engines has measured times)
ROUGH_SECONDS = {("export", "mindspore"): 40, ("export", "torch"): 10, ("compile", "mindspore"): 60}


def default_engine(given, backend, onnxruntime=None):
    """The engine `auto` picks. An exported file runs in its own format. Given weights: ONNX Runtime on files
    exported from them once (the fastest engine at both sizes and batch sizes on both backends:
    docs/retrieval.md#engines; the export costs about what building the compiled graph costs, and is kept)
    where onnxruntime is installed, else the compiled graph on MindSpore and op by op on torch."""
    if given in ("onnx", "mindir"):
        return given
    if onnxruntime is None:
        import importlib.util
        onnxruntime = importlib.util.find_spec("onnxruntime") is not None
    if onnxruntime:
        return "onnx"
    return "compiled" if backend == "mindspore" else "eager"


def list_image_files(folder):
    """(image paths, other files) under `folder`, recursive, relative to it, sorted; hidden files and folders
    are left out. Images are files with an image suffix (reid.data.common.IMAGE_EXTENSIONS)."""
    from reid.data.common import IMAGE_EXTENSIONS
    if not os.path.isdir(folder):
        raise UserError("%s is not a folder; give the folder that holds the images" % folder)
    images, others = [], []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            rel = os.path.relpath(os.path.join(top, name), folder)
            (images if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS else others).append(rel)
    return sorted(images), sorted(others)


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _text_sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def feature_config(cfg):
    """The config keys that decide the features of given weights (the model's structure and pixel statistics,
    INPUT.SIZE_TEST, TEST.FLIP), as text: what an index's config hash is taken over."""
    model = cfg.MODEL.clone()
    model.defrost()
    for key in _NOT_IN_FEATURES:
        model.pop(key, None)
    model.HEADS.pop("NUM_CLASSES", None)     # classifiers are training-only
    for key in ("PRETRAIN", "PRETRAIN_PATH", "ADAPTOR_STEP_RATIO", "ZERO_INIT_RESIDUAL", "ZERO_INIT_CODE"):
        model.BACKBONE.pop(key, None)         # initialisation and training only: the weights replace them
    return "%sINPUT.SIZE_TEST: %s\nTEST.FLIP: %s\n" % (model.dump(), list(cfg.INPUT.SIZE_TEST), bool(cfg.TEST.FLIP))


def exported_identity(cfg, weights_sha256=None):
    """What an export's sidecar records of the model it holds, so that its features count as the weights' own
    on every engine: the weights' hash (given, or taken) and the feature config's hash with and without
    TEST.FLIP (which the extractor may switch)."""
    return {"weights_sha256": weights_sha256 or file_sha256(cfg.MODEL.WEIGHTS),
            "config_sha256": {name: _text_sha256(feature_config(_override(cfg, ["TEST.FLIP", flip])))
                              for name, flip in (("flip", True), ("no flip", False))}}


def _sidecar_config(sidecar, flip):
    keys = {k: sidecar[k] for k in ("model", "input", "normalisation") if k in sidecar}
    keys["model"] = {k: v for k, v in keys.get("model", {}).items() if k != "weights"}
    keys["flip"] = bool(flip)
    return json.dumps(keys, sort_keys=True)


def _override(cfg, opts):
    """A frozen copy of `cfg` with opts ([KEY, VALUE, ...]) merged in."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(list(opts))
    cfg.freeze()
    return cfg


def _image_size_cfg(size):
    """The default config with INPUT.SIZE_TEST = size: what the test transform needs for an exported file."""
    from reid.config import get_cfg
    cfg = get_cfg()
    cfg.INPUT.SIZE_TEST = [int(v) for v in size]
    cfg.freeze()
    return cfg


def _check_arguments(engine, batch_size, weights, model):
    if engine not in ENGINES:
        raise UserError("unknown engine %r; use one of: %s" % (engine, ", ".join(ENGINES)))
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise UserError("the batch size must be a positive integer, got %r" % (batch_size,))
    if weights and model:
        raise UserError("give the weights (with their config) or an exported model file, not both")


def resolve_config(config, weights, model, opts):
    """Step 1 of building a FeatureExtractor: (cfg, source). cfg: the config (a file, a loaded config, or
    none for an exported file alone) with `opts` and the weights merged in; None where no config is given.
    source: how to build the extractor again (config file, opts with the weights' absolute path, model file;
    tools/search.py without model arguments uses an index's record). A model needs weights or a file."""
    from reid.config import load_cfg
    from reid.config.config import find_config_file
    opts = list(opts or [])
    if weights:
        opts += ["MODEL.WEIGHTS", str(weights)]
    cfg = None
    if config is not None:
        cfg = load_cfg(config, opts) if isinstance(config, (str, os.PathLike)) else config
        if opts and not isinstance(config, (str, os.PathLike)):
            cfg = _override(cfg, opts)
    elif opts and not model:
        cfg = load_cfg(None, opts)
    source_opts = [str(v) for v in opts]
    for i in range(0, len(source_opts) - 1, 2):
        if source_opts[i] == "MODEL.WEIGHTS" and source_opts[i + 1]:
            source_opts[i + 1] = os.path.abspath(source_opts[i + 1])
    source = {"config_file": os.path.abspath(find_config_file(str(config)))
              if isinstance(config, (str, os.PathLike)) else None,
              "opts": source_opts, "model": os.path.abspath(str(model)) if model else None}
    if not model and (cfg is None or not cfg.MODEL.WEIGHTS):
        raise UserError("a feature extractor needs a model: a config file and its weights (MODEL.WEIGHTS "
                        "path/to/model_final.pth), or an exported file (--model path/to/model.onnx)")
    return cfg, source


def resolve_engine(engine, model, backend):
    """Step 2: the engine that runs what was given (an exported file `model`, else weights): `engine`, or for
    auto the fastest for it (`default_engine`); an engine that cannot run it here is a UserError."""
    if model:
        from reid.deploy.export import format_of
        fmt = format_of(str(model))
        if engine not in ("auto", fmt):
            raise UserError("%s is an exported %s file: it runs with engine %s (or auto), not %s" % (
                model, fmt, fmt, engine))
        from compat.export import check_format
        check_format(fmt, action="run")
        return default_engine(fmt, backend)
    chosen = default_engine("weights", backend) if engine == "auto" else engine
    if chosen == "compiled" and backend != "mindspore":
        raise UserError("engine compiled is MindSpore's graph mode; on the torch backend use engine eager (or "
                        "--backend mindspore)")
    if chosen in ("onnx", "mindir"):
        from compat.export import check_format
        check_format(chosen)
    return chosen


def resolve_model(model, cfg, flip):
    """Step 3: the model and its identity, (cfg, sidecar, flip, identity). Weights: the file checked and hashed
    once; the config's feature keys hashed. An exported file: its sidecar (checked against the config, if
    one is given; else the config is the default one at the file's input size), and the identity of the
    weights it was exported from where the sidecar records them (the same model as those weights on any
    engine), else of the file itself. `flip` None takes TEST.FLIP (a file without config: the sidecar's)."""
    if not model:
        from reid.engine.checkpointer import check_weights_file
        weights = cfg.MODEL.WEIGHTS
        check_weights_file(weights)
        flip = bool(cfg.TEST.FLIP) if flip is None else bool(flip)
        flip_cfg = cfg if bool(cfg.TEST.FLIP) == flip else _override(cfg, ["TEST.FLIP", flip])
        identity = {"kind": "weights", "weights": os.path.abspath(weights), "weights_sha256": file_sha256(weights),
                    "config_sha256": _text_sha256(feature_config(flip_cfg))}
        return cfg, None, flip, identity
    from reid.deploy.export import check_against_cfg, read_sidecar
    path = str(model)
    sidecar = read_sidecar(path)
    if cfg is not None:
        check_against_cfg(sidecar, cfg, path)
        recorded = cfg.TEST.FLIP
    else:
        cfg = _image_size_cfg(sidecar["input"]["shape"][2:])
        recorded = sidecar.get("test_flip", False)
    flip = bool(recorded) if flip is None else bool(flip)
    exported_from = sidecar.get("identity")
    if exported_from:
        identity = {"kind": "weights", "weights": sidecar["model"].get("weights"),
                    "weights_sha256": exported_from["weights_sha256"],
                    "config_sha256": exported_from["config_sha256"]["flip" if flip else "no flip"]}
    else:               # exported before the sidecar recorded them: the file itself
        identity = {"kind": "exported", "model": os.path.abspath(path), "model_sha256": file_sha256(path),
                    "config_sha256": _text_sha256(_sidecar_config(sidecar, flip))}
    return cfg, sidecar, flip, identity


def with_compile_cache(cfg):
    """cfg with MODEL.COMPILE_CACHE in the user cache where it names none (compiled graphs of an extractor go
    there, not into OUTPUT_DIR)."""
    from reid.runtime import user_cache_dir
    if str(cfg.MODEL.COMPILE_CACHE).strip():
        return cfg
    return _override(cfg, ["MODEL.COMPILE_CACHE", os.path.join(user_cache_dir(cfg), "compile_cache")])


class FixedBatchFiles:
    """Two exported files of one network behind ExportedModel's interface: one of a fixed batch B for the full
    batches of B images, one of batch 1 for the rest, image by image (no padding either way)."""

    training = False

    def __init__(self, big, single):
        self.big, self.single = big, single
        self.path, self.sidecar = big.path, big.sidecar

    def eval(self):
        return self

    def train(self, mode=True):
        self.big.train(mode)
        return self

    def run(self, images):
        images = np.asarray(images, np.float32)
        full = len(images) - len(images) % self.big.batch
        parts = [self.big.run(images[:full])] if full else []
        if full < len(images):
            parts.append(self.single.run(images[full:]))
        return np.concatenate(parts)

    def __call__(self, images):
        import compat
        from compat import torch
        if torch.is_tensor(images):
            images = images.detach().cpu().numpy()
        return compat.to_device(torch.tensor(self.run(images)))  # on the current device, as a model's output


class FeatureExtractor:
    """Features of images from `config` (a config file or a loaded config) + `weights`, or from an exported
    `model` file (.onnx / .mindir with its sidecar, `config` optional). `opts`: config overrides [KEY, VALUE, ...].
    `engine`: one of ENGINES. `batch_size`: images per forward (a fixed-batch exported file takes its own).
    `normalize`: L2-normalise the features (the cosine metric of test.py compares them so). `flip`: None takes
    TEST.FLIP. `progress`: a tqdm bar while extracting files. `notices`: one line on stderr before one-time work
    (exporting the weights, building a compiled graph)."""

    def __init__(self, config=None, weights=None, model=None, opts=(), engine="auto", batch_size=DEFAULT_BATCH,
                 normalize=True, flip=None, progress=False, notices=True):
        import compat
        from reid.data.transforms import build_transforms
        from reid.deploy.export import ExportedModel
        from reid.runtime import configure_runtime

        _check_arguments(engine, batch_size, weights, model)
        self.backend = compat.BACKEND
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.progress, self.notices = bool(progress), bool(notices)
        self._graph_batch = 0     # the batch size of the compiled graph built so far (engine compiled)
        # the steps, in this order, each one's code in the function of its name above this class:
        # 1. the config (and how to build this extractor again)
        cfg, self.source = resolve_config(config, weights, model, opts)
        # 2. the engine for what was given (an exported file or weights)
        self.engine = resolve_engine(engine, model, self.backend)
        # 3. the model and its identity (what index files record)
        self.model_path = os.path.abspath(str(model)) if model else None
        self.cfg, self.sidecar, self.flip, self.identity = resolve_model(model, cfg, flip)
        # 4. the runner: an exported file's now; the weights' on first use (`net`: the network, or its
        # exported files), so that describe() and the checks on it cost no model build
        self._net = ExportedModel(str(model), self.engine) if model else None

        self.cfg = with_compile_cache(self.cfg)
        configure_runtime(self.cfg)
        self.transform = build_transforms(self.cfg, is_train=False)
        self.image_size = tuple(int(v) for v in self.cfg.INPUT.SIZE_TEST)
        if self.sidecar is not None:
            self.feature_size = int(self.sidecar["model"]["feature_size"])
        else:                      # the config's, known before the network is built (and checked by extraction)
            from reid.modeling.build import feature_size
            self.feature_size = feature_size(self.cfg)

    # ---------------------------------------------------------------------- step 4 for weights: the runner
    @property
    def net(self):
        """The model the engine runs (weights: built, or exported and loaded, on first use)."""
        if self._net is None:
            self._net = self._build_from_weights(self.cfg)
        return self._net

    def _build_from_weights(self, cfg):
        from reid.deploy.export import ExportedModel
        from reid.runtime import build_eval_model
        if self.engine not in ("onnx", "mindir"):
            return build_eval_model(cfg)      # checks that the weights fit the config
        # torch writes one dynamic-batch file; MindSpore fixed-batch ones: one of the batch size for full batches
        # and one of batch 1 for the rest, so that neither a gallery nor a single query is padded
        batches = [None] if self.backend != "mindspore" else sorted({self.batch_size, 1}, reverse=True)
        paths = [self._export_path(cfg, batch) for batch in batches]
        missing = [(path, batch) for path, batch in zip(paths, batches)
                   if not (os.path.exists(path) and os.path.exists(path + ".json"))]   # the sidecar is written last
        if missing:
            self._notice("first use of %s with engine %s: exporting the network to %s once (%d file%s, the engine "
                         "runs them), roughly %d s on a 2-core CPU; kept in %s for later runs" % (
                             os.path.basename(cfg.MODEL.WEIGHTS), self.engine, self.engine.upper(), len(missing),
                             "" if len(missing) == 1 else "s",
                             ROUGH_SECONDS[("export", self.backend)] * len(missing), os.path.dirname(paths[0])))
        for path, batch in missing:
            self._export(cfg, path, batch, build_eval_model(cfg))    # checks that the weights fit the config
        files = [ExportedModel(path, self.engine) for path in paths]
        net = files[0] if len(files) == 1 else FixedBatchFiles(*files)
        self.model_path, self.sidecar = files[0].path, files[0].sidecar
        self.feature_size = int(self.sidecar["model"]["feature_size"])
        return net

    def _export_path(self, cfg, batch):
        """Where the file of `batch` (None: the framework's dynamic one) is kept: the user cache's deploy/, under
        a name that hashes the weights, the feature config, the framework and the format, so that a later
        extractor of the same model loads it."""
        from compat.export import framework_version
        from reid.deploy.export import SUFFIX
        from reid.runtime import user_cache_dir
        key = _text_sha256(json.dumps([self.identity["weights_sha256"], self.identity["config_sha256"],
                                       self.backend, framework_version(), self.engine]))[:16]
        name = "model-%s%s%s" % (key, "" if batch is None else "-b%d" % batch, SUFFIX[self.engine])
        return os.path.join(user_cache_dir(cfg), "deploy", name)

    def _export(self, cfg, path, batch, model):
        """`model` (cfg's, with its weights; the export takes it over) exported to `path`."""
        from reid.deploy.export import export_model
        try:
            export_model(cfg, path, self.engine, batch=batch or 1, model=model,
                         identity=exported_identity(cfg, self.identity["weights_sha256"]))
        except OSError as exc:
            raise UserError("cannot write the %s file of engine %s to %s (%s); set CACHE_DIR (or the REID_CACHE "
                            "environment variable) to a writable folder, or pick another engine" % (
                                self.engine, self.engine, os.path.dirname(path), exc.strerror or exc)) from None

    def _notice(self, text):
        if self.notices:
            print(text, file=sys.stderr, flush=True)

    def describe(self):
        """What made the features, for an index file: identity (hashes), engine, feature size, sidecar."""
        return dict(self.identity, identity_version=IDENTITY_VERSION, engine=self.engine, backend=self.backend,
                    feature_size=self.feature_size, image_size=list(self.image_size), flip=self.flip,
                    normalized=self.normalize, sidecar=self.sidecar, exported_file=self.model_path,
                    source=self.source)

    # ------------------------------------------------------------------------------------------ extracting
    def __call__(self, inputs):
        """(N, D) float32 features of `inputs`: an image path, a folder (its images, recursive and sorted), an
        HxWx3 RGB uint8 array, an (N, H, W, 3) array, or a list of paths and arrays. A bad image is an error."""
        items = self._items(inputs)
        if not items:
            raise UserError("no images given to extract features from (an empty list or a folder without images)")
        features, _, _ = self._run(items, on_bad="stop")
        return features

    def extract_files(self, paths, on_bad="stop", progress=None):
        """(features (M, D), kept (indices into `paths` that were read), problems [(path, reason)]). `on_bad`:
        "stop" raises on the first image that cannot be read (missing, empty, truncated, not an image), "skip"
        leaves it out and lists it in `problems`."""
        from reid.data.common import ON_BAD_CHOICES
        if on_bad not in ON_BAD_CHOICES:
            raise UserError("on_bad must be one of %s, got %r" % ("/".join(ON_BAD_CHOICES), on_bad))
        return self._run([str(p) for p in paths], on_bad, progress)

    def _items(self, inputs):
        if isinstance(inputs, (str, os.PathLike)):
            path = str(inputs)
            if os.path.isdir(path):
                return [os.path.join(path, rel) for rel in list_image_files(path)[0]]
            return [path]
        if isinstance(inputs, np.ndarray):
            if inputs.ndim == 4:
                return list(inputs)
            return [inputs]
        if isinstance(inputs, (list, tuple)):
            out = []
            for item in inputs:
                if not isinstance(item, (str, os.PathLike, np.ndarray)):
                    raise UserError("cannot extract features from a %s; give image paths or HxWx3 RGB uint8 arrays"
                                    % type(item).__name__)
                out.append(str(item) if isinstance(item, os.PathLike) else item)
            return out
        raise UserError("cannot extract features from a %s; give an image path, a folder, an HxWx3 RGB uint8 array "
                        "or a list of them" % type(inputs).__name__)

    def _images(self, items, on_bad, kept, problems, bar):
        """Batches {"images": (n, 3, H, W) float32} of the readable items, test transform applied."""
        from reid.data.common import image_or_problem
        chunk = []
        for index, item in enumerate(items):
            if isinstance(item, np.ndarray):
                image = item
            else:
                image, reason = image_or_problem(item)
                if image is None:
                    if on_bad == "stop":
                        raise UserError("cannot read image %s: %s; fix or remove it" % (item, reason))
                    problems.append((item, reason))
                    if bar is not None:
                        bar.update(1)
                    continue
            chunk.append(self.transform(image))
            kept.append(index)
            if len(chunk) == self.batch_size:
                yield {"images": np.stack(chunk)}
                if bar is not None:
                    bar.update(len(chunk))
                chunk = []
        if chunk:
            yield {"images": np.stack(chunk)}
            if bar is not None:
                bar.update(len(chunk))

    def _prepare(self, count):
        """The one-time work before the first of `count` images: the export (weights, engine onnx / mindir: on
        first use of `net`) or the compiled graph's build for this batch size (on a batch of zeros), each
        announced first (module docstring)."""
        from reid.evaluation.extract import extract_features
        net = self.net
        batch = min(self.batch_size, count)
        if self.engine == "compiled" and batch > self._graph_batch:
            from reid.runtime import compile_cache_dir
            folder = compile_cache_dir(self.cfg)
            self._notice("engine compiled: building the network's graph for batches of %d (MindSpore graph mode, "
                         "faster extraction), roughly %d s on a 2-core CPU %s" % (
                             batch, ROUGH_SECONDS[("compile", "mindspore")],
                             "the first time; kept in %s for later runs" % folder if folder else
                             "(MODEL.COMPILE_CACHE off: built again by every run)"))
            extract_features(net, [{"images": np.zeros((batch, 3) + self.image_size, np.float32)}], False,
                             compiled=True)
            self._graph_batch = batch
        return net

    def _run(self, items, on_bad, progress=None):
        from reid.evaluation.distance import normalize
        from reid.evaluation.extract import extract_features
        kept, problems = [], []
        show = self.progress if progress is None else progress
        net = self._prepare(len(items)) if items else None
        bar = None
        if show:
            from tqdm import tqdm
            bar = tqdm(total=len(items), desc="extracting features", unit="img")
        try:
            batches = self._images(items, on_bad, kept, problems, bar)
            first = next(batches, None)
            if first is None:
                return np.zeros((0, self.feature_size or 0), np.float32), kept, problems

            def all_batches():
                yield first
                yield from batches
            features = extract_features(net, all_batches(), self.flip, compiled=self.engine == "compiled")[0]
        finally:
            if bar is not None:
                bar.close()
        features = np.ascontiguousarray(features, np.float32)
        self.feature_size = int(features.shape[1])
        if self.normalize:
            features = normalize(features)
        return features, kept, problems
