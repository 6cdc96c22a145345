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
            once into OUTPUT_DIR/deploy_cache (tools/export.py's code) and that file runs (MindSpore: two
            fixed-batch files, of the batch size and of batch 1)
  mindir    an exported .mindir file as a MindSpore GraphCell (MindSpore backend), likewise
  auto      the fastest of these for what was given (`default_engine`, measured by bench/infer.py)

An exported file needs no config: its sidecar gives the input size (TEST.FLIP then comes from the sidecar, or
False for files exported before it was recorded); given a config too, the two are checked against each other.
"""
import hashlib
import json
import os

import numpy as np

from compat.errors import UserError

ENGINES = ("auto", "eager", "compiled", "onnx", "mindir")
DEFAULT_BATCH = 32
IDENTITY_VERSION = 1
# MODEL keys that change nothing in the eval features of given weights: runtime settings, training-only parts
_NOT_IN_FEATURES = ("WEIGHTS", "DEVICE", "JIT", "JIT_SHARED_GRAPH", "JIT_HELPER_THREAD", "NUM_THREADS",
                    "COMPILE_CACHE", "NUM_SPLITS", "CHUNK_FORWARDS", "LOSSES")


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


def _sidecar_config(sidecar, flip):
    keys = {k: sidecar[k] for k in ("model", "input", "normalisation") if k in sidecar}
    keys["model"] = {k: v for k, v in keys.get("model", {}).items() if k != "weights"}
    keys["flip"] = bool(flip)
    return json.dumps(keys, sort_keys=True)


def _image_size_cfg(size):
    """The default config with INPUT.SIZE_TEST = size: what the test transform needs for an exported file."""
    from reid.config import get_cfg
    cfg = get_cfg()
    cfg.INPUT.SIZE_TEST = [int(v) for v in size]
    cfg.freeze()
    return cfg


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
        return compat.as_tensor(self.run(compat.to_numpy(images)))


class FeatureExtractor:
    """Features of images from `config` (a config file or a loaded config) + `weights`, or from an exported
    `model` file (.onnx / .mindir with its sidecar, `config` optional). `opts`: config overrides [KEY, VALUE, ...].
    `engine`: one of ENGINES. `batch_size`: images per forward (a fixed-batch exported file takes its own).
    `normalize`: L2-normalise the features (the cosine metric of test.py compares them so). `flip`: None takes
    TEST.FLIP. `progress`: a tqdm bar while extracting files."""

    def __init__(self, config=None, weights=None, model=None, opts=(), engine="auto", batch_size=DEFAULT_BATCH,
                 normalize=True, flip=None, progress=False):
        import compat
        from reid.config import load_cfg
        from reid.data.transforms import build_transforms
        from reid.runtime import configure_runtime

        if engine not in ENGINES:
            raise UserError("unknown engine %r; use one of: %s" % (engine, ", ".join(ENGINES)))
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise UserError("the batch size must be a positive integer, got %r" % (batch_size,))
        if weights and model:
            raise UserError("give the weights (with their config) or an exported model file, not both")
        opts = list(opts or [])
        if weights:
            opts += ["MODEL.WEIGHTS", str(weights)]
        cfg = None
        if config is not None:
            cfg = load_cfg(config, opts) if isinstance(config, (str, os.PathLike)) else config
            if opts and not isinstance(config, (str, os.PathLike)):
                cfg = cfg.clone()
                cfg.defrost()
                cfg.merge_from_list(opts)
                cfg.freeze()
        elif opts and not model:
            cfg = load_cfg(None, opts)
        self.backend = compat.BACKEND
        # how to build this extractor again (tools/search.py without model arguments uses an index's record)
        source_opts = [str(v) for v in opts]
        for i in range(0, len(source_opts) - 1, 2):
            if source_opts[i] == "MODEL.WEIGHTS" and source_opts[i + 1]:
                source_opts[i + 1] = os.path.abspath(source_opts[i + 1])
        self.source = {"config_file": os.path.abspath(str(config)) if isinstance(config, (str, os.PathLike)) else None,
                       "opts": source_opts, "model": os.path.abspath(str(model)) if model else None}
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.progress = bool(progress)
        if model:
            self._from_file(str(model), cfg, engine, flip)
        else:
            if cfg is None or not cfg.MODEL.WEIGHTS:
                raise UserError("a feature extractor needs a model: a config file and its weights (MODEL.WEIGHTS "
                                "path/to/model_final.pth), or an exported file (--model path/to/model.onnx)")
            self._from_weights(cfg, engine, flip)
        configure_runtime(self.cfg)
        self.transform = build_transforms(self.cfg, is_train=False)
        self.image_size = tuple(int(v) for v in self.cfg.INPUT.SIZE_TEST)
        self.feature_size = None   # known after the first extraction (or from the sidecar)
        if self.sidecar is not None:
            self.feature_size = int(self.sidecar["model"]["feature_size"])

    # ------------------------------------------------------------------------------------------- building
    def _from_weights(self, cfg, engine, flip):
        self.engine = default_engine("weights", self.backend) if engine == "auto" else engine
        if self.engine == "compiled" and self.backend != "mindspore":
            raise UserError("engine compiled is MindSpore's graph mode; on the torch backend use engine eager (or "
                            "--backend mindspore)")
        if self.engine in ("onnx", "mindir"):
            from compat.export import check_format
            check_format(self.engine)
        from reid.engine.checkpointer import check_weights_file
        weights = cfg.MODEL.WEIGHTS
        check_weights_file(weights)    # before the identity's hash: the model itself is built on first use
        self.cfg, self.sidecar, self.model_path = cfg, None, None
        self.flip = bool(cfg.TEST.FLIP) if flip is None else bool(flip)
        self.identity = {"kind": "weights", "weights": os.path.abspath(weights), "weights_sha256": file_sha256(weights),
                         "config_sha256": _text_sha256(feature_config(self._flip_cfg(cfg)))}
        self._net = None    # built on first use (`net`): describe() and the checks on it cost no model build

    @property
    def net(self):
        """The model the engine runs (weights: built, or exported and loaded, on first use)."""
        if self._net is None:
            self._net = self._build_from_weights(self.cfg)
        return self._net

    def _build_from_weights(self, cfg):
        from reid.runtime import build_eval_model
        net = build_eval_model(cfg)      # checks that the weights fit the config
        if self.engine in ("onnx", "mindir"):
            from reid.deploy.export import ExportedModel
            # torch writes one dynamic-batch file; MindSpore fixed-batch ones: one of the batch size for full
            # batches and one of batch 1 for the rest, so that neither a gallery nor a single query is padded
            batches = [None] if self.backend != "mindspore" else sorted({self.batch_size, 1}, reverse=True)
            files = [ExportedModel(self._exported(cfg, self.engine, batch, net if i == 0 else build_eval_model(cfg)),
                                   self.engine) for i, batch in enumerate(batches)]
            net = files[0] if len(files) == 1 else FixedBatchFiles(*files)
            self.model_path, self.sidecar = files[0].path, files[0].sidecar
            self.feature_size = int(self.sidecar["model"]["feature_size"])
        return net

    def _exported(self, cfg, fmt, batch, model):
        """`model` (cfg's, with its weights; the export takes it over) exported to `fmt` (fixed `batch`, or
        None: the framework's dynamic one) once, and kept in OUTPUT_DIR/deploy_cache under a name that hashes
        the weights, the feature config, the framework and the batch, so that a later extractor of the same
        model loads the file."""
        from compat.export import framework_version
        from reid.deploy.export import SUFFIX, export_model
        key = _text_sha256(json.dumps([self.identity["weights_sha256"], self.identity["config_sha256"],
                                       self.backend, framework_version(), fmt]))[:16]
        name = "model-%s%s%s" % (key, "" if batch is None else "-b%d" % batch, SUFFIX[fmt])
        path = os.path.join(cfg.OUTPUT_DIR, "deploy_cache", name)
        if not (os.path.exists(path) and os.path.exists(path + ".json")):   # the sidecar is written last
            try:
                export_model(cfg, path, fmt, batch=batch or 1, model=model)
            except OSError as exc:
                raise UserError("cannot write the %s file of engine %s to %s (%s); set OUTPUT_DIR to a writable "
                                "folder or pick another engine" % (fmt, fmt, os.path.dirname(path),
                                                                   exc.strerror or exc)) from None
        return path

    def _flip_cfg(self, cfg):
        if bool(cfg.TEST.FLIP) == self.flip:
            return cfg
        cfg = cfg.clone()
        cfg.defrost()
        cfg.TEST.FLIP = self.flip
        cfg.freeze()
        return cfg

    def _from_file(self, path, cfg, engine, flip):
        from reid.deploy.export import ExportedModel, check_against_cfg, format_of
        fmt = format_of(path)
        if engine not in ("auto", fmt):
            raise UserError("%s is an exported %s file: it runs with engine %s (or auto), not %s" % (
                path, fmt, fmt, engine))
        self.engine = default_engine(fmt, self.backend)
        self._net = ExportedModel(path, fmt)
        self.sidecar, self.model_path = self._net.sidecar, os.path.abspath(path)
        if cfg is not None:
            check_against_cfg(self.sidecar, cfg, path)
            self.cfg = cfg
            recorded = cfg.TEST.FLIP
        else:
            self.cfg = _image_size_cfg(self.sidecar["input"]["shape"][2:])
            recorded = self.sidecar.get("test_flip", False)
        self.flip = bool(recorded) if flip is None else bool(flip)
        self.identity = {"kind": "exported", "model": self.model_path, "model_sha256": file_sha256(path),
                         "config_sha256": _text_sha256(_sidecar_config(self.sidecar, self.flip))}

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

    def _run(self, items, on_bad, progress=None):
        from reid.evaluation.distance import normalize
        from reid.evaluation.extract import extract_features
        kept, problems = [], []
        show = self.progress if progress is None else progress
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
            features = extract_features(self.net, all_batches(), self.flip, compiled=self.engine == "compiled")[0]
        finally:
            if bar is not None:
                bar.close()
        features = np.ascontiguousarray(features, np.float32)
        self.feature_size = int(features.shape[1])
        if self.normalize:
            features = normalize(features)
        return features, kept, problems
