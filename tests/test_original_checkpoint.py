"""Checkpoints and configs of the original ACL-DGReID code (reid/modeling/original.py, reid/config/original.py,
tools/convert.py).

tests/data/acl_dgreid_state.json holds the names, shapes and dtypes of the original network's state dict at full
size, in its order, recorded from its code. Here: that table is exactly what our full-size ACL network maps to;
a file in the original's names and checkpoint layout (random values of that table) loads into the full-size
network on this backend with every tensor equal, unprefixed and with DataParallel's `module.`; a missing key, a
wrong shape or a foreign key is a one-line error naming it; ours -> original -> ours is bit-identical; a trained
ACL backbone starts a new model through MODEL.BACKBONE.PRETRAIN_PATH; the original's configs are read, or
refused one key at a time. The parity test: the loaded full-size network's features on MindSpore and torch.
The head is resized to a few identities per domain (its shapes follow the class counts; the file stays ~120 MB).
"""
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import compat
from compat.errors import UserError
from reid.config import ConfigError, get_cfg, load_cfg
from reid.engine.checkpointer import model_state_from_file
from reid.modeling import build_model, original
from tests.crossenv import ROOT, active_backend, run_case
from tests.test_modeling import OUT_ATOL, OUT_RTOL

TABLE = json.loads((ROOT / "tests" / "data" / "acl_dgreid_state.json").read_text())
CLASSES = (11, 7, 5)
DROPPED_LINE = "dropped 86 tensors of parts acl-reid leaves out (62 num_batches_tracked, 20 map side outputs, " \
               "4 router fc_classifier)"


def original_rows(classes=CLASSES):
    """The recorded (name, shape, dtype) rows, the head resized to `classes` identities per source domain."""
    rows = []
    for name, shape, dtype in TABLE["tensors"]:
        domain = re.match(r"heads\.weight(\d+)\.weight$", name)
        if domain:
            shape = [classes[int(domain.group(1)) - 1]] + shape[1:]
        elif name == "heads.center.centers":
            shape = [sum(classes)] + shape[1:]
        rows.append((name, tuple(shape), dtype))
    return rows


def random_state(rows, seed=0):
    """Values of a trained-looking network for (name, shape, dtype) rows, so features stay O(1) through every
    block: convs N(0, 2/fan_out), norm scales near 1, small biases, running statistics away from 0/1, linears
    U(±1/√fan_in), classifiers and centers N(0, 0.01²); counters random (the loader must ignore them)."""
    rng = np.random.default_rng(seed)
    state = collections.OrderedDict()
    for name, shape, dtype in rows:
        if dtype == "int64":
            value = np.array(rng.integers(0, 10 ** 6), np.int64).reshape(shape)
        elif name.endswith("running_mean"):
            value = rng.random(shape, np.float32) * 0.2
        elif name.endswith("running_var"):
            value = 0.5 + rng.random(shape, np.float32)
        elif len(shape) == 4:
            value = rng.standard_normal(shape, np.float32) * np.float32(np.sqrt(2.0 / (shape[0] * shape[2] * shape[3])))
        elif name.startswith("heads.weight") or name.startswith("heads.center") or name.startswith("heads.classifiers"):
            value = rng.standard_normal(shape, np.float32) * np.float32(0.01)
        elif len(shape) == 2:
            value = (rng.random(shape, np.float32) * 2 - 1) / np.float32(np.sqrt(shape[1]))
        elif name.endswith(".gate") or name.endswith(".bias"):
            value = rng.standard_normal(shape, np.float32) * np.float32(0.1)
        else:
            value = 1 + rng.standard_normal(shape, np.float32) * np.float32(0.1)
        state[name] = value
    return state


def write_original_checkpoint(path, model_state, prefix=""):
    """The file the original's fast-reid checkpointer writes (its keys; optimizer and schedulers abridged)."""
    model = collections.OrderedDict((prefix + k, v) for k, v in model_state.items())
    first = next(k for k in model_state if not k.endswith(original.BN_COUNTER))
    compat.checkpoint.save({
        "model": model,
        "optimizer": {"state": {0: {"momentum_buffer": np.zeros_like(model_state[first])}},
                      "param_groups": [{"lr": 4e-5, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False,
                                        "freeze_status": "normal", "params": [0]}]},
        "lr_sched": {"T_max": 50, "eta_min": 4e-5, "base_lrs": [0.04], "last_epoch": 50, "_step_count": 51},
        "warmup_sched": {"warmup_factor": 0.01, "warmup_iters": 12140, "warmup_method": "linear"},
        "epoch": 59, "metric": 45.3}, str(path))
    return path


