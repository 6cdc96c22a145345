"""Export for deployment: the inference network, ONNX / MINDIR files against the eager model, ONNX files of
the two backends against each other, evaluation through exported files (test.py --engine), user errors.

MindSpore compiles the whole network to export it (about a minute per file for the demo-width ACL with one
bottleneck per stage on a loaded 2-core CPU), so the MindSpore files are written once per module."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.crossenv import PYTHONS, ROOT, active_backend, require_backend, run_case

DEMO = str(ROOT / "configs" / "synthetic" / "acl.yml")
CLASSES = ["MODEL.HEADS.NUM_CLASSES", "[5, 6, 7]"]
# TEST.FLIP False: the demo config's mirrored second forward per test image would only cost test time
TINY_DATA = ["DATASETS.SYNTHETIC.NUM_IDS", "16", "DATALOADER.NUM_WORKERS", "0", "TEST.IMS_PER_BATCH", "32",
             "TEST.FLIP", "False", "TEST.JIT", "False"]  # (op by op, as before the demo compiled it)
FEATURE_TOL = 1e-4


def trained_like_state(model, seed=1):
    """The model's state with running statistics and norm scales moved away from their initial 0 / 1, so that
    folding batch norm and the instance-norm affine are exercised (numpy only: identical on both backends)."""
    import compat
    rs = np.random.RandomState(seed)
    state = {k: np.array(v) for k, v in compat.checkpoint.state_dict(model).items()}
    for key in sorted(state):
        shape = state[key].shape
        if key.endswith("running_mean") or key.endswith(".bias"):
            state[key] = rs.normal(0.0, 0.3, shape).astype(np.float32)
        elif key.endswith("running_var") or (key.endswith(".weight") and len(shape) == 1):
            state[key] = rs.uniform(0.5, 1.5, shape).astype(np.float32)
    compat.checkpoint.load_state_dict(model, state)
    return state


def small_acl(cfg):
    """The demo-width ACL network with one bottleneck per stage before each CODE block (every layer type of
    the demo network, a third of its graph), seeded: the same weights on both backends."""
    from reid.modeling.backbones.acl_resnet import ACLResNet
    from reid.modeling.build import _assemble
    b = cfg.MODEL.BACKBONE
    np.random.seed(0)
    model = _assemble(cfg, ACLResNet(b.BASE_WIDTH, b.LAST_STRIDE, b.WITH_IBN, b.NUM_EXPERTS, blocks=(1, 1, 1, 1)),
                      with_centers=True)
    trained_like_state(model)
    return model.eval()


def case_export(out_dir, formats, batch=4):
    """Export the small ACL network to each format (tools/export.py's code path) and run the files; returns the
    eager features, the inference network's eager features and each file's features on the same images."""
    import compat
    from reid.config import load_cfg
    from reid.deploy import InferenceNet, export_model
    from reid.deploy.export import ExportedModel, example_images
    cfg = load_cfg(DEMO, CLASSES)
    images = example_images(7, tuple(cfg.INPUT.SIZE_TEST), seed=3)   # 7: fixed-batch files pad the last chunk
    with compat.no_grad():
        eager = compat.to_numpy(small_acl(cfg)(compat.as_tensor(images)))
        net = InferenceNet(small_acl(cfg), tuple(cfg.INPUT.SIZE_TEST)).eval()
        inference = compat.to_numpy(net(compat.as_tensor(images)))
    result = {"eager": eager, "inference": inference, "files": {}, "sidecars": {}}
    for fmt in formats:
        path = os.path.join(out_dir, "%s_small.%s" % (compat.BACKEND, fmt))
        result["sidecars"][fmt] = export_model(cfg, path, fmt, batch=batch, model=small_acl(cfg))
        result["files"][fmt] = path
        result[fmt] = ExportedModel(path).run(images)
    result["images"] = images
    return result


def native_formats():
    return ("onnx", "mindir") if active_backend() == "mindspore" else ("onnx",)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return case_export(str(tmp_path_factory.mktemp("export")), native_formats())


@pytest.mark.parametrize("arch", ["ACL", "Baseline"])
def test_inference_network_computes_the_eager_features(arch):
    """The demo-size network (ACL, and the ResNet-50-IBN-a baseline) with trained-like statistics: the
    inference network gives the eval features of the model, op by op, on an odd input size (ceil-mode stem
    pooling pads), and leaves out the classifiers and centers."""
    import compat
    from reid.config import load_cfg
    from reid.deploy import InferenceNet
    from reid.deploy.export import example_images
    from reid.modeling import build_model
    extra = [] if arch == "ACL" else ["MODEL.META_ARCHITECTURE", "Baseline", "MODEL.BACKBONE.NAME", "resnet50_ibn_a"]
    cfg = load_cfg(DEMO, CLASSES + extra + ["INPUT.SIZE_TEST", "[70, 36]"])
    models = []
    for _ in range(2):
        np.random.seed(0)
        models.append(build_model(cfg))
        trained_like_state(models[-1])
    images = compat.as_tensor(example_images(3, (70, 36), seed=5))
    with compat.no_grad():
        eager = compat.to_numpy(models[0].eval()(images))
        net = InferenceNet(models[1], (70, 36)).eval()
        got = compat.to_numpy(net(images))
    assert (net.pad_h, net.pad_w) == (0, 1)
    names = [n for n, _ in net.named_parameters()]
    assert not any("classifiers" in n or "center" in n for n in names)
    assert eager.shape == (3, 256) and np.abs(eager).max() > 1.0
    assert np.abs(got - eager).max() <= 1e-5 * np.abs(eager).max()


@pytest.mark.slow
def test_exported_files_give_the_eager_features(native):
    """ONNX on either backend, MINDIR on MindSpore: <= 1e-4 max abs from the eager model, on a batch that is
    not a multiple of the fixed export batch; the sidecar records what a deployment needs."""
    assert sorted(native["files"]) == sorted(native_formats())
    scale = np.abs(native["eager"]).max()
    assert scale > 1.0 and np.abs(native["inference"] - native["eager"]).max() <= 1e-5 * scale
    for fmt in native_formats():
        got = native[fmt]
        assert got.shape == native["eager"].shape
        assert np.abs(got - native["eager"]).max() <= FEATURE_TOL, fmt
        side = native["sidecars"][fmt]
        assert side["check"]["max_abs_diff_vs_eager"] <= FEATURE_TOL
        assert side["input"]["shape"][1:] == [3, 64, 32] and side["model"]["feature_size"] == 256
        assert side["normalisation"]["pixel_mean"] == [123.675, 116.28, 103.53]
        dynamic = active_backend() == "torch"
        assert side["dynamic_batch"] is dynamic and side["batch"] == (None if dynamic else 4)
        if fmt == "onnx":
            assert isinstance(side["opset"], int) and side["opset"] >= 11
        with open(native["files"][fmt] + ".json") as fh:
            assert json.load(fh) == side
        # readable by others as the umask says (MindSpore's exporter leaves its files owner-read-only)
        from compat.checkpoint import new_file_mode
        for path in (native["files"][fmt], native["files"][fmt] + ".json"):
            assert os.stat(path).st_mode & 0o777 == new_file_mode(), (path, oct(os.stat(path).st_mode))


@pytest.mark.parity
@pytest.mark.slow
def test_onnx_files_of_both_backends_give_the_same_features(native, tmp_path):
    """The same weights exported to ONNX by MindSpore and by torch: the two files, run in the same onnxruntime
    on the same images, agree to 1e-4 (and the torch file is a dynamic-batch one)."""
    require_backend("mindspore")
    require_backend("torch")
    other = "torch" if active_backend() == "mindspore" else "mindspore"
    theirs = run_case(other, "tests.test_export:case_export", out_dir=str(tmp_path), formats=["onnx"])
    from compat.export import OnnxRunner
    a = OnnxRunner(native["files"]["onnx"])
    b = OnnxRunner(theirs["files"]["onnx"])
    batches = {r.batch for r in (a, b)}
    assert batches == {None, 4}
    images = native["images"][:4]
    fa, fb = a.run(images), b.run(images)
    assert np.abs(fa - fb).max() <= FEATURE_TOL
    assert np.abs(fa - native["eager"][:4]).max() <= FEATURE_TOL


# --------------------------------------------------------------------------- CLI: tools/export.py, test.py

def _run(python, args, backend, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), REID_BACKEND=backend)
    return subprocess.run([str(python)] + args, cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=timeout)


def _last_line(proc):
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Demo-config weights (seeded init, trained-like norm statistics) and the tiny synthetic data."""
    import compat
    from reid.config import load_cfg
    from reid.data.synthetic import ensure_synthetic
    from reid.modeling import build_model
    root = tmp_path_factory.mktemp("exportcli")
    ensure_synthetic(str(root / "data" / "synthetic"), seed=0, num_ids=16, workers=1, progress=False)
    np.random.seed(0)
    model = build_model(load_cfg(DEMO, CLASSES))
    state = trained_like_state(model)
    compat.checkpoint.save(state, str(root / "model.pth"))
    return root


def _eval_args(root, out):
    return ["--config-file", DEMO, "DATASETS.ROOT", str(root / "data"), "OUTPUT_DIR", str(out)] + TINY_DATA


@pytest.mark.slow
def test_test_py_onnx_engine_gives_the_eager_metrics(weights, tmp_path):
    """tools/export.py (torch, the fast exporter) writes the demo network; test.py on the active backend gives
    the same mAP / Rank-1 / mINP through onnxruntime as through the eager network (the weights)."""
    require_backend("torch")
    onnx_path = str(tmp_path / "acl.onnx")
    proc = _run(PYTHONS["torch"], ["tools/export.py", "--config-file", DEMO, "MODEL.WEIGHTS",
                                   str(weights / "model.pth"), "--output", onnx_path, "--batch", "2"], "torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "check: max |exported - eager|" in proc.stdout
    results = {}
    for engine, extra in (("eager", ["MODEL.WEIGHTS", str(weights / "model.pth")]),
                          ("onnx", ["--engine", "onnx", "--model", onnx_path])):
        out = tmp_path / engine
        proc = _run(sys.executable, ["test.py"] + _eval_args(weights, out) + extra, active_backend())
        assert proc.returncode == 0, proc.stderr[-3000:]
        written = json.loads((out / "eval" / "results.json").read_text())
        assert written["engine"] == engine
        results[engine] = written["results"]["SynthD"]
    assert 0 < results["eager"]["mAP"] < 100
    # percent; the features agree to float32 rounding, so only a near-tie can move a metric: on an H200 machine's
    # CPU (torch 2.11, onnxruntime 1.30) one moved mAP by 0.034 (17.49 against 17.52). 0.05, as the cross-backend
    # evaluation check (tests/test_training.py)
    for key in ("mAP", "Rank-1", "mINP"):
        assert results["onnx"][key] == pytest.approx(results["eager"][key], abs=0.05), key


@pytest.mark.slow
def test_mindir_engine_evaluates_like_the_eager_network(native, weights):
    """MindSpore: the small network's MINDIR file (fixed batch 4, so the evaluation pads its last chunks) gives
    the eager network's metrics on the synthetic target. torch: --engine mindir is a one-line error."""
    from reid.config import load_cfg
    from reid.engine.launch import build_evaluate_fn
    from reid.deploy import load_engine
    cfg = load_cfg(DEMO, CLASSES + ["DATASETS.ROOT", str(weights / "data")] + TINY_DATA)
    if active_backend() == "torch":
        from compat.errors import UserError
        with pytest.raises(UserError, match="MindIR files can only be run with the MindSpore backend"):
            load_engine(cfg, "mindir", str(weights / "x.mindir"))
        return
    evaluate_fn = build_evaluate_fn(cfg)
    exported, exported_details = evaluate_fn(load_engine(cfg, "mindir", native["files"]["mindir"]), True)
    eager, eager_details = evaluate_fn(small_acl(cfg), True)
    # The file and the eager network agree to float rounding (features ~3e-6), but this untrained network's
    # query-gallery distances all lie within 0.0085 with exact ties and ~1200 gaps under 1e-4, so rounding
    # reorders near-tied gallery items: the distances are compared tightly (measured 6e-7), the metrics loosely
    # (measured 0.043 mAP apart).
    dist_exported, dist_eager = (np.asarray(d["SynthD"][0]) for d in (exported_details, eager_details))
    assert np.abs(dist_exported - dist_eager).max() < 5e-6
    for key in ("mAP", "Rank-1", "mINP"):
        assert exported["SynthD"][key] == pytest.approx(eager["SynthD"][key], abs=0.2), key


def test_export_and_engine_errors_are_one_line(weights, tmp_path):
    """Unsupported format/backend pairs, config/weights mismatches, a config that does not describe the exported
    file, a missing sidecar: one `error:` line each, exit status 2."""
    require_backend("torch")
    pth = str(weights / "model.pth")
    torch_py = PYTHONS["torch"]
    cases = [
        (["tools/export.py", "--config-file", DEMO, "MODEL.WEIGHTS", pth, "--output", str(tmp_path / "m.mindir")],
         "MindIR files can only be written with the MindSpore backend"),
        (["tools/export.py", "--config-file", DEMO, "MODEL.WEIGHTS", pth, "--format", "onnx", "--output",
          str(tmp_path / "m.mindir")], "does not end with .onnx"),
        (["tools/export.py", "--config-file", DEMO, "MODEL.WEIGHTS", pth, "MODEL.BACKBONE.BASE_WIDTH", "16",
          "--output", str(tmp_path / "m.onnx")], "does not fit the model of this config"),
        (["tools/export.py", "--config-file", DEMO, "--output", str(tmp_path / "m.onnx")], "MODEL.WEIGHTS"),
        (["test.py"] + _eval_args(weights, tmp_path) + ["--engine", "mindir", "--model", str(tmp_path / "m.mindir")],
         "MindIR files can only be run with the MindSpore backend"),
        (["test.py"] + _eval_args(weights, tmp_path) + ["--model", str(tmp_path / "none.onnx")], "does not exist"),
    ]
    for args, expected in cases:
        proc = _run(torch_py, args, "torch")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert _last_line(proc).startswith("error: ") and expected in _last_line(proc), (args, _last_line(proc))


def test_engine_checks_the_sidecar_against_the_config(tmp_path):
    """A file exported for another input size or model, or without its sidecar, is refused with the fix named."""
    from compat.errors import UserError
    from reid.config import load_cfg
    from reid.deploy import check_against_cfg, read_sidecar
    path = str(tmp_path / "m.onnx")
    open(path, "wb").close()
    with pytest.raises(UserError, match="has no sidecar"):
        read_sidecar(path)
    cfg = load_cfg(DEMO, CLASSES)
    side = {"format": "onnx", "input": {"shape": [None, 3, 64, 32]},
            "model": {"meta_architecture": "ACL", "backbone": "acl_resnet50_ibn_a", "depth": "26x", "base_width": 8,
                      "num_experts": 4},
            "normalisation": {"pixel_mean": list(cfg.MODEL.PIXEL_MEAN), "pixel_std": list(cfg.MODEL.PIXEL_STD)}}
    check_against_cfg(side, cfg, path)
    with pytest.raises(UserError, match="takes 64x32 images but the config's INPUT.SIZE_TEST is 256x128"):
        check_against_cfg(side, load_cfg(DEMO, CLASSES + ["INPUT.SIZE_TEST", "[256, 128]"]), path)
    with pytest.raises(UserError, match=r"base_width 8 \(config: 16\)"):
        check_against_cfg(side, load_cfg(DEMO, CLASSES + ["MODEL.BACKBONE.BASE_WIDTH", "16"]), path)
    with pytest.raises(UserError, match=r"depth 26x \(config: 50x\)"):
        check_against_cfg(side, load_cfg(DEMO, CLASSES + ["MODEL.BACKBONE.DEPTH", "50x"]), path)
    old = dict(side, model={k: v for k, v in side["model"].items() if k != "depth"})
    with pytest.raises(UserError, match=r"depth 50x \(config: 26x\)"):   # written before the key: ResNet-50's
        check_against_cfg(old, cfg, path)
    with pytest.raises(UserError, match="PIXEL_MEAN"):
        check_against_cfg(side, load_cfg(DEMO, CLASSES + ["MODEL.PIXEL_MEAN", "[0.0, 0.0, 0.0]"]), path)


def test_onnx_opset_is_read_from_the_file(tmp_path):
    """The sidecar's opset comes from the file's ModelProto (field 8), parsed without the onnx package."""
    from reid.deploy.export import onnx_opset

    def varint(v):
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                return bytes(out)

    def field(number, payload):
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    opset_custom = field(1, b"com.example") + varint(2 << 3) + varint(3)
    opset_default = varint(2 << 3) + varint(13)
    model = varint(1 << 3) + varint(8) + field(7, b"\x0a\x00" * 300) + field(8, opset_custom) + field(8, opset_default)
    path = tmp_path / "tiny.onnx"
    path.write_bytes(model)
    assert onnx_opset(str(path)) == 13
