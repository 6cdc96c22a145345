"""A user's own datasets (DATASETS.CUSTOM): the config entries; a built-in synthetic domain written out as a
Market-1501-style folder and as a CSV list gives the same records, the same test.py metrics and the same first
training losses as the built-in domain; every bad input is a one-line error."""
import csv
import logging
import os
import shutil

import numpy as np
import pytest

from compat.errors import UserError
from reid.config import ConfigError, load_cfg
from reid.data.datasets import build_dataset, build_test_set, build_train_set
from tests.crossenv import ROOT, active_backend
from tests.test_datasets import make_market_like, touch, write_image

DEMO = str(ROOT / "configs" / "synthetic" / "acl.yml")
SUBDIRS = ("bounding_box_train", "query", "bounding_box_test")


# ----------------------------------------------------------------------------- writing a domain out
def copy_as_folder(synth_root, domain, dest):
    """The built-in domain's three folders (names, junk and distractors included) under `dest`."""
    src = os.path.join(synth_root, "synthetic", domain)
    for sub in SUBDIRS:
        shutil.copytree(os.path.join(src, sub), os.path.join(dest, sub))
    return dest


def raw_id(value):
    """The integer id of a namespaced training id ('SynthA_12' -> 12)."""
    return value if isinstance(value, (int, np.integer)) else int(value.rsplit("_", 1)[1])