def full_cfg(classes=CLASSES):
    cfg = get_cfg()                     # the full-size ACL network (BASE_WIDTH 64, 50x, 4 experts)
    cfg.MODEL.HEADS.NUM_CLASSES = list(classes)
    return cfg


def small_model(classes=CLASSES, seed=0):
    cfg = full_cfg(classes)
    cfg.MODEL.BACKBONE.BASE_WIDTH = 4
    np.random.seed(seed)
    return build_model(cfg)


def numpy_state(model):
    return compat.checkpoint.state_dict(model)


def expected_in_our_names(file_state):
    """{our name: array} that a load of `file_state` (original names) must give."""
    return {original.our_name(k): v for k, v in file_state.items() if original.our_name(k) is not None}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The full-size ACL network (built once) and a checkpoint in the original's names and layout."""
    tmp = tmp_path_factory.mktemp("original")
    np.random.seed(0)
    model = build_model(full_cfg())
    file_state = random_state(original_rows())
    path = write_original_checkpoint(tmp / "model_final.pth", file_state)
    return SimpleNamespace(model=model, file_state=file_state, path=path, tmp=tmp)


# --------------------------------------------------------------------------- the name table

def test_full_size_network_maps_onto_the_recorded_original_table(full):
    ours = numpy_state(full.model)
    mapped = original.to_original(ours)
    got = [(k, tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in mapped.items()]
    assert got == original_rows()                       # every name, shape and dtype, in the original's order
    back, dropped = original.from_original(mapped)
    assert list(back) == list(ours)                     # and back: our names, in our order
    assert original.dropped_summary(dropped) == DROPPED_LINE
    # the recorded table is the shipped config's: 11,934 + 751 + 1,041 identities
    assert TABLE["num_classes"] == [11934, 751, 1041] and original_rows(TABLE["num_classes"]) == [
        (n, tuple(s), d) for n, s, d in TABLE["tensors"]]


# --------------------------------------------------------------------------- loading the original's files

@pytest.mark.parametrize("prefix", ["", "module."])
def test_original_checkpoint_loads_with_every_tensor_equal(full, prefix, capsys):
    path = full.path if not prefix else write_original_checkpoint(full.tmp / "dp.pth", full.file_state, prefix)
    state = model_state_from_file(str(path))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["%s: a checkpoint of the original ACL-DGReID code, 389 tensors renamed to acl-reid's names; %s"
                     % (path, DROPPED_LINE)]
    compat.checkpoint.load_state_dict(full.model, state)
    got, want = numpy_state(full.model), expected_in_our_names(full.file_state)
    assert sorted(got) == sorted(want)
    unequal = [k for k in got if got[k].dtype != want[k].dtype or not np.array_equal(got[k], want[k])]
    assert not unequal


def _error_line(exc_info):
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_missing_wrong_shape_and_foreign_keys_fail_with_one_line_naming_them(tmp_path):
    model = small_model()
    good = original.to_original(numpy_state(model))

    def load(state, name="bad.pth"):
        write_original_checkpoint(tmp_path / name, state)
        compat.checkpoint.load_state_dict(model, model_state_from_file(str(tmp_path / name)))

    missing = collections.OrderedDict((k, v) for k, v in good.items() if k != "backbone.adaptor1_base.conv1.weight")
    with pytest.raises(UserError) as exc:
        load(missing)
    assert "missing keys: backbone.code1.adaptor_base.conv1.weight (backbone.adaptor1_base.conv1.weight in the " \
           "file)" in _error_line(exc)

    misshaped = collections.OrderedDict(good)
    misshaped["heads.weight2.weight"] = np.zeros((8, 128), np.float32)
    with pytest.raises(UserError) as exc:
        load(misshaped)
    assert "heads.classifiers.1.weight (heads.weight2.weight in the file) (expected (7, 128), got (8, 128))" \
        in _error_line(exc)

    foreign = collections.OrderedDict(good)
    foreign["backbone.NL_2.0.g.weight"] = np.zeros((4, 4, 1, 1), np.float32)   # a non-local block (WITH_NL)
    with pytest.raises(UserError) as exc:
        load(foreign)
    assert "holds backbone.NL_2.0.g.weight, which has no counterpart" in _error_line(exc)

    twice = collections.OrderedDict(good)
    twice["module.backbone.conv1.weight"] = good["backbone.conv1.weight"]
    with pytest.raises(UserError) as exc:
        load(twice)
    assert "backbone.conv1.weight both with and without the 'module.' prefix" in _error_line(exc)
    load(good, "good.pth")                               # the untouched file loads


# --------------------------------------------------------------------------- writing the original's files

def _convert_tool():
    spec = importlib.util.spec_from_file_location("convert_tool", str(ROOT / "tools" / "convert.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ours_to_original_and_back_is_bit_identical(tmp_path, capsys):
    model = small_model()
    ours = random_state([(k, v.shape, str(v.dtype)) for k, v in numpy_state(model).items()], seed=3)
    compat.checkpoint.save({"model": ours, "optimizer": {}, "iteration": 7}, str(tmp_path / "ours.pth"))
    tool = _convert_tool()
    tool.main([str(tmp_path / "ours.pth"), "--to", "original", "--output", str(tmp_path / "original.pth")])
    tool.main([str(tmp_path / "original.pth"), "--to", "ours", "--output", str(tmp_path / "back.pth")])
    written = compat.checkpoint.load(str(tmp_path / "original.pth"))
    assert sorted(written) == ["model"]
    assert [k for k in written["model"]] == [name for name, _, _ in original_rows()]   # the original's names
    back = model_state_from_file(str(tmp_path / "back.pth"))
    assert list(back) == list(ours)
    assert all(back[k].dtype == ours[k].dtype and np.array_equal(back[k], ours[k]) for k in ours)
    # what the original holds and we do not comes back at its initial values: counters 0, dead parts neutral
    extra = {k: v for k, v in written["model"].items() if original.our_name(k) is None}
    assert all(v.dtype == np.int64 and v.shape == () and v == 0 for k, v in extra.items() if "num_batches" in k)
    assert all(not np.any(v) for k, v in extra.items() if "fc_classifier" in k)
    assert all(np.all(v == (1 if k.endswith(("weight", "running_var")) else 0)) for k, v in extra.items()
               if ".map" in k)
    out = capsys.readouterr().out
    assert "{'model': 475 tensors in the original ACL-DGReID names}, of which 62 num_batches_tracked, 20 map side " \
           "outputs, 4 router fc_classifier were added at their initial values" in out
    # original -> ours -> original gives the original's file back for every tensor we hold
    again = original.to_original(back)
    assert all(np.array_equal(again[k], written["model"][k]) for k in written["model"])


def test_evaluation_model_of_a_recipe_that_starts_from_imagenet_needs_no_imagenet_file(tmp_path, capsys):
    # configs/Base-ACL.yml and the converted original config set PRETRAIN without a PRETRAIN_PATH: test.py,
    # export and the feature extractor load every tensor from MODEL.WEIGHTS, so they read no ImageNet file
    from reid.runtime import build_eval_model
    model = small_model()
    ours = random_state([(k, v.shape, str(v.dtype)) for k, v in numpy_state(model).items()], seed=5)
    path = write_original_checkpoint(tmp_path / "model_final.pth", original.to_original(ours), "module.")
    cfg = full_cfg((1, 1, 1))
    cfg.MODEL.BACKBONE.BASE_WIDTH = 4
    cfg.MODEL.BACKBONE.PRETRAIN, cfg.MODEL.BACKBONE.PRETRAIN_PATH = True, ""
    cfg.MODEL.WEIGHTS = str(path)
    got = numpy_state(build_eval_model(cfg))
    assert list(got) == list(ours) and all(np.array_equal(got[k], ours[k]) for k in ours)
    assert cfg.MODEL.BACKBONE.PRETRAIN      # the caller's config is left as it was


@pytest.mark.skipif(active_backend() != "torch", reason="real torch reads the written file (torch run only)")
def test_torch_loads_the_written_original_checkpoint(tmp_path):
    import torch
    model = small_model()
    compat.checkpoint.save(numpy_state(model), str(tmp_path / "ours.pth"))
    _convert_tool().main([str(tmp_path / "ours.pth"), "--to", "original", "--output", str(tmp_path / "original.pth")])
    loaded = torch.load(str(tmp_path / "original.pth"), weights_only=True)["model"]
    assert [k for k in loaded] == [name for name, _, _ in original_rows()]
    assert loaded["backbone.bn1.num_batches_tracked"].dtype == torch.int64
    proc = subprocess.run([sys.executable, "tools/convert.py", str(tmp_path / "original.pth"), "--to", "original",
                           "--output", str(tmp_path / "x.pth")], cwd=str(ROOT), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), REID_BACKEND="torch"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "already a checkpoint of the original" in proc.stderr


@pytest.mark.parametrize("names", ["original", "ours"])
def test_trained_acl_backbone_starts_a_model_through_pretrain_path(tmp_path, capsys, names):
    trained = small_model(seed=1)
    if names == "original":
        write_original_checkpoint(tmp_path / "trained.pth", original.to_original(numpy_state(trained)), "module.")
        note = "; a checkpoint of the original ACL-DGReID code, 389 tensors renamed to acl-reid's names; %s" % (
            DROPPED_LINE)
    else:
        compat.checkpoint.save({"model": numpy_state(trained), "iteration": 5}, str(tmp_path / "trained.pth"))
        note = ""
    cfg = full_cfg((4, 4, 2))                            # other source domains: the head starts afresh
    cfg.MODEL.BACKBONE.BASE_WIDTH = 4
    cfg.MODEL.BACKBONE.PRETRAIN = True
    cfg.MODEL.BACKBONE.PRETRAIN_PATH = str(tmp_path / "trained.pth")
    np.random.seed(2)
    model = build_model(cfg)
    assert capsys.readouterr().out.splitlines() == [
        "%s: a trained ACL backbone, its 381 tensors loaded by name (no ImageNet weight surgery)%s"
        % (cfg.MODEL.BACKBONE.PRETRAIN_PATH, note)]
    got, want = numpy_state(model.backbone), numpy_state(trained.backbone)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    assert numpy_state(model.heads)["center.centers"].shape == (10, 128)


# --------------------------------------------------------------------------- features on both backends

def case_features(path, classes=CLASSES, size=(64, 32)):
    """The full-size network with the original checkpoint `path`, eval features of 2 fixed images."""
    np.random.seed(0)
    model = build_model(full_cfg(classes))
    compat.checkpoint.load_state_dict(model, model_state_from_file(path))
    return _features(model, size)


def _features(model, size=(64, 32)):
    model.eval()
    images = (np.random.RandomState(1).rand(2, 3, size[0], size[1]) * 255).astype(np.float32)
    with compat.no_grad():
        return compat.to_numpy(model(compat.as_tensor(images)))


@pytest.mark.parity
@pytest.mark.skipif(active_backend() == "torch", reason="compares MindSpore with torch (MindSpore run)")
def test_loaded_original_checkpoint_gives_the_same_features_on_both_backends(full):
    compat.checkpoint.load_state_dict(full.model, model_state_from_file(str(full.path)))
    here = _features(full.model)
    ref = run_case("torch", "tests.test_original_checkpoint:case_features", path=str(full.path))
    assert ref.shape == (2, 2048) and np.isfinite(ref).all() and float(np.abs(ref).max()) > 1e-2
    np.testing.assert_allclose(here, ref, atol=OUT_ATOL, rtol=OUT_RTOL)


# --------------------------------------------------------------------------- the original's configs

ORIGINAL_ACL_CONFIG = """
MODEL:
  META_ARCHITECTURE: Baseline
  BACKBONE:
    NAME: build_meta_dynamic_router_resnet_backbone
    NORM: BN
    DEPTH: 50x
    LAST_STRIDE: 1
    FEAT_DIM: 2048
    WITH_IBN: True
    PRETRAIN: True
  HEADS:
    NAME: MetaEmbeddingHead
    NORM: BN
    WITH_BNNECK: True
    POOL_LAYER: GeneralizedMeanPooling
    NECK_FEAT: after
    CLS_LAYER: Linear
  LOSSES:
    NAME: ("CrossEntropyLoss", "TripletLoss")
SOLVER:
  BASE_LR: 0.04
TEST:
  IMS_PER_BATCH: 128
DATASETS:
  NAMES: ("cuhkSYSU", "Market1501", "MSMT17")
  TESTS: ("CUHK03",)
"""

MODEL_KEYS = ("MODEL.META_ARCHITECTURE", "MODEL.BACKBONE.NAME", "MODEL.BACKBONE.BASE_WIDTH", "MODEL.BACKBONE.DEPTH",
              "MODEL.BACKBONE.LAST_STRIDE", "MODEL.BACKBONE.WITH_IBN", "MODEL.BACKBONE.NUM_EXPERTS",
              "MODEL.HEADS.POOL_LAYER", "MODEL.HEADS.GEM_P", "MODEL.HEADS.NECK_FEAT", "MODEL.HEADS.SCALE",
              "MODEL.PIXEL_MEAN", "MODEL.PIXEL_STD", "INPUT.SIZE_TEST", "DATASETS.NAMES", "DATASETS.TESTS",
              "TEST.METRIC", "TEST.IMS_PER_BATCH")


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _convert_config(tmp_path, text, base=None):
    if base is not None:
        (tmp_path / "base.yml").write_text(base)
        text = "_BASE_: base.yml\n" + text
    (tmp_path / "original.yml").write_text(text)
    _convert_tool().main(["--from-original", str(tmp_path / "original.yml"), "--output", str(tmp_path / "ours.yml")])
    return load_cfg(str(tmp_path / "ours.yml"))


def test_original_acl_config_reads_as_our_defaults(tmp_path, capsys):
    cfg, defaults = _convert_config(tmp_path, ORIGINAL_ACL_CONFIG), get_cfg()
    assert {k: _get(cfg, k) for k in MODEL_KEYS} == {k: _get(defaults, k) for k in MODEL_KEYS}
    assert cfg.MODEL.BACKBONE.PRETRAIN
    out = capsys.readouterr().out
    assert "not read (training recipe: acl-reid's defaults apply): MODEL.LOSSES, SOLVER.BASE_LR;" in out
    assert "resnet50_ibn_a-d9d0bb7b.pth to train (evaluation and export load MODEL.WEIGHTS alone)" in out


def test_original_config_keys_take_the_originals_defaults(tmp_path):
    # what a config leaves out is fast-reid's default, not ours: average pooling, features before the BNNeck,
    # no IBN; _BASE_ files merge under the file
    base = ORIGINAL_ACL_CONFIG.replace("    POOL_LAYER: GeneralizedMeanPooling\n", "").replace(
        "    NECK_FEAT: after\n", "").replace("    WITH_IBN: True\n", "")
    cfg = _convert_config(tmp_path, "MODEL:\n  HEADS:\n    NUM_CLASSES1: 5\n    NUM_CLASSES2: 6\n"
                                    "    NUM_CLASSES3: 7\nDATASETS:\n  TESTS: ('Market1501',)\n", base=base)
    assert (cfg.MODEL.HEADS.POOL_LAYER, cfg.MODEL.HEADS.NECK_FEAT, cfg.MODEL.BACKBONE.WITH_IBN) == ("avg", "before",
                                                                                                   False)
    assert list(cfg.MODEL.HEADS.NUM_CLASSES) == [5, 6, 7] and list(cfg.DATASETS.TESTS) == ["Market1501"]
    assert list(cfg.DATASETS.NAMES) == ["CUHKSYSU", "Market1501", "MSMT17"]


@pytest.mark.parametrize("change, message", [
    (("    WITH_IBN: True\n", "    WITH_IBN: True\n    WITH_SE: True\n"), "MODEL.BACKBONE.WITH_SE True is not"),
    (("DEPTH: 50x", "DEPTH: 18x"), "MODEL.BACKBONE.DEPTH '18x' is not supported"),
    (("CLS_LAYER: Linear", "CLS_LAYER: CircleSoftmax"), "MODEL.HEADS.CLS_LAYER 'CircleSoftmax' is not supported"),
    (("NAME: build_meta_dynamic_router_resnet_backbone", "NAME: build_resnet_backbone"), "MODEL.BACKBONE.NAME"),
    (("WITH_BNNECK: True", "WITH_BNNECK: False"), "acl-reid's head always has the BNNeck"),
    (('("CUHK03",)', '("VIPeR",)'), "DATASETS.TESTS VIPeR has no loader in acl-reid"),
])
def test_original_config_values_we_cannot_honour_are_one_line_errors(tmp_path, change, message):
    with pytest.raises(ConfigError) as exc:
        _convert_config(tmp_path, ORIGINAL_ACL_CONFIG.replace(*change))
    assert message in _error_line(exc) and "original.yml" in str(exc.value)
