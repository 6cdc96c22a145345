"""The index and search tools (tools/index.py, tools/search.py) and what they stand on: top-k search against a
brute-force reference (and faiss's flat index), the round trip on the synthetic target against test.py's Rank-1,
incremental and atomic index writes, and every bad input a one-line error or a counted skip.

Backend-neutral but for the extraction (tests/test_retrieval.py compares that on every engine): demo-size
networks, op by op, on the synthetic target's 21 query and 69 gallery images."""
import importlib.util
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from compat.errors import UserError
from tests.crossenv import PYTHONS, ROOT, active_backend, require_backend
from tests.test_retrieval import DEMO, _one_torch_thread, make_weights, one_torch_thread, opts_for  # noqa: F401


@pytest.fixture(scope="module")
def world(retrieval_world):
    """retrieval_world plus the demo ACL network's weights ("acl"), calibrated the same way."""
    root = retrieval_world["root"]
    if not os.path.exists(str(root / "acl.pth")):
        with one_torch_thread():
            make_weights(root / "acl.pth", calibrate_on=retrieval_world["train"])
    return dict(retrieval_world, acl=str(root / "acl.pth"))


def tool(name):
    """tools/<name>.py as a module (its main(argv) runs in this process)."""
    spec = importlib.util.spec_from_file_location("tool_" + name, str(ROOT / "tools" / (name + ".py")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ search
def brute_force(queries, gallery, k, exclude=None):
    """Reference: every score (float64), excluded items removed, a stable sort by (score desc, index).
    [(top-k indices, their scores, the whole row of scores with excluded items at -inf)] per query."""
    scores = queries.astype(np.float64) @ np.asarray(gallery, np.float64).T
    out = []
    for q in range(len(queries)):
        row = scores[q].copy()
        if exclude is not None:
            row[exclude(q, q + 1, 0, len(gallery))[0]] = -np.inf
        order = np.lexsort((np.arange(len(row)), -row))
        order = order[np.isfinite(row[order])][:k]
        out.append((order, row[order], row))
    return out


def assert_same_lists(indices, values, reference, tie=1e-6):
    """Same order up to exact ties: the scores agree rank for rank, each group of tied reference scores holds
    the same items, and where the list ends inside such a group its items come from that group."""
    for q, (order, want, row) in enumerate(reference):
        got = indices[q][indices[q] >= 0]
        assert len(got) == len(order), q
        assert np.allclose(values[q][:len(got)], want, atol=tie), q
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and abs(want[stop] - want[start]) <= tie:
                stop += 1
            group = set(np.flatnonzero(np.abs(row - want[start]) <= tie))
            assert set(got[start:stop]) <= group, (q, start)
            if len(group) == stop - start:
                assert set(got[start:stop]) == set(order[start:stop]), (q, start)
            start = stop


def planted(num_queries=37, num_gallery=1000, dim=48, seed=0):
    """Unit vectors; every query has near-duplicates in the gallery; some gallery rows repeat (exact ties)."""
    from reid.evaluation.distance import normalize
    rng = np.random.default_rng(seed)
    gallery = rng.standard_normal((num_gallery, dim)).astype(np.float32)
    queries = rng.standard_normal((num_queries, dim)).astype(np.float32)
    for q in range(num_queries):
        rows = rng.choice(num_gallery, 5, replace=False)
        gallery[rows] = queries[q] + rng.standard_normal((5, dim)).astype(np.float32) * np.float32(0.3)
    gallery[500:510] = gallery[rows[0]]          # exact duplicates of one near-duplicate: tied scores
    return normalize(queries), normalize(gallery), rng


def test_exact_search_equals_brute_force():
    """Blocked exact search (gallery blocks of 7 to 1000 rows, float32 and float16 storage, both filters) gives
    the brute-force lists; a filtered query with fewer than k items left is padded with -1."""
    from reid.deploy.gallery import UNKNOWN
    from reid.deploy.search import exact_search, exclusion
    queries, gallery, rng = planted()
    q_pids, q_cams = rng.integers(0, 5, len(queries)), rng.integers(0, 3, len(queries))
    g_pids, g_cams = rng.integers(-1, 5, len(gallery)), rng.integers(0, 3, len(gallery))
    q_cams[0], g_cams[:20] = UNKNOWN, UNKNOWN
    for mode in ("none", "camera", "protocol"):
        exclude = exclusion(mode, q_pids, q_cams, g_pids, g_cams)
        reference = brute_force(queries, gallery, 15, exclude)
        for block in (7 * 37, 1 << 24):
            idx, scores = exact_search(queries, gallery, 15, exclude, block_elements=block)
            assert idx.shape == (37, 15) and scores.dtype == np.float32
            assert_same_lists(idx, scores, reference)
    half = gallery.astype(np.float16)
    idx, scores = exact_search(queries, half, 10)
    assert_same_lists(idx, scores, brute_force(queries, half.astype(np.float32), 10), tie=1e-6)
    idx, scores = exact_search(queries[:2], gallery[:3], 10, exclusion("camera", [0, 1], [0, 1], [0, 0, 0],
                                                                        [0, 1, 0]))
    assert idx[0].tolist() == [1, -1, -1] and sorted(idx[1][:2]) == [0, 2] and idx[1][2] == -1
    assert np.isinf(scores[0, 1:]).all() and np.isfinite(scores[1, :2]).all()


def test_faiss_flat_gives_the_exact_lists_and_ivf_finds_the_planted_neighbours():
    pytest.importorskip("faiss")
    from reid.deploy.search import build_faiss, exact_search, exclusion, faiss_search
    queries, gallery, rng = planted()
    cams = rng.integers(0, 3, len(gallery))
    for exclude in (None, exclusion("camera", np.zeros(len(queries), np.int64), rng.integers(0, 3, len(queries)),
                                    np.zeros(len(gallery), np.int64), cams)):
        got = faiss_search(build_faiss(gallery, "faiss-flat"), queries, 10, exclude)
        assert_same_lists(got[0], got[1], brute_force(queries, gallery, 10, exclude), tie=1e-5)
    ivf = build_faiss(gallery, "faiss-ivf", nlist=8)
    got = faiss_search(ivf, queries, 5, nprobe=8)[0]          # every cluster searched: exact
    assert np.array_equal(np.sort(got, 1), np.sort(exact_search(queries, gallery, 5)[0], 1))


def test_rerank_and_query_expansion_rank_as_test_py_does():
    """rank_gallery's re-ranked and query-expanded lists are the orders of the distance matrices test.py's
    evaluation computes with the same options (reid.evaluation.evaluate_features), camera filter applied."""
    from reid.deploy.search import exclusion, rank_gallery
    from reid.evaluation import evaluate_features
    queries, gallery, rng = planted(num_queries=9, num_gallery=60, dim=16, seed=3)
    q_ids, g_ids = rng.integers(0, 4, 9), rng.integers(0, 4, 60)
    q_cams, g_cams = rng.integers(0, 3, 9), rng.integers(0, 3, 60)
    rerank = dict(k1=6, k2=3, lambda_value=0.3)
    aqe = dict(qe_times=1, qe_k=3, alpha=3.0)
    for options in ({"rerank": rerank}, {"aqe": aqe}, {"rerank": rerank, "aqe": aqe}):
        _, distmat = evaluate_features(queries, gallery, q_ids, g_ids, q_cams, g_cams, return_distmat=True, **options)
        exclude = exclusion("camera", q_ids, q_cams, g_ids, g_cams)
        got = rank_gallery(queries, gallery, 60, exclude, **options)
        assert got["value"] == ("distance" if "rerank" in options else "score")
        values = got["values"] if "rerank" in options else 1.0 - got["values"]
        for q in range(9):
            keep = np.flatnonzero(g_cams != q_cams[q])
            want = keep[np.lexsort((keep, distmat[q, keep]))]
            row = got["indices"][q][got["indices"][q] >= 0]
            assert np.allclose(values[q][:len(row)], distmat[q, want], atol=1e-5), options
            assert np.array_equal(row, want) or np.allclose(distmat[q, row], distmat[q, want], atol=1e-6), options


def test_search_without_faiss_is_one_line(monkeypatch):
    import builtins
    from reid.deploy.search import import_faiss
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "faiss" else real(name, *a, **k))
    with pytest.raises(UserError, match="faiss is not installed; pip install faiss-cpu==1.8.0.post1"):
        import_faiss()


# --------------------------------------------------------------------------------------------- the tools
@pytest.fixture(scope="module")
def acl_index(world):
    """tools/index.py on the plain gallery folder with the demo ACL weights (eager)."""
    path = str(world["root"] / "gallery.npz")
    tool("index").main(["--gallery", world["gallery"], "--output", path, "--config-file", DEMO, "--engine", "eager",
                        "--no-progress"] + opts_for(world, "acl"))
    return path


def test_round_trip_rank1_equals_test_py(world, acl_index, capsys):
    """The synthetic target as a plain folder tree, indexed and searched with test.py's protocol filter: Rank-1
    from the file names equals test.py's Rank-1 for the same weights; the lists are JSON and CSV; --vis draws."""
    from reid.config import load_cfg
    from reid.deploy.gallery import load_index
    from reid.engine.launch import test
    index = load_index(acl_index)
    assert len(index) == 69 and index.features.dtype == np.float32 and (index.camids >= 0).all()
    assert index.paths == sorted(os.listdir(world["gallery"])) and index.model["engine"] == "eager"
    assert -1 in index.pids.tolist()          # junk images are indexed; the protocol filter leaves them out
    out = str(world["root"] / "results.json")
    tool("search").main(["--index", acl_index, "--query", world["query"], "--topk", "69", "--filter", "protocol",
                         "--output", out, "--vis", str(world["root"] / "vis"), "--vis-count", "2", "--engine", "eager",
                         "--no-progress"])
    printed = capsys.readouterr().out
    results = json.load(open(out))
    assert len(results) == 21 and set(results[0]) == {"query", "matches", "pid", "camid"}
    names = lambda p: os.path.basename(p).split("_")   # noqa: E731
    hits = counted = 0
    for row in results:
        q_pid, q_cam = names(row["query"])[0], names(row["query"])[1][:2]
        gallery = [names(m["path"]) for m in row["matches"]]
        assert not any(g[0] == q_pid and g[1][:2] == q_cam for g in gallery)
        assert [m["score"] for m in row["matches"]] == sorted((m["score"] for m in row["matches"]), reverse=True)
        if any(g[0] == q_pid for g in gallery):
            counted += 1
            hits += gallery[0][0] == q_pid
    cfg = load_cfg(DEMO, opts_for(world, "acl", ["TEST.JIT", "False", "OUTPUT_DIR", str(world["root"] / "test")]))
    expected = test(cfg)["SynthD"]["Rank-1"]
    assert counted >= 15 and 100.0 * hits / counted == pytest.approx(expected, abs=1e-9)
    assert "Rank-1 from the file names: %.1f%%" % expected in printed
    lines = open(out[:-5] + ".csv").read().splitlines()
    assert lines[0] == "query,rank,path,score" and len(lines) == 1 + sum(len(r["matches"]) for r in results)
    import cv2
    pngs = sorted(os.listdir(str(world["root"] / "vis")))
    assert [p[:11] for p in pngs] == ["rank_00000_", "rank_00001_"]      # the first two queries
    assert cv2.imread(str(world["root"] / "vis" / pngs[0])).shape[1] > 64 * 10
    assert "2 rank lists written to %s: queries 0-1 (the first 2; --vis-queries picks others)" % (
        world["root"] / "vis") in printed
    assert "21 queries searched in 69 gallery images (exact, filter protocol)" in printed


def test_incremental_index_equals_a_fresh_one(world, acl_index, tmp_path):
    """Add, change and remove a file: the update extracts two images, drops one, and equals a fresh index."""
    from reid.deploy import FeatureExtractor
    from reid.deploy.gallery import build_index, load_index, save_index
    folder = tmp_path / "g"
    shutil.copytree(world["gallery"], str(folder / "cam"))
    names = sorted(os.listdir(str(folder / "cam")))
    for name in names[12:]:
        os.remove(str(folder / "cam" / name))
    extractor = FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager")
    first, _ = build_index(extractor, str(folder))
    save_index(first, str(tmp_path / "g.npz"))
    shutil.copy(os.path.join(world["gallery"], names[20]), str(folder / "cam" / names[20]))        # added
    shutil.copy(os.path.join(world["gallery"], names[30]), str(folder / "cam" / names[3]))         # changed
    os.utime(str(folder / "cam" / names[3]), ns=(1, 1))
    os.remove(str(folder / "cam" / names[5]))                                                       # removed
    updated, report = build_index(extractor, str(folder), previous=load_index(str(tmp_path / "g.npz")))
    assert (report["extracted"], report["changed"], report["reused"], report["removed"]) == (2, 1, 10, 1)
    fresh, _ = build_index(extractor, str(folder))
    assert updated.paths == fresh.paths and len(fresh) == 12 and "cam/" + names[20] in fresh.paths
    for key in ("pids", "camids", "sizes", "mtimes"):
        assert np.array_equal(getattr(updated, key), getattr(fresh, key)), key
    assert np.abs(updated.features - fresh.features).max() <= 1e-5     # batches of other images: rounding
    row = fresh.paths.index("cam/" + names[3])
    assert np.abs(fresh.features[row] - first.features[3]).max() > 1e-3     # really re-extracted
    half, _ = build_index(extractor, str(folder), previous=updated, dtype="float16")
    assert half.features.dtype == np.float16 and np.abs(half.features - fresh.features).max() < 1e-3


def test_interrupted_index_write_leaves_the_old_index(world, acl_index, tmp_path, monkeypatch):
    from reid.deploy.gallery import load_index, save_index
    path = str(tmp_path / "g.npz")
    shutil.copy(acl_index, path)
    old = load_index(path)
    real = np.savez

    def interrupted(fh, **arrays):
        real(fh, **{k: arrays[k] for k in list(arrays)[:2]})
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_index(old, path)
    monkeypatch.undo()
    again = load_index(path)
    assert again.paths == old.paths and np.array_equal(again.features, old.features)
    assert os.listdir(str(tmp_path)) == ["g.npz"]


def test_bad_images_are_converted_skipped_or_refused(world, tmp_path):
    """Grayscale, RGBA and 16-bit PNGs are converted (the features of the 8-bit RGB image), a tiny image is
    upscaled, a truncated JPEG and a file with an image suffix that is not one are skipped and counted (or
    refused with --strict), non-image files are counted; an empty folder is an error."""
    import cv2
    from reid.deploy import FeatureExtractor
    from reid.deploy.gallery import build_index
    extractor = FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager")
    gray = (np.arange(64 * 32).reshape(64, 32) % 251).astype(np.uint8)
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    cv2.imwrite(str(folder / "gray.png"), gray)
    cv2.imwrite(str(folder / "gray16.png"), gray.astype(np.uint16) * 257)
    cv2.imwrite(str(folder / "rgba.png"), np.dstack([gray, gray, gray, np.full_like(gray, 7)]))
    cv2.imwrite(str(folder / "sub" / "tiny.png"), np.full((2, 1, 3), 90, np.uint8))
    jpeg = open(os.path.join(world["gallery"], sorted(os.listdir(world["gallery"]))[0]), "rb").read()
    (folder / "sub" / "cut.jpg").write_bytes(jpeg[:len(jpeg) // 2])
    (folder / "notes.jpg").write_text("not an image")
    (folder / "readme.txt").write_text("hello")
    index, report = build_index(extractor, str(folder))
    assert index.paths == ["gray.png", "gray16.png", "rgba.png", "sub/tiny.png"]
    assert report["non_images"] == ["readme.txt"]
    assert sorted(p for p, _ in report["skipped"]) == ["notes.jpg", "sub/cut.jpg"]
    assert "truncated JPEG" in dict(report["skipped"])["sub/cut.jpg"]
    assert index.meta["skipped"] == [list(s) for s in report["skipped"]]
    expected = extractor(np.dstack([gray] * 3))[0]
    for row in range(3):
        assert np.abs(index.features[row] - expected).max() <= 1e-5      # batch of 4 against 1: rounding
    assert np.isfinite(index.features[3]).all()
    with pytest.raises(UserError, match=r"1 file\(s\) that are not images \(readme.txt\).*leave out --strict"):
        build_index(extractor, str(folder), strict=True)
    os.remove(str(folder / "readme.txt"))
    with pytest.raises(UserError, match="cannot read image .*notes.jpg: not a JPEG/PNG/BMP file"):
        build_index(extractor, str(folder), strict=True)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "list.csv").write_text("x")
    with pytest.raises(UserError, match=r"no images \(.jpg/.jpeg/.png/.bmp\) under .*empty \(only 1 other file"):
        build_index(extractor, str(tmp_path / "empty"))
    with pytest.raises(UserError, match="cannot read image .*cut.jpg: truncated JPEG"):
        extractor([str(folder / "sub" / "cut.jpg")])


def test_a_file_that_disappears_is_a_counted_skip(world, tmp_path, monkeypatch):
    from reid.deploy import FeatureExtractor, extractor as extractor_module
    from reid.deploy.gallery import build_index
    shutil.copytree(world["gallery"], str(tmp_path / "g"))
    real = extractor_module.list_image_files
    monkeypatch.setattr(extractor_module, "list_image_files", lambda folder: (real(folder)[0][:4] + ["gone.jpg"], []))
    index, report = build_index(FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager"),
                                str(tmp_path / "g"))
    assert len(index) == 4 and report["skipped"] == [("gone.jpg", "disappeared while indexing")]
    extractor = FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager")
    feats, kept, problems = extractor.extract_files([str(tmp_path / "g" / index.paths[0]), str(tmp_path / "x.jpg")],
                                                    on_bad="skip")
    assert kept == [0] and len(feats) == 1 and "No such file" in problems[0][1]


def test_labels_come_from_market_names_or_a_csv(tmp_path):
    """Ids from Market-1501-style names (camera 1-based in the name, 0-based here; junk -1 kept as a label), or
    from a CSV in the custom datasets' format (header path,pid,camid[,split], paths relative to the CSV's folder),
    keyed relative to the image folder or by absolute path; its bad rows are one-line errors."""
    from reid.deploy.gallery import UNKNOWN, labels_for, read_labels
    pids, camids = labels_for(["a/0002_c3s1_000451_01.jpg", "-1_c1s1_000001_00.jpg", "crop_17.png"])
    assert pids.tolist() == [2, -1, UNKNOWN] and camids.tolist() == [2, 0, UNKNOWN]
    (tmp_path / "g").mkdir()
    good = tmp_path / "labels.csv"
    good.write_text("path,camid,pid,split\n./g/a/x.jpg,1,7,query\ng/b.png,0,-1,gallery\n")
    labels = read_labels(str(good), str(tmp_path / "g"))
    assert labels == {"a/x.jpg": (7, 1), "b.png": (-1, 0)}
    g = tmp_path / "g"
    assert read_labels(str(good)) == {str(g / "a" / "x.jpg"): (7, 1), str(g / "b.png"): (-1, 0)}
    assert [v.tolist() for v in labels_for(["a/x.jpg", "c.jpg"], labels)] == [[7, UNKNOWN], [1, UNKNOWN]]
    for rows, expected in (("a.jpg,7\n", "line 1: the first line must be a header"),
                           ("path,pid,camid\ng/a.jpg,1,0\ng/b.jpg,x,0\n", "line 3: pid 'x' is not an integer"),
                           ("path,pid,camid\ng/a.jpg,1,0\ng/a.jpg,2,0\n", "line 3: g/a.jpg is listed again"),
                           ("path,pid,camid\nelsewhere/a.jpg,1,0\n", "line 2: .* is not under")):
        bad = tmp_path / "bad.csv"
        bad.write_text(rows)
        with pytest.raises(UserError, match=expected):
            read_labels(str(bad), str(tmp_path / "g"))
    with pytest.raises(UserError, match="labels file .* does not exist"):
        read_labels(str(tmp_path / "none.csv"), str(tmp_path / "g"))


def test_search_arguments_are_checked_before_any_model_work(world, acl_index, tmp_path, monkeypatch):
    """Each bad argument is a one-line error before the model is built or a query extracted."""
    search = tool("search")
    monkeypatch.setattr(search, "build_extractor", lambda *a, **k: pytest.fail("the model was built"))
    base = ["--index", acl_index, "--query", world["query"], "--output", str(tmp_path / "r.json")]
    cases = [(["--topk", "0"], "--topk must be at least 1, got 0"), (["--topk", "-1"], "--topk must be at least 1"),
             (["--nprobe", "0"], "--nprobe must be at least 1"), (["--nlist", "0"], "--nlist must be at least 1"),
             (["--batch", "0"], "--batch must be at least 1, got 0"), (["--vis-count", "0"], "--vis-count must be"),
             (["--vis-queries", "1"], "--vis-queries picks the queries --vis draws; add --vis DIR"),
             (["--vis", "v", "--vis-queries", "1", "--vis-count", "2"], "give --vis-count .* or --vis-queries"),
             (["--vis", "v", "--vis-queries", "1,3-"], "'3-' is neither a query number, a range a-b nor a file"),
             (["--vis", "v", "--vis-queries", "21"], "--vis-queries 21: there are 21 queries \\(0-20\\)"),
             (["--vis", "v", "--vis-queries", "nobody.jpg"], "no query is named nobody.jpg"),
             (["--output", str(tmp_path / "res.txt")], "res.txt: name the results FILE.json or FILE.csv")]
    for extra, expected in cases:
        args = base + extra if "--output" not in extra else base[:-2] + extra
        with pytest.raises(UserError, match=expected):
            search.main(args)


def test_search_output_names_plurals_and_the_queries_drawn(world, acl_index, tmp_path, capsys):
    """--output FILE.csv writes FILE.csv and FILE.json; a non-ASCII path stays as it is in both (UTF-8); one
    query is "1 query"; a long name keeps its start and end in the table; --vis-queries picks by number and
    by name, and the line says which were drawn."""
    search = tool("search").main
    names = sorted(os.listdir(world["query"]))
    queries = tmp_path / "q"
    queries.mkdir()
    long_name = "camera_07_" + "x" * 40 + "_" + names[0]
    shutil.copy(os.path.join(world["query"], names[0]), str(queries / long_name))
    shutil.copy(os.path.join(world["query"], names[1]), str(queries / "müller.jpg"))
    search(["--index", acl_index, "--query", str(queries / long_name), "--output", str(tmp_path / "one.csv"),
            "--engine", "eager", "--no-progress"])
    printed = capsys.readouterr().out
    assert "1 query searched in 69 gallery images" in printed
    assert "\n  %s...%s " % (long_name[:15], long_name[-14:]) in printed       # 32 characters: start ... end
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["one.csv", "one.json"]
    assert "wrote %s and %s" % (tmp_path / "one.json", tmp_path / "one.csv") in printed
    search(["--index", acl_index, "--query", str(queries), "--output", str(tmp_path / "two.json"), "--engine",
            "eager", "--no-progress", "--vis", str(tmp_path / "v"), "--vis-queries", "müller.jpg"])
    printed = capsys.readouterr().out
    raw = (tmp_path / "two.json").read_bytes().decode("utf-8")
    assert "müller.jpg" in raw and "\\u00fc" not in raw
    assert "müller.jpg" in (tmp_path / "two.csv").read_text(encoding="utf-8")
    order = [os.path.basename(r["query"]) for r in json.loads(raw)]
    drawn = order.index("müller.jpg")
    assert "1 rank list written to %s: queries %d (--vis-queries)" % (tmp_path / "v", drawn) in printed
    assert os.listdir(str(tmp_path / "v")) == ["rank_%05d_müller.png" % drawn]
    search(["--index", acl_index, "--query", world["query"], "--output", str(tmp_path / "three.json"), "--engine",
            "eager", "--no-progress", "--vis", str(tmp_path / "w"), "--vis-queries", "4-6,2,5"])
    assert "4 rank lists written to %s: queries 2, 4-6 (--vis-queries)" % (tmp_path / "w") in capsys.readouterr().out
    assert sorted(p[:10] for p in os.listdir(str(tmp_path / "w"))) == ["rank_00002", "rank_00004", "rank_00005",
                                                                       "rank_00006"]


def test_an_export_of_the_index_weights_searches_and_updates_it(world, acl_index, tmp_path, capsys):
    """The model's identity is its weights + config, not the engine: an ONNX file exported from the index's
    weights searches the index (scores within 1e-4 of eager's, rank by rank) and updates it without extracting
    anything; a file whose sidecar does not record its weights (exported before it did) is refused, the message
    naming both models with their feature sizes."""
    pytest.importorskip("onnxruntime")
    search = tool("search").main
    onnx = str(tmp_path / "acl.onnx")
    tool("export").main(["--config-file", DEMO, "--output", onnx, "--no-check"] + opts_for(world, "acl"))
    lists = {}
    for name, model in (("eager", ["--engine", "eager"]), ("onnx", ["--model", onnx])):
        search(["--index", acl_index, "--query", world["query"], "--topk", "10", "--output",
                str(tmp_path / (name + ".json")), "--no-progress"] + model)
        lists[name] = json.load(open(str(tmp_path / (name + ".json"))))
    assert "engine onnx" in capsys.readouterr().out
    for eager, exported in zip(lists["eager"], lists["onnx"]):
        a, b = ([m["score"] for m in row["matches"]] for row in (eager, exported))
        assert np.abs(np.array(a) - np.array(b)).max() <= 1e-4
        for r, (ma, mb) in enumerate(zip(eager["matches"], exported["matches"])):   # the same images, but at ties
            near = [abs(a[r] - a[o]) <= 2e-4 for o in (r - 1, r + 1) if 0 <= o < len(a)]
            assert ma["path"] == mb["path"] or any(near), (eager["query"], r)
    updated = str(tmp_path / "updated.npz")
    shutil.copy(acl_index, updated)
    tool("index").main(["--gallery", world["gallery"], "--output", updated, "--model", onnx, "--no-progress"])
    assert "0 extracted, 69 unchanged, 0 removed" in capsys.readouterr().out
    side = json.load(open(onnx + ".json"))
    del side["identity"]
    old = str(tmp_path / "old.onnx")
    shutil.copy(onnx, old)
    json.dump(side, open(old + ".json", "w"))
    with pytest.raises(UserError) as err:
        search(["--index", acl_index, "--query", world["query"], "--output", str(tmp_path / "r.json"), "--model",
                old, "--no-progress"])
    assert "model %s (sha256" % old in str(err.value) and str(err.value).count("feature size 256)") == 2


def test_damaged_index_files_are_refused(acl_index, tmp_path):
    """Truncated, byte-flipped (zip CRC), a member replaced by a pickled object array, inconsistent meta, an
    escaping path: each a one-line error that names the file and the fix; nothing is executed."""
    import io
    import zipfile
    from reid.deploy.gallery import load_index
    data = open(acl_index, "rb").read()
    cases = {"truncated": data[:len(data) // 2], "empty": b""}
    flipped = bytearray(data)
    start = data.index(b"features.npy") + 200
    flipped[start + 1000] ^= 0xFF
    cases["flipped"] = bytes(flipped)

    def rewritten(**replace):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
            for name in src.namelist():
                key = name[:-4]
                if key in replace:
                    buf = io.BytesIO()
                    np.save(buf, replace[key], allow_pickle=True)
                    dst.writestr(name, buf.getvalue())
                else:
                    dst.writestr(name, src.read(name))
        return out.getvalue()
    index = load_index(acl_index)
    cases["pickled"] = rewritten(pids=np.array([{"a": 1}] * len(index), dtype=object))
    meta = dict(index.meta, count=3)
    cases["count"] = rewritten(meta=np.array(json.dumps(meta)))
    cases["escape"] = rewritten(paths=np.array(json.dumps(["../x.jpg"] + index.paths[1:])))
    cases["nan"] = rewritten(features=np.full(index.features.shape, np.nan, np.float32))
    import pickle
    foreign = {"random bytes": np.random.RandomState(0).bytes(4096), "pickle": pickle.dumps({"features": [1.0]}),
               "text": b"query,rank,path,score\n"}
    buf = io.BytesIO()
    np.save(buf, index.features)
    foreign["npy"] = buf.getvalue()
    buf = io.BytesIO()
    np.savez(buf, weights=np.zeros(3))
    foreign["another npz"] = buf.getvalue()
    for name, content in list(cases.items()) + list(foreign.items()):
        path = tmp_path / (name + ".npz")
        path.write_bytes(content)
        with pytest.raises(UserError) as err:
            load_index(str(path))
        message = str(err.value)
        assert "\n" not in message and message.startswith("%s is not an acl-reid gallery index or is damaged (" % path)
        assert message.endswith("); build it again with tools/index.py (--rebuild)"), name
        if name in ("random bytes", "pickle", "text", "npy", "empty"):     # not numpy's "pickled data" message
            assert "(not an .npz file, a zip of numpy arrays)" in message, name
    with pytest.raises(UserError, match="does not exist; write it with tools/index.py"):
        load_index(str(tmp_path / "none.npz"))


def test_search_refuses_another_model_and_finds_moved_images(world, acl_index, tmp_path, capsys):
    """Queries through other weights or another config are refused naming both models; a gallery moved since
    indexing is searched as it is (relative paths), and --vis asks for its new folder."""
    search = tool("search").main
    out = str(tmp_path / "r.json")
    query = os.path.join(world["query"], sorted(os.listdir(world["query"]))[0])
    with pytest.raises(UserError) as err:
        search(["--index", acl_index, "--query", query, "--output", out, "--config-file", DEMO, "--no-progress"]
               + opts_for(world, "baseline"))
    assert "\n" not in str(err.value) and world["acl"] in str(err.value) and world["baseline"] in str(err.value)
    assert str(err.value).count("feature size 256)") == 2      # the given model's too, before it ran
    with pytest.raises(UserError, match="config hash"):
        search(["--index", acl_index, "--query", query, "--output", out, "--config-file", DEMO, "--no-progress"]
               + opts_for(world, "acl", ["TEST.FLIP", "False"]))
    moved = tmp_path / "index.npz"
    shutil.copy(acl_index, str(moved))
    new_root = tmp_path / "moved"
    shutil.copytree(world["gallery"], str(new_root), copy_function=shutil.copy2)
    from reid.deploy.gallery import load_index, save_index
    index = load_index(str(moved))
    index.root = index.meta["root"] = str(tmp_path / "was_here")
    save_index(index, str(moved))
    search(["--index", str(moved), "--query", query, "--output", out, "--topk", "5", "--rerank", "--aqe", "--engine",
            "eager", "--no-progress"])
    distances = [m["distance"] for m in json.load(open(out))[0]["matches"]]
    assert len(distances) == 5 and distances == sorted(distances)
    assert open(out[:-5] + ".csv").readline().strip() == "query,rank,path,distance"
    with pytest.raises(UserError, match="the gallery moved since indexing\\? give its folder with --gallery DIR"):
        search(["--index", str(moved), "--query", query, "--output", out, "--vis", str(tmp_path / "v"),
                "--engine", "eager", "--no-progress"])
    search(["--index", str(moved), "--query", query, "--output", out, "--vis", str(tmp_path / "v"), "--gallery",
            str(new_root), "--engine", "eager", "--no-progress"])
    assert len(os.listdir(str(tmp_path / "v"))) == 1
    from reid.deploy import FeatureExtractor
    from reid.deploy.gallery import build_index
    extractor = FeatureExtractor(config=DEMO, opts=opts_for(world, "acl"), engine="eager")
    again, report = build_index(extractor, str(new_root), previous=index)     # re-indexed where it is now
    assert (report["reused"], report["extracted"]) == (69, 0) and again.root == str(new_root)
    assert np.array_equal(again.features, index.features)
    # a query whose name carries no ids takes them from --query-labels (the custom datasets' CSV format)
    from reid.deploy.gallery import ids_from_name
    pid, camid = ids_from_name(os.path.basename(query))
    (tmp_path / "q").mkdir()
    shutil.copy(query, str(tmp_path / "q" / "person.jpg"))
    (tmp_path / "q" / "ids.csv").write_text("path,pid,camid\nperson.jpg,%d,%d\n" % (pid, camid))
    search(["--index", acl_index, "--query", str(tmp_path / "q" / "person.jpg"), "--query-labels",
            str(tmp_path / "q" / "ids.csv"), "--filter", "protocol", "--topk", "69", "--output", out, "--engine",
            "eager", "--no-progress"])
    row = json.load(open(out))[0]
    assert (row["pid"], row["camid"]) == (pid, camid)
    assert not [m for m in row["matches"] if ids_from_name(os.path.basename(m["path"])) == (pid, camid)]
    assert len(row["matches"]) < 69
    (tmp_path / "noimages").mkdir()
    (tmp_path / "noimages" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match=r"query folder .*noimages holds no images \(only 1 other file"):
        search(["--index", acl_index, "--query", str(tmp_path / "noimages"), "--output", out])


@pytest.mark.skipif(active_backend() != "torch", reason="command-line behaviour, backend-neutral: the torch suite "
                    "runs it (its interpreter starts fastest)")
def test_tools_print_one_line_errors(world, tmp_path):
    require_backend("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT), REID_BACKEND="torch")
    cases = [(["tools/index.py", "--gallery", str(tmp_path), "--output", str(tmp_path / "g.npz"), "--config-file",
               DEMO] + opts_for(world, "acl"), "no images"),
             (["tools/search.py", "--index", str(tmp_path / "none.npz"), "--query", world["query"], "--output",
               str(tmp_path / "r.json")], "does not exist; write it with tools/index.py")]
    for args, expected in cases:
        proc = subprocess.run([str(PYTHONS["torch"])] + args, cwd=str(ROOT), env=env, capture_output=True, text=True,
                              timeout=300)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and last.startswith("error: "), proc.stderr
        assert expected in last, last
