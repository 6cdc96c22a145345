"""Dataset loaders on miniature trees written in the real layouts and names (junk files, pid -1, pid 0),
root resolution, relabelling across domains, combineall, and bad-image handling."""
import logging
import os

import numpy as np
import pytest

from compat.errors import UserError
from reid.config.config import get_cfg
from reid.data.common import MultiDomainTrainSet, natural_key, read_image, verify_images
from reid.data.datasets import (DATASET_REGISTRY, build_dataset, build_test_set, build_train_set, resolve_root)


def write_image(path, color=(10, 120, 250), size=(16, 8)):
    """A small valid image (JPEG or PNG by extension) of one RGB colour."""
    import cv2
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img = np.zeros(size + (3,), np.uint8)
    img[:] = color[::-1]  # cv2 writes BGR
    ok, buf = cv2.imencode(os.path.splitext(path)[1], img)
    assert ok
    buf.tofile(path)
    return path


def touch(path, data=b"junk"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


MARKET_FILES = {
    "bounding_box_train": ["0002_c1s1_000451_03.jpg", "0002_c3s1_000551_01.jpg", "0007_c2s3_070952_01.jpg",
                           "0007_c2s3_071002_02.jpg", "1500_c6s3_086542_02.jpg",
                           "0000_c1s1_000001_01.jpg"],        # a distractor in train: left out of training
    "query": ["0002_c1s1_001051_00.jpg", "0007_c2s3_071052_00.jpg", "1500_c6s3_086567_00.jpg"],
    "bounding_box_test": ["0002_c3s1_000601_01.jpg", "0002_c1s1_000801_01.jpg", "0007_c4s3_071100_01.jpg",
                          "0000_c1s1_000151_01.jpg", "0000_c3s1_000202_04.jpg", "-1_c2s1_000301_01.jpg",
                          "-1_c6s1_000401_02.jpg"],
}
JUNK = ["Thumbs.db", "readme.txt", ".DS_Store", "._0002_c1s1_000451_03.jpg"]


def make_market_like(base, files=MARKET_FILES, ext=None):
    for sub, names in files.items():
        for name in names:
            if ext:
                name = os.path.splitext(name)[0] + ext
            write_image(os.path.join(base, sub, name))
        for junk in JUNK:
            touch(os.path.join(base, sub, junk))
    return base


def make_market(root):
    return make_market_like(os.path.join(str(root), "market1501", "Market-1501-v15.09.15"))


def names(records):
    return sorted((os.path.basename(r[0]), r[1], r[2], r[3]) for r in records)


def test_market1501_records(tmp_path, caplog):
    make_market(tmp_path)
    write_image(str(tmp_path / "market1501/Market-1501-v15.09.15/bounding_box_train/frame.jpg"))  # off-pattern
    with caplog.at_level(logging.WARNING):
        ds = build_dataset("Market1501", root=str(tmp_path))
    assert "frame.jpg" in caplog.text
    assert names(ds.train) == [
        ("0002_c1s1_000451_03.jpg", "Market1501_2", "Market1501_0", 0),
        ("0002_c3s1_000551_01.jpg", "Market1501_2", "Market1501_2", 0),
        ("0007_c2s3_070952_01.jpg", "Market1501_7", "Market1501_1", 0),
        ("0007_c2s3_071002_02.jpg", "Market1501_7", "Market1501_1", 0),
        ("1500_c6s3_086542_02.jpg", "Market1501_1500", "Market1501_5", 0)]
    assert names(ds.query) == [("0002_c1s1_001051_00.jpg", 2, 0, 0), ("0007_c2s3_071052_00.jpg", 7, 1, 0),
                               ("1500_c6s3_086567_00.jpg", 1500, 5, 0)]
    gallery = names(ds.gallery)
    assert [g[1] for g in gallery] == [0, 0, 2, 2, 7]            # pid 0 kept, pid -1 dropped
    assert ("0000_c3s1_000202_04.jpg", 0, 2, 0) in gallery
    assert all(os.path.isfile(r[0]) for r in ds.train + ds.query + ds.gallery)


def test_market1501_alternative_root_layout(tmp_path):
    make_market_like(str(tmp_path / "Market-1501-v15.09.15"))
    ds = build_dataset("Market1501", root=str(tmp_path), domain=2)
    assert len(ds.train) == 5 and len(ds.query) == 3 and len(ds.gallery) == 5
    assert {r[3] for r in ds.train + ds.query} == {2}


def test_market1501_combineall(tmp_path):
    make_market(tmp_path)
    ds = build_dataset("Market1501", root=str(tmp_path), combineall=True)
    extra = [r for r in ds.train if "_test_" in r[1]]
    # query + gallery without pid 0 and -1: 3 + 3 images of test ids 2, 7, 1500
    assert sorted({r[1] for r in extra}) == ["Market1501_test_1500", "Market1501_test_2", "Market1501_test_7"]
    assert len(extra) == 6 and len(ds.train) == 11
    assert ("Market1501_test_7" in {r[1] for r in extra}) and all(r[2].startswith("Market1501_test_") for r in extra)


def make_msmt(root, version="MSMT17_V1"):
    train_dir, test_dir = {"MSMT17_V1": ("train", "test"), "MSMT17_V2": ("mask_train_v2", "mask_test_v2")}[version]
    main = os.path.join(str(root), "msmt17", version)
    lists = {
        ("list_train.txt", train_dir): [("0000/0000_000_01_0303morning_0015_0.jpg", 0),
                                        ("0000/0000_001_05_0303morning_0016_1.jpg", 0),
                                        ("1040/1040_003_14_0113noon_0850_0.jpg", 1040)],
        ("list_val.txt", train_dir): [("0000/0000_005_09_0303afternoon_0101_0.jpg", 0)],
        ("list_query.txt", test_dir): [("0000/0000_000_12_0302noon_0010_0.jpg", 0)],
        ("list_gallery.txt", test_dir): [("0000/0000_002_03_0302noon_0200_1.jpg", 0),
                                         ("0005/0005_000_15_0302morning_0077_0.jpg", 5)],
    }
    for (list_name, folder), entries in lists.items():
        for rel, _ in entries:
            write_image(os.path.join(main, folder, rel))
        touch(os.path.join(main, list_name),
              ("".join("%s %d\n" % e for e in entries) + "\n").encode())  # trailing blank line as in the release
    return main


def test_msmt17_v1_and_v2(tmp_path):
    make_msmt(tmp_path / "v1", "MSMT17_V1")
    ds = build_dataset("MSMT17", root=str(tmp_path / "v1"))
    assert names(ds.train) == [("0000_000_01_0303morning_0015_0.jpg", "MSMT17_0", "MSMT17_0", 0),
                               ("0000_001_05_0303morning_0016_1.jpg", "MSMT17_0", "MSMT17_4", 0),
                               ("1040_003_14_0113noon_0850_0.jpg", "MSMT17_1040", "MSMT17_13", 0)]
    assert names(ds.query) == [("0000_000_12_0302noon_0010_0.jpg", 0, 11, 0)]
    assert names(ds.gallery) == [("0000_002_03_0302noon_0200_1.jpg", 0, 2, 0),
                                 ("0005_000_15_0302morning_0077_0.jpg", 5, 14, 0)]
    assert ds.train[0][0].endswith(os.path.join("MSMT17_V1", "train", "0000", "0000_000_01_0303morning_0015_0.jpg"))
    combined = build_dataset("MSMT17", root=str(tmp_path / "v1"), combineall=True)
    # val (training ids) + query/gallery as new test ids
    assert len(combined.train) == 3 + 1 + 3
    assert {r[1] for r in combined.train} == {"MSMT17_0", "MSMT17_1040", "MSMT17_test_0", "MSMT17_test_5"}

    make_msmt(tmp_path / "v2", "MSMT17_V2")
    v2 = build_dataset("MSMT17", root=str(tmp_path / "v2"))
    assert len(v2.train) == 3 and "mask_train_v2" in v2.train[0][0]
    make_msmt(tmp_path / "v2", "MSMT17_V1")  # both present: V1 wins
    assert "MSMT17_V1" in build_dataset("MSMT17", root=str(tmp_path / "v2")).train[0][0]


def test_msmt17_bad_list_line(tmp_path):
    main = make_msmt(tmp_path)
    with open(os.path.join(main, "list_train.txt"), "a") as fh:
        fh.write("0001/broken.jpg\n")
    with pytest.raises(UserError, match=r"list_train.txt line 5"):
        build_dataset("MSMT17", root=str(tmp_path))


def make_cuhk03(root):
    for subset, pids in (("labeled", (1, 3)), ("detected", (1, 2, 4))):
        files = {"bounding_box_train": ["%04d_c%d_%d.png" % (p, c, i) for p in pids for c in (1, 2) for i in (1, 2)],
                 "query": ["0101_c1_1.png", "0102_c2_6.png"],
                 "bounding_box_test": ["0101_c2_7.png", "0102_c1_2.png", "0103_c1_3.png"]}
        make_market_like(os.path.join(str(root), "cuhk03-np", subset), files)


def test_cuhk03_labeled_and_detected(tmp_path):
    make_cuhk03(tmp_path)
    labeled = build_dataset("CUHK03", root=str(tmp_path))
    assert sorted({r[1] for r in labeled.train}) == ["CUHK03_1", "CUHK03_3"] and len(labeled.train) == 8
    assert {r[2] for r in labeled.train} == {"CUHK03_0", "CUHK03_1"}
    assert names(labeled.query) == [("0101_c1_1.png", 101, 0, 0), ("0102_c2_6.png", 102, 1, 0)]
    assert "labeled" in labeled.train[0][0]
    cfg = get_cfg()
    cfg.DATASETS.CUHK03_LABELED = False
    detected = build_dataset("CUHK03", root=str(tmp_path), cfg=cfg)
    assert sorted({r[1] for r in detected.train}) == ["CUHK03_1", "CUHK03_2", "CUHK03_4"]
    assert all(os.sep + "detected" + os.sep in r[0] for r in detected.train + detected.gallery)
    # CUHK03-NP has one split; another DATASETS.CUHK03_SPLIT is an error, not silently split 0
    cfg.DATASETS.CUHK03_SPLIT = 1
    with pytest.raises(UserError, match="CUHK03_SPLIT 1 is not supported.*use DATASETS.CUHK03_SPLIT 0"):
        build_dataset("CUHK03", root=str(tmp_path), cfg=cfg)


def test_cuhksysu_train_only(tmp_path):
    base = tmp_path / "cuhksysu" / "cropped_images"
    for name in ("p1_s1.jpg", "p1_s27.jpg", "p25_s3.jpg", "p11934_s17000.jpg"):
        write_image(str(base / name))
    touch(str(base / "Thumbs.db"))
    ds = build_dataset("CUHKSYSU", root=str(tmp_path))
    assert names(ds.train) == [("p11934_s17000.jpg", "CUHKSYSU_p11934", "CUHKSYSU_0", 0),
                               ("p1_s1.jpg", "CUHKSYSU_p1", "CUHKSYSU_0", 0),
                               ("p1_s27.jpg", "CUHKSYSU_p1", "CUHKSYSU_0", 0),
                               ("p25_s3.jpg", "CUHKSYSU_p25", "CUHKSYSU_0", 0)]
    assert ds.query == [] and ds.gallery == []
    with pytest.raises(UserError, match="cannot be a test set"):
        build_test_set("CUHKSYSU", root=str(tmp_path))


def test_synthetic_domains_share_the_market_parser(tmp_path):
    for name in ("SynthA", "SynthC"):
        make_market_like(str(tmp_path / "synthetic" / name))
    a = build_dataset("SynthA", root=str(tmp_path), generate=False)
    c = build_dataset("SynthC", root=str(tmp_path), generate=False)
    assert len(a.train) == 5 and {r[1] for r in a.train} == {"SynthA_2", "SynthA_7", "SynthA_1500"}
    assert {r[1] for r in c.train} == {"SynthC_2", "SynthC_7", "SynthC_1500"}
    assert [g[1] for g in names(a.gallery)] == [0, 0, 2, 2, 7]
    with pytest.raises(UserError, match=r"synthetic/SynthX"):
        build_dataset("SynthB", root=str(tmp_path), generate=False)


def test_synthetic_domain_asks_the_generator(tmp_path, monkeypatch):
    import reid.data.synthetic as generator
    calls = []

    def fake_ensure(root, seed=0, num_ids=300, domains=None, **kwargs):
        calls.append((root, seed, num_ids, list(domains)))
        for d in domains:
            make_market_like(os.path.join(root, d))
        return root

    monkeypatch.setattr(generator, "ensure_synthetic", fake_ensure)
    cfg = get_cfg()
    cfg.DATASETS.SYNTHETIC.SEED, cfg.DATASETS.SYNTHETIC.NUM_IDS = 5, 40
    ds = build_dataset("SynthD", root=str(tmp_path), cfg=cfg)
    assert calls == [(str(tmp_path / "synthetic"), 5, 40, ["SynthD"])]
    assert len(ds.train) == 5 and ds.train[0][1].startswith("SynthD_")


@pytest.mark.parametrize("name, expected", [("Market1501", "Market-1501-v15.09.15"), ("MSMT17", "MSMT17_V1"),
                                            ("CUHK03", "cuhk03-np"), ("CUHKSYSU", "cropped_images")])
def test_missing_folders_name_the_layout(tmp_path, name, expected):
    with pytest.raises(UserError) as err:
        build_dataset(name, root=str(tmp_path))
    msg = str(err.value)
    assert expected in msg and "DATASETS.ROOT" in msg and "REID_DATA" in msg and str(tmp_path) in msg
    assert "\n" not in msg


def test_partial_market_tree_names_the_missing_subfolder(tmp_path):
    base = tmp_path / "market1501" / "Market-1501-v15.09.15"
    write_image(str(base / "bounding_box_train" / "0002_c1s1_000451_03.jpg"))
    with pytest.raises(UserError, match="query"):
        build_dataset("Market1501", root=str(tmp_path))


def test_root_resolution_order(tmp_path, monkeypatch):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(tmp_path / "from_cfg")
    monkeypatch.setenv("REID_DATA", str(tmp_path / "from_env"))
    assert resolve_root(str(tmp_path / "explicit"), cfg) == str(tmp_path / "explicit")
    assert resolve_root(None, cfg) == str(tmp_path / "from_env")
    monkeypatch.delenv("REID_DATA")
    assert resolve_root(None, cfg) == str(tmp_path / "from_cfg")
    assert resolve_root(None, None) == os.path.abspath("datasets")


def test_registry():
    assert {"Market1501", "MSMT17", "CUHK03", "CUHKSYSU", "SynthA", "SynthB", "SynthC", "SynthD"} <= set(
        DATASET_REGISTRY.names())
    with pytest.raises(UserError, match="unknown dataset 'Market'.*Market1501"):
        build_dataset("Market", root="/nonexistent")
    with pytest.raises(UserError, match="does not take option"):
        build_dataset("Market1501", root="/nonexistent", bogus=1)


def test_relabel_across_domains(tmp_path):
    make_market(tmp_path)
    make_msmt(tmp_path)
    base = tmp_path / "cuhksysu" / "cropped_images"
    for name in ("p1_s1.jpg", "p10_s2.jpg", "p2_s3.jpg", "p2_s4.jpg"):
        write_image(str(base / name))
    sources = [build_dataset(n, root=str(tmp_path)) for n in ("CUHKSYSU", "Market1501", "MSMT17")]
    ts = MultiDomainTrainSet(sources, ["CUHKSYSU", "Market1501", "MSMT17"])
    assert ts.num_classes == [3, 3, 2] and ts.offsets == [0, 3, 6] and ts.total_classes == 8
    assert len(ts) == 4 + 5 + 3
    pids = np.array([r[1] for r in ts.records])
    domains = np.array([r[3] for r in ts.records])
    assert sorted(set(pids.tolist())) == list(range(8))
    for d in range(3):  # each domain's ids are the contiguous block [offset, offset + n)
        assert set(pids[domains == d].tolist()) == set(range(ts.offsets[d], ts.offsets[d] + ts.num_classes[d]))
    # natural order inside a domain: p1 < p2 < p10, 2 < 7 < 1500
    assert [ts.pid_maps[0][k] for k in ("CUHKSYSU_p1", "CUHKSYSU_p2", "CUHKSYSU_p10")] == [0, 1, 2]
    assert [ts.pid_maps[1][k] for k in ("Market1501_2", "Market1501_7", "Market1501_1500")] == [3, 4, 5]
    # cameras: global and contiguous, domain by domain (1 + 4 + 3 cameras)
    cams = np.array([r[2] for r in ts.records])
    assert ts.num_cameras == 8 and sorted(set(cams.tolist())) == list(range(8))
    assert set(cams[domains == 0].tolist()) == {0} and set(cams[domains == 1].tolist()) == {1, 2, 3, 4}
    # each record keeps its image and its original identity
    for (path, pid, _, d), src in zip(ts.records, [r for s in sources for r in s.train]):
        assert path == src[0] and ts.pid_maps[d][src[1]] == pid
    assert "Market1501" in ts.summary()


def test_natural_key_orders_numbers_numerically():
    assert sorted(["M_10", "M_2", "M_test_1", "M_1"], key=natural_key) == ["M_1", "M_2", "M_10", "M_test_1"]


def test_empty_source_is_an_error():
    with pytest.raises(UserError, match="no training images"):
        MultiDomainTrainSet([[]], ["Empty"])


# ----------------------------------------------------------------------------- bad images
def make_bad_images(folder):
    good = write_image(os.path.join(folder, "good.png"), color=(255, 0, 0))
    jpg = write_image(os.path.join(folder, "whole.jpg"))
    with open(jpg, "rb") as fh:
        data = fh.read()
    bad = {"truncated.jpg": data[:len(data) // 2], "garbage.jpg": b"this is not an image" * 10,
           "empty.jpg": b"", "fake_tail.jpg": data[:4] + b"\x00" * 300 + b"\xff\xd9"}
    for name, payload in bad.items():
        touch(os.path.join(folder, name), payload)
    return good, jpg, {name: os.path.join(folder, name) for name in bad}


def test_read_image_rgb_and_errors(tmp_path):
    good, jpg, bad = make_bad_images(str(tmp_path))
    img = read_image(good)
    assert img.dtype == np.uint8 and img.shape == (16, 8, 3)
    assert (img == np.array([255, 0, 0], np.uint8)).all()  # RGB order, lossless PNG
    assert read_image(jpg).shape == (16, 8, 3)
    for name, path in list(bad.items()) + [("missing.jpg", str(tmp_path / "missing.jpg"))]:
        with pytest.raises(UserError) as err:
            read_image(path)
        assert path in str(err.value) and "DATASETS.ON_BAD_IMAGE skip" in str(err.value), name
        assert read_image(path, on_bad="skip") is None
    with pytest.raises(UserError, match="ON_BAD_IMAGE"):
        read_image(good, on_bad="ignore")


def test_verify_images_stop_and_skip(tmp_path, caplog):
    good, jpg, bad = make_bad_images(str(tmp_path))
    records = [(good, 1, 0, 0), (bad["truncated.jpg"], 1, 0, 0), (jpg, 2, 0, 0), (bad["garbage.jpg"], 3, 1, 0),
               (bad["empty.jpg"], 3, 1, 0), (str(tmp_path / "gone.jpg"), 4, 0, 0), (bad["fake_tail.jpg"], 5, 0, 0)]
    with pytest.raises(UserError, match="truncated.jpg"):
        verify_images(records, "stop")
    with caplog.at_level(logging.WARNING):
        kept, num_bad = verify_images(records, "skip")
    # the header check passes fake_tail.jpg (JPEG magic and end marker); a full decode does not
    assert [r[0] for r in kept] == [good, jpg, bad["fake_tail.jpg"]] and num_bad == 4
    assert "gone.jpg" in caplog.text
    kept, num_bad = verify_images(records, "skip", full_decode=True)
    assert [r[0] for r in kept] == [good, jpg] and num_bad == 5


def test_build_train_set_skips_or_stops_on_bad_images(tmp_path):
    make_market(tmp_path)
    base = tmp_path / "cuhksysu" / "cropped_images"
    write_image(str(base / "p1_s1.jpg"))
    touch(str(base / "p2_s2.jpg"), b"\xff\xd8\xff\xe0 cut")   # p2's only image is corrupt
    cfg = get_cfg()
    cfg.DATASETS.NAMES = ["CUHKSYSU", "Market1501"]
    cfg.DATASETS.ON_BAD_IMAGE = "skip"
    ts = build_train_set(cfg, root=str(tmp_path))
    assert ts.num_bad == 1 and ts.num_classes == [1, 3] and len(ts) == 1 + 5
    cfg.DATASETS.ON_BAD_IMAGE = "stop"
    with pytest.raises(UserError, match="p2_s2.jpg"):
        build_train_set(cfg, root=str(tmp_path))
    query, gallery = build_test_set("Market1501", cfg, root=str(tmp_path))
    assert len(query) == 3 and len(gallery) == 5
