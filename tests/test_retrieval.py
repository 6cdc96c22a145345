"""The feature extractor (reid.deploy.FeatureExtractor) against test.py's features on every engine of the active
backend: eager, compiled (MindSpore), an ONNX file (onnxruntime), a MINDIR file (MindSpore). The index and search
tools built on it are tested in tests/test_retrieval_tools.py.

Cheap by design: the demo-width ResNet-50-IBN-a baseline (its compiled graph and MINDIR export take about half
the demo ACL network's time) on the synthetic target's 21 query images."""
import contextlib
import os

import numpy as np
import pytest

from compat.errors import UserError
from tests.crossenv import ROOT, active_backend

DEMO = str(ROOT / "configs" / "synthetic" / "acl.yml")
CLASSES = ["MODEL.HEADS.NUM_CLASSES", "[5, 6, 7]"]
BASELINE = ["MODEL.META_ARCHITECTURE", "Baseline", "MODEL.BACKBONE.NAME", "resnet50_ibn_a"]
# the demo config keeps TEST.FLIP True, so every comparison below includes the mirrored forward
TINY = ["DATASETS.SYNTHETIC.NUM_IDS", "16", "DATALOADER.NUM_WORKERS", "0", "TEST.IMS_PER_BATCH", "32",
        "TEST.REFERENCE", "", "MODEL.COMPILE_CACHE", "off"]


@contextlib.contextmanager
def one_torch_thread():
    """torch's intra-op threads on one: its two threads spin-wait for each other, and beside the other suite of
    `make test` on 2 cores these modules took 95 s instead of 8 s (measured at load ~4). A no-op on MindSpore."""
    import compat
    if compat.BACKEND != "torch":
        yield
        return
    before = compat.torch.get_num_threads()
    compat.torch.set_num_threads(1)
    try:
        yield
    finally:
        compat.torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def make_weights(path, extra=(), calibrate_on=None):
    """Seeded demo weights with trained-like norm statistics (tests/test_export.py). `calibrate_on`: image paths
    whose pooled features set the BNNeck's running statistics (scale 1, shift 0), so that features spread over
    the sphere as a trained network's do instead of lying within ~1e-3 of each other: search results then
    have gaps far above float rounding, and rank comparisons are exact."""
    import compat
    from reid.config import load_cfg
    from reid.data.common import read_image
    from reid.data.transforms import build_transforms
    from reid.modeling import build_model
    from tests.test_export import trained_like_state
    cfg = load_cfg(DEMO, CLASSES + list(extra))
    np.random.seed(0)
    model = build_model(cfg)
    state = trained_like_state(model)
    if calibrate_on:
        transform = build_transforms(cfg, is_train=False)
        images = np.stack([transform(read_image(p)) for p in calibrate_on])
        with compat.no_grad():
            neck = compat.to_numpy(model.eval()(compat.as_tensor(images))).astype(np.float64)
        key = "heads.bottleneck."
        weight, bias, mean, var = (np.asarray(state[key + k], np.float64) for k in ("weight", "bias",
                                                                                     "running_mean", "running_var"))
        pooled = (neck - bias) / weight * np.sqrt(var + 1e-5) + mean
        state[key + "running_mean"] = pooled.mean(0).astype(np.float32)
        state[key + "running_var"] = pooled.var(0).astype(np.float32)
        state[key + "weight"] = np.ones_like(state[key + "weight"])
        state[key + "bias"] = np.zeros_like(state[key + "bias"])
    compat.checkpoint.save(state, str(path))
    return str(path)


@pytest.fixture(scope="module")
def world(retrieval_world):
    return retrieval_world


def opts_for(world, arch="baseline", extra=()):
    return (BASELINE if arch == "baseline" else []) + ["MODEL.WEIGHTS", world[arch], "DATASETS.ROOT", world["data"],
                                                       "OUTPUT_DIR", str(world["root"] / "out")] + TINY + list(extra)


def query_features_of_test_py(cfg, engine="eager", model_path=None):
    """What test.py extracts for the target's queries: its loaders, its engine loading, its extraction."""
    from reid.data.build import build_test_loaders
    from reid.deploy import load_engine
    from reid.evaluation import extract_features
    qloader, _, qrec, _ = build_test_loaders(cfg, "SynthD")
    feats, _, _, paths = extract_features(load_engine(cfg, engine, model_path), qloader, bool(cfg.TEST.FLIP))
    return feats, [r[0] for r in qrec]


