"""Every shipped config loads and describes what its name says; config mistakes are one clear error."""
from pathlib import Path

import pytest
import yaml

from reid.config import augmentation_off_opts, get_cfg, load_cfg
from reid.config.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yml"))
REAL = {"CUHK03", "Market1501", "MSMT17", "CUHKSYSU"}


def test_every_config_is_found():
    assert len(CONFIGS) >= 11 and "configs/synthetic/acl.yml" in CONFIGS


@pytest.mark.parametrize("path", CONFIGS)
def test_config_loads_and_matches_its_protocol(path):
    cfg = load_cfg(str(ROOT / path))
    assert cfg.is_frozen()
    sources, targets = list(cfg.DATASETS.NAMES), list(cfg.DATASETS.TESTS)
    assert len(sources) == len(set(sources)) == 3
    if path.startswith(("configs/protocol", "configs/baseline")):
        # leave-one-domain-out: the target is never a source, and the sources are the other real datasets
        assert len(targets) == 1 and targets[0] not in sources and set(sources) | set(targets) == REAL
        assert cfg.DATASETS.COMBINEALL == path.startswith("configs/protocol3")
        assert cfg.OUTPUT_DIR == "output/" + path[len("configs/"):-len(".yml")]
    if path.startswith("configs/synthetic"):
        assert sources == ["SynthA", "SynthB", "SynthC"] and targets == ["SynthD"]
        assert cfg.OUTPUT_DIR == "output/" + path[len("configs/"):-len(".yml")]
    is_baseline = "baseline" in path
    assert cfg.MODEL.META_ARCHITECTURE == ("Baseline" if is_baseline else "ACL")
    assert cfg.META.ENABLED == (not is_baseline)


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.startswith("configs/synthetic")])
def test_synthetic_configs_build_their_model(path):
    from reid.modeling import build_model
    cfg = load_cfg(str(ROOT / path), ["MODEL.HEADS.NUM_CLASSES", "[5,6,7]"])
    model = build_model(cfg)
    assert [int(c.weight.shape[0]) for c in model.heads.classifiers] == [5, 6, 7]
    # the demo width: 1/8 of ResNet-50's channels, so the embedding is 2048 / 8
    assert int(model.heads.bottleneck.weight.shape[0]) == 256


def test_defaults_are_the_full_size_protocol2_cuhk03_recipe():
    cfg = get_cfg()
    assert cfg.MODEL.META_ARCHITECTURE == "ACL" and cfg.MODEL.BACKBONE.BASE_WIDTH == 64
    assert list(cfg.DATASETS.NAMES) == ["CUHKSYSU", "Market1501", "MSMT17"] and list(cfg.DATASETS.TESTS) == ["CUHK03"]
    assert list(cfg.INPUT.SIZE_TRAIN) == [256, 128] and cfg.MODEL.NUM_SPLITS == 4


def test_compiled_execution_defaults_are_what_the_docs_say():
    """docs/performance.md "How compiled execution works" (the facts' one home): on MindSpore evaluation and
    training steps run compiled by default (TEST.JIT True, MODEL.JIT True), graphs are kept under OUTPUT_DIR
    (MODEL.COMPILE_CACHE ""), and every config keeps both (op by op is the opt-out, MODEL.JIT False / TEST.JIT
    False)."""
    cfg = get_cfg()
    assert cfg.TEST.JIT is True and cfg.MODEL.JIT is True and cfg.MODEL.COMPILE_CACHE == ""
    text = (ROOT / "docs" / "performance.md").read_text()
    section = text.split('<a id="compiled-execution"></a>', 1)[1].split("\n## ", 2)[1]
    for phrase in ("`TEST.JIT True`", "`MODEL.JIT True`", "`MODEL.JIT False`", "`MODEL.COMPILE_CACHE`",
                   "(default `\"\"`:\n  `OUTPUT_DIR/compile_cache`"):
        assert phrase in section, phrase
    for path in CONFIGS:
        cfg = load_cfg(str(ROOT / path))
        assert cfg.TEST.JIT is True and cfg.MODEL.JIT is True, path