def write_csv(path, dataset, absolute=()):
    """The built-in dataset's records as a path,pid,camid,split list, in the loader's order; paths relative to the
    CSV's folder except for the splits in `absolute`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["path", "pid", "camid", "split"])
        for split in ("train", "query", "gallery"):
            for image, pid, camid, _ in getattr(dataset, split):
                rel = image if split in absolute else os.path.relpath(image, os.path.dirname(path))
                out.writerow([rel, raw_id(pid), raw_id(camid), split])
    return path


def custom_opts(entries):
    """Command-line overrides defining DATASETS.CUSTOM entries {name: (key, path)}."""
    opts = []
    for name, (key, path) in entries.items():
        opts += ["DATASETS.CUSTOM.%s.%s" % (name, key), str(path)]
    return opts


@pytest.fixture(scope="module")
def copies(synth_root, tmp_path_factory):
    """SynthA and SynthD as folder copies, SynthB and SynthD as CSV lists; {name: (key, path)}."""
    base = tmp_path_factory.mktemp("custom")
    entries = {}
    for domain in ("SynthA", "SynthD"):
        entries["Folder" + domain[-1]] = ("ROOT", copy_as_folder(synth_root, domain, str(base / domain)))
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", synth_root, "DATASETS.SYNTHETIC.NUM_IDS", "16"])
    for domain, absolute in (("SynthB", ()), ("SynthD", ("gallery",))):
        ds = build_dataset(domain, cfg=cfg)
        entries["Csv" + domain[-1]] = ("CSV", write_csv(str(base / "lists" / (domain + ".csv")), ds, absolute))
    return entries


def copies_cfg(synth_root, copies, extra=()):
    return load_cfg(DEMO, ["DATASETS.ROOT", synth_root, "DATASETS.SYNTHETIC.NUM_IDS", "16"] + custom_opts(copies)
                    + list(extra))


def comparable(records, builtin, custom):
    """Records with the dataset's own name in namespaced ids replaced, and the image file's identity for its path."""
    def same(value):
        return value.replace(custom + "_", builtin + "_", 1) if isinstance(value, str) else value
    return [(os.stat(p).st_size, os.path.basename(p), same(pid), same(cam), d) for p, pid, cam, d in records]


# ----------------------------------------------------------------------------- records
@pytest.mark.parametrize("custom", ["FolderD", "CsvD"])
def test_copies_of_a_domain_list_its_records(synth_root, copies, custom):
    """Train (namespaced ids), query and gallery (raw ids, 0-based cameras; junk dropped, distractors kept), and
    with combineall the test identities added to train: the folder leaves the distractors (pid 0) out as
    Market-1501 does, the CSV, which has no distractor convention, keeps pid 0 as an identity."""
    cfg = copies_cfg(synth_root, copies)
    builtin = build_dataset("SynthD", cfg=cfg, domain=1)
    own = build_dataset(custom, cfg=cfg, domain=1)
    for split in ("train", "query", "gallery"):
        assert comparable(getattr(own, split), "SynthD", custom) == comparable(getattr(builtin, split), "SynthD",
                                                                                 custom), split
    assert len(own.query) and len(own.train) and 0 in {r[1] for r in own.gallery}
    combined = build_dataset(custom, cfg=cfg, combineall=True, domain=1)
    added = comparable(combined.train[len(own.train):], "SynthD", custom)
    expected = comparable(build_dataset("SynthD", cfg=cfg, combineall=True, domain=1).train[len(builtin.train):],
                          "SynthD", custom)
    if custom == "CsvD":
        distractors = [r for r in builtin.query + builtin.gallery if r[1] == 0]
        expected += comparable([(p, "SynthD_test_0", "SynthD_test_%d" % c, d) for p, _, c, d in distractors],
                               "SynthD", custom)
    assert sorted(added) == sorted(expected) and len(added) > len(own.query)


def test_two_custom_sources_relabel_like_the_builtins(synth_root, copies):
    """Several custom datasets at once, one of each kind, as the sources: the same global ids, cameras, domains."""
    builtin = build_train_set(copies_cfg(synth_root, copies, ["DATASETS.NAMES", "['SynthA','SynthB']"]))
    own = build_train_set(copies_cfg(synth_root, copies, ["DATASETS.NAMES", "['FolderA','CsvB']"]))
    assert own.num_classes == builtin.num_classes and own.offsets == builtin.offsets
    assert own.num_cameras == builtin.num_cameras and own.names == ["FolderA", "CsvB"]
    assert [r[1:] for r in own.records] == [r[1:] for r in builtin.records]
    assert [os.path.basename(r[0]) for r in own.records] == [os.path.basename(r[0]) for r in builtin.records]


# ----------------------------------------------------------------------------- through the model
def test_test_py_scores_the_copies_like_the_builtin_domain(synth_root, copies, tmp_path):
    """reid.engine.launch.test (what test.py runs) on the same weights: the built-in target and its two copies give
    equal metrics to the last digit (both backends)."""
    import compat
    from reid.engine.launch import test
    from reid.modeling import build_model
    cfg = copies_cfg(synth_root, copies, [
        "MODEL.BACKBONE.DEPTH", "26x", "MODEL.BACKBONE.ZERO_INIT_RESIDUAL", "False",
        "MODEL.BACKBONE.ZERO_INIT_CODE", "False", "MODEL.HEADS.NUM_CLASSES", "[5, 6, 7]", "TEST.JIT", "False",
        "TEST.FLIP", "False", "TEST.REFERENCE", "", "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", str(tmp_path),
        "DATASETS.TESTS", "['SynthD','FolderD','CsvD']"])
    np.random.seed(0)
    weights = str(tmp_path / "random.pth")
    compat.checkpoint.save(compat.checkpoint.state_dict(build_model(cfg)), weights)
    cfg.defrost()
    cfg.MODEL.WEIGHTS = weights
    cfg.freeze()
    results = test(cfg)
    assert 0 < results["SynthD"]["mAP"] < 100 and 0 < results["SynthD"]["Rank-1"] <= 100
    assert results["FolderD"] == results["SynthD"]
    assert results["CsvD"] == results["SynthD"]


@pytest.mark.skipif(active_backend() != "torch", reason="data-side equality (the records above) is backend-neutral; "
                    "the losses are compared once, on torch")
def test_copies_train_like_the_builtin_sources(synth_root, copies, tmp_path):
    """The built-in sources SynthA + SynthB swapped for their folder and CSV copies: the same losses, step by step,
    in the first iteration (basic and meta steps, augmentation on)."""
    from reid.engine.trainer import Trainer
    from tests.test_training import TINY
    losses = {}
    for names in ("['SynthA','SynthB']", "['FolderA','CsvB']"):
        cfg = copies_cfg(synth_root, copies, TINY + ["DATASETS.NAMES", names, "DATASETS.TESTS", "[]",
                                                     "OUTPUT_DIR", str(tmp_path / names[2:8])])
        trainer = Trainer(cfg, quiet=True)
        trainer.run_iteration()   # iteration 0: META.INITIAL_BASIC_STEPS basic steps, then a meta step
        losses[names] = trainer.step_log
    assert [kind for _, kind, _ in losses["['SynthA','SynthB']"]] == ["basic", "basic", "meta"]
    assert losses["['FolderA','CsvB']"] == losses["['SynthA','SynthB']"]


# ----------------------------------------------------------------------------- config entries
def test_config_entries_from_files_and_the_command_line(tmp_path):
    base = tmp_path / "base.yml"
    base.write_text("_BASE_: %s\nDATASETS:\n  CUSTOM:\n    Shop: {ROOT: /data/shop}\n    Lobby:\n"
                    "      CSV: lobby/list.csv\n  NAMES: [Shop, SynthA]\n  TESTS: [Lobby]\n" % DEMO)
    child = tmp_path / "child.yml"
    child.write_text("_BASE_: base.yml\nDATASETS:\n  CUSTOM:\n    Shop: {ROOT: /data/shop2}\n")
    cfg = load_cfg(str(child), ["DATASETS.CUSTOM.Extra.CSV", "/x/extra.csv", "DATASETS.CUSTOM.Lobby.CSV", "l.csv"])
    assert {k: dict(v) for k, v in cfg.DATASETS.CUSTOM.items()} == {
        "Shop": {"ROOT": "/data/shop2", "CSV": ""}, "Lobby": {"ROOT": "", "CSV": "l.csv"},
        "Extra": {"ROOT": "", "CSV": "/x/extra.csv"}}
    dumped = tmp_path / "config.yaml"      # what train.py writes to OUTPUT_DIR and test.py loads again
    dumped.write_text(cfg.dump())
    assert load_cfg(str(dumped)) == cfg
    for opts, message in [
            (["DATASETS.CUSTOM.Shop.CSV", "x.csv"], "DATASETS.CUSTOM.Shop needs exactly one of ROOT .* got ROOT and"),
            (["DATASETS.CUSTOM.Shop.ROOT", ""], "DATASETS.CUSTOM.Shop needs exactly one of ROOT .* got neither"),
            (["DATASETS.CUSTOM.Shop.PATH", "x"], "unknown config key DATASETS.CUSTOM.Shop.PATH"),
            (["DATASETS.CUSTOM.2nd.ROOT", "x"], "'2nd' is not a usable dataset name")]:
        with pytest.raises(ConfigError, match=message) as err:
            load_cfg(str(child), opts)
        assert "\n" not in str(err.value)
    bad = tmp_path / "bad.yml"
    bad.write_text("DATASETS:\n  CUSTOM:\n    Shop: /data/shop\n")
    with pytest.raises(ConfigError, match=r"bad.yml: DATASETS.CUSTOM.Shop must be \{ROOT: folder\} or \{CSV: file\}"):
        load_cfg(str(bad))


# ----------------------------------------------------------------------------- CSV and folder rules
def test_csv_rules(tmp_path):
    """Header in any order with extra columns and a byte-order mark, blank lines, paths relative to the CSV's folder
    or absolute, pid -1 dropped, pid 0 an identity, CSV path relative to the data root; no split column: all train."""
    root = tmp_path / "data"
    images = {n: write_image(str(root / "shop" / "img" / n)) for n in ("a.jpg", "b.jpg", "c.png", "d.jpg", "e.jpg")}
    (root / "shop" / "list.csv").write_text(
        "\ufeffcamid,Path,note,pid,split\n0,img/a.jpg,x,0,train\n\n1,img/b.jpg,,0,train\n2,%s,,-1,query\n"
        "3,img/d.jpg,,7,Query\n1,img/e.jpg,y,7,gallery\n" % images["c.png"], encoding="utf-8")
    (root / "shop" / "train_only.csv").write_text("path,pid,camid\nimg/a.jpg,3,0\nimg/b.jpg,4,1\n")
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", str(root)] + custom_opts(
        {"Shop": ("CSV", "shop/list.csv"), "Plain": ("CSV", "shop/train_only.csv")}))
    shop = build_dataset("Shop", cfg=cfg)
    assert shop.train == [(images["a.jpg"], "Shop_0", "Shop_0", 0), (images["b.jpg"], "Shop_0", "Shop_1", 0)]
    assert shop.query == [(images["d.jpg"], 7, 3, 0)] and shop.gallery == [(images["e.jpg"], 7, 1, 0)]
    plain = build_dataset("Plain", cfg=cfg, domain=1)
    assert [r[1:] for r in plain.train] == [("Plain_3", "Plain_0", 1), ("Plain_4", "Plain_1", 1)]
    assert plain.query == [] and plain.gallery == []
    with pytest.raises(UserError, match=r"Plain has no query images \(.*train_only.csv has no split column, so every "
                                        "row is a training image; add a split column \(train, query or gallery\) to "
                                        "use it as a target\), so it cannot be a test set"):
        build_test_set("Plain", cfg)
    (root / "shop" / "no_query.csv").write_text("path,pid,camid,split\nimg/a.jpg,3,0,gallery\n")
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", str(root)] + custom_opts({"Split": ("CSV", "shop/no_query.csv")}))
    with pytest.raises(UserError, match=r"Split has no query images \(no row of .*no_query.csv has split query\)"):
        build_test_set("Split", cfg)


def test_folder_with_only_some_splits(tmp_path):
    """A folder used only as a source needs bounding_box_train alone; as a target the missing folder is named."""
    files = {"bounding_box_train": ["0002_c1s1_000451_03.jpg", "0000_c1s1_000001_01.jpg", "0007_c2s3_070952_01.jpg"]}
    make_market_like(str(tmp_path / "mine"), files)
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", str(tmp_path)] + custom_opts({"Mine": ("ROOT", "mine")}))
    ds = build_dataset("Mine", cfg=cfg)
    assert sorted(r[1] for r in ds.train) == ["Mine_2", "Mine_7"]   # pid 0 (distractor) out of training
    with pytest.raises(UserError, match=r"Mine has no query images \(.*mine/query is missing or holds no"):
        build_test_set("Mine", cfg)


# ----------------------------------------------------------------------------- errors, one line each
CSV_ERRORS = {
    "no header": ("img/a.jpg,1,0,train\n", r"line 1: the first line must be a header naming the columns "
                                             r"path,pid,camid\[,split\], got 'img/a.jpg,1,0,train'"),
    "header without camid": ("path,pid,split\nimg/a.jpg,1,train\n", "line 1: the first line must be a header"),
    "pid not an integer": ("path,pid,camid\nimg/a.jpg,1,0\nimg/b.jpg,p2,0\n", r"line 3: pid 'p2' is not an integer"),
    "camid not an integer": ("path,pid,camid\n\nimg/a.jpg,1,c1\n", r"line 3: camid 'c1' is not an integer"),
    "duplicate path": ("path,pid,camid\nimg/a.jpg,1,0\nimg/b.jpg,2,0\nimg/../img/a.jpg,3,1\n",
                       r"line 4: img/../img/a.jpg is listed again \(first on line 2\); list each image once"),
    "empty split": ("path,pid,camid,split\nimg/a.jpg,1,0,\n", r"line 2: split '' is not one of train, query, gallery"),
    "unknown split": ("path,pid,camid,split\nimg/a.jpg,1,0,test\n", r"line 2: split 'test' is not one of"),
    "short row": ("path,pid,camid,split\nimg/a.jpg,1,0\n", r"line 2: 3 fields where the header has 4"),
    "negative pid": ("path,pid,camid\nimg/a.jpg,-2,0\n", r"line 2: pid -2 is negative"),
    "empty path": ("path,pid,camid\n ,1,0\n", r"line 2: the path is empty"),
    "empty file": ("\n", r"list.csv is empty; it needs a header line path,pid,camid\[,split\]"),
}


@pytest.mark.parametrize("case", sorted(CSV_ERRORS))
def test_csv_errors(tmp_path, case):
    text, message = CSV_ERRORS[case]
    (tmp_path / "list.csv").write_text(text)
    cfg = load_cfg(DEMO, custom_opts({"Mine": ("CSV", tmp_path / "list.csv")}))
    with pytest.raises(UserError, match=message) as err:
        build_dataset("Mine", cfg=cfg)
    assert "\n" not in str(err.value) and str(tmp_path / "list.csv") in str(err.value)


def test_missing_folder_or_csv_names_the_layout_and_the_key(tmp_path):
    (tmp_path / "empty").mkdir()
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", str(tmp_path)] + custom_opts(
        {"Gone": ("ROOT", "gone"), "Bare": ("ROOT", "empty"), "NoList": ("CSV", "lists/none.csv")}))
    for name, missing, layout, key in [
            ("Gone", tmp_path / "gone", "{bounding_box_train,query,bounding_box_test}/PID_cCAMsS_FRAME.jpg", "ROOT"),
            ("Bare", tmp_path / "empty" / "bounding_box_train", "PID_cCAMsS_FRAME.jpg", "ROOT"),
            ("NoList", tmp_path / "lists" / "none.csv", "header path,pid,camid[,split]", "CSV")]:
        with pytest.raises(UserError) as err:
            build_dataset(name, cfg=cfg)
        msg = str(err.value)
        assert "(missing %s)" % missing in msg and layout in msg, msg
        assert "set DATASETS.CUSTOM.%s.%s" % (name, key) in msg and "\n" not in msg


def test_names_that_clash_or_are_unknown(tmp_path):
    cfg = load_cfg(DEMO, custom_opts({"Mine": ("ROOT", tmp_path), "Yours": ("ROOT", tmp_path)}))
    with pytest.raises(UserError, match=r"unknown dataset 'Mien' .*Market1501.*yours \(DATASETS.CUSTOM\): Mine, Yours"):
        build_dataset("Mien", cfg=cfg)
    cfg = load_cfg(DEMO, custom_opts({"Market1501": ("ROOT", tmp_path)}))
    with pytest.raises(UserError, match="DATASETS.CUSTOM.Market1501 has the name of a built-in dataset"):
        build_dataset("SynthA", cfg=cfg, generate=False)


def test_bad_images_stop_with_their_path_or_are_skipped_and_counted(tmp_path, caplog):
    """A truncated JPEG and a listed file that does not exist, in a CSV source and a folder target."""
    good = [write_image(str(tmp_path / "img" / ("%d.jpg" % i))) for i in range(4)]
    with open(good[0], "rb") as fh:
        data = fh.read()
    touch(str(tmp_path / "img" / "cut.jpg"), data[:len(data) // 2])
    (tmp_path / "list.csv").write_text("path,pid,camid\nimg/0.jpg,1,0\nimg/cut.jpg,1,1\nimg/1.jpg,2,0\n"
                                       "img/gone.jpg,2,1\nimg/2.jpg,3,0\n")
    files = {"query": ["0001_c1s1_000001_00.jpg"], "bounding_box_test": ["0001_c2s1_000001_00.jpg",
                                                                          "0002_c2s1_000001_00.jpg"]}
    make_market_like(str(tmp_path / "target"), files)
    cut = str(tmp_path / "target" / "bounding_box_test" / "0002_c2s1_000001_00.jpg")
    touch(cut, data[:len(data) // 2])
    opts = ["DATASETS.NAMES", "['Mine']"] + custom_opts({"Mine": ("CSV", tmp_path / "list.csv"),
                                                          "Target": ("ROOT", tmp_path / "target")})
    with pytest.raises(UserError, match=r"cannot read image .*img/cut.jpg \(listed in .*list.csv line 3\): truncated "
                                        "JPEG.*DATASETS.ON_BAD_IMAGE skip"):
        build_train_set(load_cfg(DEMO, opts))
    (tmp_path / "gone.csv").write_text("path,pid,camid\nimg/0.jpg,1,0\n\nimg/gone.jpg,2,1\n")
    with pytest.raises(UserError, match=r"cannot read image .*img/gone.jpg \(listed in .*gone.csv line 4\): No such "):
        build_train_set(load_cfg(DEMO, ["DATASETS.NAMES", "['Gone']"] + custom_opts({"Gone": ("CSV", tmp_path /
                                                                                             "gone.csv")})))
    with pytest.raises(UserError, match=r"cannot read image .*0002_c2s1_000001_00.jpg: truncated JPEG"):
        build_test_set("Target", load_cfg(DEMO, opts))
    skip = load_cfg(DEMO, opts + ["DATASETS.ON_BAD_IMAGE", "skip"])
    with caplog.at_level(logging.WARNING):
        train_set = build_train_set(skip)
    assert train_set.num_bad == 2 and len(train_set) == 3 and train_set.num_classes == [3]
    assert "gone.jpg (listed in %s line 5)" % (tmp_path / "list.csv") in caplog.text and "cut.jpg" in caplog.text
    query, gallery = build_test_set("Target", skip)
    assert len(query) == 1 and [os.path.basename(r[0]) for r in gallery] == ["0001_c2s1_000001_00.jpg"]