@pytest.fixture(scope="module")
def reference(world):
    """test.py's query features of the baseline weights, op by op, and the config."""
    from reid.config import load_cfg
    cfg = load_cfg(DEMO, opts_for(world, extra=["TEST.JIT", "False"]))
    feats, paths = query_features_of_test_py(cfg)
    return {"cfg": cfg, "features": feats, "paths": paths}


@pytest.mark.parametrize("engine", ["eager", "compiled", "onnx", "mindir"])
def test_extractor_gives_test_py_features(world, reference, engine, capfd):
    """FeatureExtractor on the query images (paths, a folder, decoded arrays) gives test.py's features,
    L2-normalised: eager and compiled to 1e-5, this backend's ONNX file (onnxruntime) and MINDIR file (batch 1
    on MindSpore: one export per case) to 1e-4, each given the weights (exported once, then reused) and given
    the file; unnormalised on request. The engines a backend lacks are one-line errors."""
    import compat
    from reid.deploy import FeatureExtractor
    from reid.evaluation.distance import normalize
    mindspore = active_backend() == "mindspore"
    if engine in ("onnx", "mindir"):
        if engine == "mindir" and not mindspore:
            with pytest.raises(UserError, match="MindIR files can only be run with the MindSpore backend"):
                FeatureExtractor(model=str(world["root"] / "none.mindir"))
            return
        # given the weights, the network is exported once into the user cache's deploy/ (CACHE_DIR here; batch 1
        # on MindSpore, dynamic on torch), announced by one line first, the files readable as the umask says;
        # given that file (and its sidecar), it runs without a config
        from compat.checkpoint import new_file_mode
        cache = world["root"] / ("cache-" + engine)
        opts = opts_for(world, extra=["CACHE_DIR", str(cache)])
        from_weights = FeatureExtractor(config=DEMO, opts=opts, engine=engine, batch_size=1)
        assert from_weights.model_path is None and from_weights.describe()["weights_sha256"]   # built on first use
        capfd.readouterr()
        assert np.abs(from_weights(reference["paths"][:3]) - normalize(reference["features"][:3])).max() <= 1e-4
        notice = capfd.readouterr().err
        path = from_weights.model_path
        assert path.startswith(str(cache / "deploy")) and path.endswith("." + engine)
        assert not os.path.exists(str(world["root"] / "out" / "deploy_cache"))    # nothing in OUTPUT_DIR
        assert notice.startswith("first use of baseline.pth with engine %s: exporting the network to %s once (1 "
                                 "file, the engine runs them), roughly " % (engine, engine.upper()))
        assert notice.rstrip().endswith("s on a 2-core CPU; kept in %s for later runs" % (cache / "deploy"))
        assert notice.count("\n") == 1
        for written in (path, path + ".json"):
            assert os.stat(written).st_mode & 0o777 == new_file_mode(), oct(os.stat(written).st_mode)
        written = os.stat(path).st_mtime_ns
        again = FeatureExtractor(config=DEMO, opts=opts, engine=engine, batch_size=1)
        assert again.net is not None and again.model_path == path
        assert os.stat(path).st_mtime_ns == written     # reused, not exported again
        assert capfd.readouterr().err == ""              # and nothing announced
        extractor = FeatureExtractor(model=path, batch_size=5)
        assert extractor.flip is True                                  # TEST.FLIP, from the sidecar
        # the file's identity is that of the weights it was exported from (the sidecar records them): the same
        # model on every engine (tools/search.py compares identities)
        from reid.deploy.gallery import same_model
        assert extractor.identity["kind"] == "weights" and same_model(extractor.describe(), from_weights.describe())
        assert extractor.identity["weights_sha256"] == from_weights.identity["weights_sha256"]
        tolerance = 1e-4
    else:
        if engine == "compiled" and not mindspore:
            with pytest.raises(UserError, match="engine compiled is MindSpore's graph mode"):
                FeatureExtractor(config=DEMO, opts=opts_for(world), engine="compiled")
            return
        # compiled: the graph kept in the user cache (REID_CACHE here), TINY's "off" undone
        extra = ["MODEL.COMPILE_CACHE", ""] if engine == "compiled" else []
        extractor = FeatureExtractor(config=DEMO, opts=opts_for(world, extra=extra), engine=engine, batch_size=8)
        tolerance = 1e-5
    assert extractor.engine == engine
    assert extractor.feature_size == reference["features"].shape[1]    # known from the config, before any image
    capfd.readouterr()
    got = extractor(reference["paths"])
    if engine == "compiled":      # the graph's build announced, its cache in the user cache (REID_CACHE here)
        from reid.runtime import user_cache_dir
        assert capfd.readouterr().err.startswith(
            "engine compiled: building the network's graph for batches of 8 (MindSpore graph mode, faster "
            "extraction), roughly 60 s on a 2-core CPU the first time; kept in %s for later runs\n"
            % os.path.join(user_cache_dir(), "compile_cache"))
        import compat
        assert compat.jit.cache_dir() == os.path.join(user_cache_dir(), "compile_cache")   # where graphs go
    want = normalize(reference["features"])
    assert got.dtype == np.float32 and got.shape == want.shape == (21, 256)
    assert np.abs(got - want).max() <= tolerance, np.abs(got - want).max()
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-6
    if engine == "eager":
        from reid.data.common import read_image
        arrays = [read_image(p) for p in reference["paths"]]
        assert np.array_equal(extractor(arrays), got)
        # (N, H, W, 3); a batch of another size may take other kernel blockings (MindSpore on AVX2-only CPUs
        # differs in the last bits), so to float32 rounding rather than bit for bit
        assert np.abs(extractor(np.stack([arrays[4]] * 3)) - got[[4, 4, 4]]).max() <= 1e-6
        assert np.array_equal(extractor(world["query"]), got)             # a folder: its images, sorted
        raw = FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager", normalize=False)(arrays[:5])
        scale = np.abs(reference["features"]).max()
        assert np.abs(raw - reference["features"][:5]).max() <= 1e-5 * scale and scale > 1