def test_unknown_key_in_a_file_names_the_file_and_the_key(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("SOLVER:\n  BASE_LRR: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: unknown config key SOLVER\.BASE_LRR"):
        load_cfg(str(bad))


def test_base_chain_cycle_invalid_yaml_missing_file_and_odd_overrides(tmp_path):
    a, b = tmp_path / "a.yml", tmp_path / "b.yml"
    a.write_text("_BASE_: b.yml\n")
    b.write_text("_BASE_: a.yml\n")
    with pytest.raises(ConfigError, match="includes itself through _BASE_"):
        load_cfg(str(a))
    broken = tmp_path / "broken.yml"
    broken.write_text("SOLVER: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_cfg(str(broken))
    with pytest.raises(ConfigError, match="does not exist"):
        load_cfg(str(tmp_path / "nope.yml"))
    with pytest.raises(ConfigError, match="odd count"):
        load_cfg(None, ["SOLVER.BASE_LR"])


def test_base_values_are_overridden_by_the_file_then_the_command_line(tmp_path):
    child = tmp_path / "child.yml"
    child.write_text("_BASE_: %s\nSOLVER:\n  MAX_EPOCH: 9\n" % (ROOT / "configs" / "synthetic" / "acl.yml"))
    cfg = load_cfg(str(child), ["SOLVER.BASE_LR", "0.5"])
    assert cfg.SOLVER.MAX_EPOCH == 9 and cfg.SOLVER.BASE_LR == 0.5 and cfg.SOLVER.ITERS_PER_EPOCH == 25


@pytest.mark.parametrize("key, value, fix", [
    ("SOLVER.OPT", "Adam", "use SOLVER.OPT SGD"),
    ("DATALOADER.SAMPLER_TRAIN", "TrainingSampler", "use DATALOADER.SAMPLER_TRAIN NaiveIdentitySampler"),
    ("DATASETS.CUHK03_SPLIT", "3", "use DATASETS.CUHK03_SPLIT 0"),
    ("MODEL.HEADS.NECK_FEAT", "middle", "use MODEL.HEADS.NECK_FEAT after or MODEL.HEADS.NECK_FEAT before")])
def test_values_the_code_does_not_implement_are_rejected_in_one_line(key, value, fix, tmp_path):
    """A key the code reads only for some values must not accept another silently (SOLVER.OPT Adam would
    train with SGD): one line naming the key and the supported values, whether the value comes from the
    command line, a file, or a config edited in code and given to the Trainer."""
    with pytest.raises(ConfigError) as err:
        load_cfg(None, [key, value])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(key + " ") and msg.endswith(fix)
    nested = yaml.safe_load(value)
    for part in reversed(key.split(".")):
        nested = {part: nested}
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump(nested))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_cfg(str(path))
    from reid.engine.trainer import Trainer
    cfg = get_cfg()
    cfg.merge_from_list([key, value])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        Trainer(cfg, data=object())   # rejected before any data or model is built


def test_the_supported_values_load():
    cfg = load_cfg(None, ["MODEL.HEADS.NECK_FEAT", "before", "SOLVER.OPT", "SGD", "DATASETS.CUHK03_SPLIT", "0",
                          "DATALOADER.SAMPLER_TRAIN", "NaiveIdentitySampler"])
    assert cfg.MODEL.HEADS.NECK_FEAT == "before" and cfg.SOLVER.OPT == "SGD"


@pytest.mark.parametrize("path", [p for p in CONFIGS if "synthetic" in p])
def test_augmentation_off_turns_every_augmentation_off(path):
    """The overrides the step comparisons and benchmarks use: every INPUT section with an ENABLED switch (the
    white balance and random erasing included), each False once loaded over a config that turns them on."""
    opts = augmentation_off_opts()
    switches = sorted(k for k, v in get_cfg().INPUT.items() if hasattr(v, "ENABLED"))
    assert switches == ["AUTOAUG", "CAST", "CJ", "FLIP", "PADDING", "REA"]
    assert opts[0::2] == ["INPUT.%s.ENABLED" % k for k in switches] and set(opts[1::2]) == {"False"}
    loaded = load_cfg(str(ROOT / path))
    assert any(loaded.INPUT[k].ENABLED for k in switches)  # the config does augment
    off = load_cfg(str(ROOT / path), opts)
    assert [off.INPUT[k].ENABLED for k in switches] == [False] * len(switches)