def test_the_cache_folder_is_the_config_key_then_reid_cache_then_xdg(monkeypatch, tmp_path):
    from reid.config import load_cfg
    from reid.runtime import user_cache_dir
    monkeypatch.delenv("REID_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == str(tmp_path / "home" / ".cache" / "acl-reid")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")      # the XDG spec: absolute paths only
    assert user_cache_dir() == str(tmp_path / "home" / ".cache" / "acl-reid")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir(load_cfg(None, [])) == str(tmp_path / "xdg" / "acl-reid")
    monkeypatch.setenv("REID_CACHE", "~/models")
    assert user_cache_dir(load_cfg(None, [])) == str(tmp_path / "home" / "models")
    assert user_cache_dir(load_cfg(None, ["CACHE_DIR", str(tmp_path / "key")])) == str(tmp_path / "key")


def test_fixed_batch_files_take_full_batches_and_the_rest_image_by_image():
    """What the extractor runs on MindSpore given weights and engine onnx / mindir: a batch-B file for every full
    batch of B, the batch-1 file for the rest; no padded image computed."""
    from reid.deploy.extractor import FixedBatchFiles

    class Fixed:
        def __init__(self, batch):
            self.batch, self.path, self.sidecar, self.calls = batch, "b%d" % batch, {}, []

        def train(self, mode=True):
            return self

        def run(self, images):
            assert len(images) % self.batch == 0
            self.calls.append(len(images))
            return images.reshape(len(images), -1)[:, :2] * 2
    big, single = Fixed(4), Fixed(1)
    files = FixedBatchFiles(big, single)
    images = np.arange(11 * 3 * 2 * 2, dtype=np.float32).reshape(11, 3, 2, 2)
    assert np.array_equal(files.run(images), images.reshape(11, -1)[:, :2] * 2)
    assert big.calls == [8] and single.calls == [3]
    assert np.array_equal(files.run(images[:2]), images[:2].reshape(2, -1)[:, :2] * 2) and single.calls == [3, 2]


def test_default_engine_follows_what_is_given(world):
    from reid.deploy import FeatureExtractor
    from reid.deploy.extractor import default_engine
    assert default_engine("weights", "mindspore", onnxruntime=True) == "onnx"
    assert default_engine("weights", "torch", onnxruntime=True) == "onnx"
    assert default_engine("weights", "mindspore", onnxruntime=False) == "compiled"
    assert default_engine("weights", "torch", onnxruntime=False) == "eager"
    assert default_engine("onnx", active_backend()) == "onnx" and default_engine("mindir", "mindspore") == "mindir"
    if active_backend() == "torch":
        with pytest.raises(UserError, match="MindIR files can only be written with the MindSpore backend"):
            FeatureExtractor(config=DEMO, opts=opts_for(world), engine="mindir")
    with pytest.raises(UserError, match="needs a model"):
        FeatureExtractor(config=DEMO)
