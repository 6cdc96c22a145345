"""The Milvus store of tools/index.py and tools/search.py (--store milvus:PATH.db, Milvus Lite: 2.5 in the
MindSpore environment, 3 in the torch one): the synthetic round trip against test.py's Rank-1 and the .npz
index's exact lists, incremental add / change / remove against a fresh collection, an interrupted upsert
completed by the next run, and every bad input a one-line error that changes nothing.

The demo ACL network of tests/test_retrieval_tools.py, op by op, on the synthetic target's 21 query and 69
gallery images."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from compat.errors import UserError
from tests.test_retrieval import DEMO, _one_torch_thread, make_weights, one_torch_thread, opts_for  # noqa: F401
from tests.test_retrieval_tools import tool

ROUNDING = 1.5e-6     # scores in the JSON have 6 decimals: two float32 sums a few 1e-8 apart may round 1e-6 apart


@pytest.fixture(autouse=True)
def _pymilvus():
    pytest.importorskip("pymilvus", reason="pymilvus is in both environments' requirements: run 'make setup'")


@pytest.fixture(scope="module")
def world(retrieval_world):
    """retrieval_world plus the demo ACL network's weights, as tests/test_retrieval_tools.py has them (the same
    file: made once a session)."""
    root = retrieval_world["root"]
    if not os.path.exists(str(root / "acl.pth")):
        with one_torch_thread():
            make_weights(root / "acl.pth", calibrate_on=retrieval_world["train"])
    return dict(retrieval_world, acl=str(root / "acl.pth"))


@pytest.fixture(scope="module")
def acl_index(world):
    """The .npz index of the gallery folder (tests/test_retrieval_tools.py's: an update of it when that module
    ran first)."""
    path = str(world["root"] / "gallery.npz")
    tool("index").main(["--gallery", world["gallery"], "--output", path, "--config-file", DEMO, "--engine", "eager",
                        "--no-progress"] + opts_for(world, "acl"))
    return path


def index(world, store, gallery, *extra, arch="acl"):
    args = ["--gallery", gallery, "--store", store, "--config-file", DEMO, "--engine", "eager", "--no-progress"]
    tool("index").main(args + list(extra) + opts_for(world, arch))


def rows(path):
    """{field: list} of every row of the collection in the Milvus Lite file `path`, sorted by path (opened as the
    tools open it: in a process of its own on MindSpore, which leaves the file free again for them)."""
    from reid.deploy.milvus_store import open_store, parse_store
    with open_store(parse_store("milvus:" + path)) as gallery:
        out = gallery.rows(("path", "vector", "pid", "camid", "size", "mtime"))
        out["meta"] = gallery.meta
    out["vector"] = np.asarray(out["vector"], np.float32)
    return out


def search(store_args, query, out, *extra):
    tool("search").main(store_args + ["--query", query, "--output", out, "--engine", "eager", "--no-progress"]
                        + list(extra))
    return json.load(open(out))


def test_round_trip_through_milvus_lite(world, acl_index, tmp_path, capsys):
    """The gallery folder indexed into Milvus Lite holds the .npz index's rows (paths, ids, sizes, times,
    vectors to 1e-6); searched with the protocol filter, Rank-1 from the file names is test.py's; with the
    same-camera filter (a Milvus filter expression) the exact FLAT lists are the .npz search's (scores to the
    JSON's last decimal, order up to exact ties), and the JSON has the same form."""
    from reid.config import load_cfg
    from reid.deploy.gallery import load_index
    from reid.engine.launch import test
    db = str(tmp_path / "g.db")
    index(world, "milvus:" + db, world["gallery"])
    printed = capsys.readouterr().out
    assert "69 images" in printed and "FLAT index" in printed and "69 extracted" in printed, printed
    got, npz = rows(db), load_index(acl_index)
    assert got["path"] == npz.paths and got["meta"]["root"] == npz.root
    for key in ("pid", "camid", "size", "mtime"):
        assert got[key] == getattr(npz, key + "s").tolist(), key
    assert np.abs(got["vector"] - npz.features).max() <= 1e-6
    assert got["meta"]["model"]["weights_sha256"] == npz.model["weights_sha256"]

    results = search(["--store", "milvus:" + db], world["query"], str(tmp_path / "p.json"), "--topk", "69",
                     "--filter", "protocol")
    printed = capsys.readouterr().out
    cfg = load_cfg(DEMO, opts_for(world, "acl", ["TEST.JIT", "False", "OUTPUT_DIR", str(tmp_path / "test")]))
    expected = test(cfg)["SynthD"]["Rank-1"]
    assert "Rank-1 from the file names: %.1f%%" % expected in printed, printed
    assert "Milvus FLAT" in printed and len(results) == 21

    lists = {}
    for name, store in (("milvus", ["--store", "milvus:" + db]), ("npz", ["--index", acl_index])):
        lists[name] = search(store, world["query"], str(tmp_path / (name + ".json")), "--topk", "20", "--filter",
                             "camera")
    for a, b in zip(lists["milvus"], lists["npz"]):
        assert set(a) == set(b) == {"query", "pid", "camid", "matches"} and a["query"] == b["query"]
        assert len(a["matches"]) == len(b["matches"]) == 20
        assert all(m["camid"] != a["camid"] for m in a["matches"])
        assert [set(m) for m in a["matches"]] == [set(m) for m in b["matches"]]
        scores_a, scores_b = [m["score"] for m in a["matches"]], [m["score"] for m in b["matches"]]
        assert np.abs(np.subtract(scores_a, scores_b)).max() <= ROUNDING
        for rank, (ma, mb) in enumerate(zip(a["matches"], b["matches"])):
            if ma["path"] != mb["path"]:     # only where two gallery images tie
                tied = [m["path"] for m in b["matches"] if abs(m["score"] - ma["score"]) <= ROUNDING]
                assert ma["path"] in tied and len(tied) > 1, (a["query"], rank)
    assert open(str(tmp_path / "milvus.csv")).readline() == open(str(tmp_path / "npz.csv")).readline()


def _changed_folder(world, tmp_path):
    """A 12-image copy of the gallery, then (after `first` is indexed) one image added, one changed, one removed."""
    folder = tmp_path / "g"
    shutil.copytree(world["gallery"], str(folder / "cam"))
    names = sorted(os.listdir(str(folder / "cam")))
    for name in names[12:]:
        os.remove(str(folder / "cam" / name))

    def change():
        shutil.copy(os.path.join(world["gallery"], names[20]), str(folder / "cam" / names[20]))    # added
        shutil.copy(os.path.join(world["gallery"], names[30]), str(folder / "cam" / names[3]))     # changed
        os.utime(str(folder / "cam" / names[3]), ns=(1, 1))
        os.remove(str(folder / "cam" / names[5]))                                                   # removed
    return str(folder), change


def test_incremental_update_and_an_interrupted_upsert_equal_a_fresh_collection(world, tmp_path, capsys,
                                                                                 monkeypatch):
    """Add, change and remove a file: the update inserts a row, upserts one and deletes one; interrupted after
    its first write, the collection keeps valid rows and the next run writes the rest. The result equals a
    collection made afresh from the folder (vectors to 1e-5: other batches)."""
    from reid.deploy import milvus_store
    monkeypatch.setattr(milvus_store, "SEPARATE_PROCESS", False)    # the upsert patched below is this process's
    folder, change = _changed_folder(world, tmp_path)
    added = "cam/" + sorted(os.listdir(world["gallery"]))[20]
    db, fresh = str(tmp_path / "u.db"), str(tmp_path / "fresh.db")
    index(world, "milvus:" + db, folder)
    before = rows(db)
    change()
    monkeypatch.setattr(milvus_store, "UPSERT_BYTES", 1)        # one row per write call
    real = milvus_store.MilvusGallery.upsert
    calls = []

    def interrupted(self, *args, **kwargs):
        def count(n):
            calls.append(n)
            if len(calls) == 1:
                raise KeyboardInterrupt
        return real(self, *args, progress=count, **{k: v for k, v in kwargs.items() if k != "progress"})
    monkeypatch.setattr(milvus_store.MilvusGallery, "upsert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        index(world, "milvus:" + db, folder)
    monkeypatch.setattr(milvus_store.MilvusGallery, "upsert", real)
    half = rows(db)     # the added image's row written (new rows go first), the changed one not, nothing gone
    assert sorted(set(half["path"]) - set(before["path"])) == [added] and len(half["path"]) == 13
    assert half["mtime"][half["path"].index(before["path"][3])] == before["mtime"][3]
    capsys.readouterr()
    index(world, "milvus:" + db, folder)
    assert "1 extracted, 11 unchanged, 1 removed" in capsys.readouterr().out
    index(world, "milvus:" + fresh, folder)
    updated, new = rows(db), rows(fresh)
    assert updated["path"] == new["path"] and len(new["path"]) == 12
    for key in ("pid", "camid", "size", "mtime"):
        assert updated[key] == new[key], key
    assert np.abs(updated["vector"] - new["vector"]).max() <= 1e-5
    row = new["path"].index(before["path"][3])
    assert np.abs(new["vector"][row] - before["vector"][3]).max() > 1e-3      # the changed image re-extracted


def _holder(db):
    """A process that opens the Milvus Lite file `db` (making its collection) and holds it until its stdin
    closes."""
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from pymilvus import MilvusClient\n"
            "c = MilvusClient(sys.argv[1]); c.create_collection('other', dimension=4)\n"
            "print('open', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "open"
    return proc


def test_bad_milvus_stores_are_one_line_errors_that_change_nothing(world, tmp_path, monkeypatch):
    """An unreachable server, a collection of another model (indexing and searching), a damaged file, the other
    environment's Milvus Lite format, a file that another process holds, a collection that tools/index.py did
    not make (kept even with --rebuild), pymilvus missing: each a one-line error naming the store and the fix;
    nothing written."""
    import builtins
    from reid.deploy import milvus_store
    from tests.test_distributed import _free_port
    # the timeout and the import patched below are this process's (tests/test_commands.py runs the commands,
    # where the store is in a process of its own on MindSpore)
    monkeypatch.setattr(milvus_store, "SEPARATE_PROCESS", False)

    def refused(args, *expected):
        with pytest.raises(UserError) as err:
            index(world, *args)
        message = str(err.value)
        assert "\n" not in message and all(e in message for e in expected), message
        return message

    with monkeypatch.context() as short:      # only the unreachable server waits less; Milvus Lite, not at all
        short.setattr(milvus_store, "CONNECT_TIMEOUT_S", 3)
        port = _free_port()
        refused(["milvus://127.0.0.1:%d/g" % port, world["gallery"]], "cannot reach the Milvus server",
                "127.0.0.1:%d" % port, "check that it runs")

    folder, _ = _changed_folder(world, tmp_path)
    db = str(tmp_path / "m.db")
    index(world, "milvus:" + db, folder)
    before = rows(db)
    with pytest.raises(UserError) as err:
        index(world, "milvus:" + db, folder, arch="baseline")
    message = str(err.value)
    assert "\n" not in message and world["acl"] in message and world["baseline"] in message and "--rebuild" in message
    query = os.path.join(world["query"], sorted(os.listdir(world["query"]))[0])
    with pytest.raises(UserError, match="was made by .*acl.pth"):
        tool("search").main(["--store", "milvus:" + db, "--query", query, "--output", str(tmp_path / "r.json"),
                             "--config-file", DEMO, "--no-progress"] + opts_for(world, "baseline"))
    after = rows(db)
    assert after["path"] == before["path"] and np.array_equal(after["vector"], before["vector"])

    damaged = tmp_path / "damaged.db"
    if os.path.isdir(db):                     # Milvus Lite 3: a folder; a file where it expects one is damaged
        damaged.write_bytes(b"\0" * 4096)
    else:                                     # Milvus Lite 2.5: a file, here with its header overwritten
        data = bytearray(open(db, "rb").read())
        data[:4096] = os.urandom(4096)
        damaged.write_bytes(bytes(data))
    content = damaged.read_bytes()
    refused(["milvus:" + str(damaged), folder], "cannot open the Milvus Lite file", "damaged or not a Milvus Lite")
    assert damaged.read_bytes() == content

    other = tmp_path / "other.db"             # the other environment's Milvus Lite format
    if milvus_store.lite_version().startswith("2."):
        other.mkdir()
        (other / "LOCK").touch()
        refused(["milvus:" + str(other), folder], "it is a folder, as Milvus Lite 3 writes")
    else:
        other.write_bytes(b"SQLite format 3\x00" + bytes(4080))
        refused(["milvus:" + str(other), folder], "it is a Milvus Lite 2.5 file")

    held = str(tmp_path / "held.db")
    holder = _holder(held)
    try:
        refused(["milvus:" + held, folder], "cannot open the Milvus Lite file", "open in another process")
    finally:
        holder.stdin.close()
        holder.wait(60)
    with milvus_store.MilvusGallery(milvus_store.parse_store("milvus:" + held)) as other:
        assert other.client.list_collections() == ["other"]                   # the holder's, untouched
    # a collection of the same name that is not an index is refused, --rebuild or not
    with milvus_store.MilvusGallery(milvus_store.parse_store("milvus:" + held)) as other:
        other.client.create_collection(milvus_store.DEFAULT_COLLECTION, dimension=4)
    for extra in ((), ("--rebuild",)):
        refused(["milvus:" + held, folder] + list(extra), "collection acl_reid_gallery", "not made by tools/index.py")
    with milvus_store.MilvusGallery(milvus_store.parse_store("milvus:" + held)) as other:
        assert sorted(other.client.list_collections()) == ["acl_reid_gallery", "other"]

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "pymilvus" else real(name, *a, **k))
    refused(["milvus:" + db, folder], "pymilvus is not installed", "pip install")
    monkeypatch.undo()
    for spec, expected in (("milvus:g.sqlite", "must end in .db"), ("milvus://host/g", "milvus://HOST:PORT"),
                           ("mongo://x", "use npz")):
        with pytest.raises(UserError, match=expected):
            milvus_store.parse_store(spec)


@pytest.mark.skipif(sys.version_info[:2] != (3, 9),
                    reason="Milvus Lite 2.5 (the MindSpore environment's) has no HNSW; Milvus Lite 3 has")
def test_hnsw_on_milvus_lite_2_5_is_one_line(world, tmp_path):
    folder, _ = _changed_folder(world, tmp_path)
    with pytest.raises(UserError, match="builds FLAT and IVF indexes only"):
        index(world, "milvus:" + str(tmp_path / "h.db"), folder, "--milvus-index", "hnsw")


@pytest.mark.skipif(sys.version_info[:2] != (3, 9),
                    reason="Milvus Lite 2.5 (the MindSpore environment's) runs its engine as a process; 3 does not")
def test_an_engine_that_ends_as_it_starts_is_started_again(tmp_path, monkeypatch, caplog):
    """Milvus Lite 2.5's engine process ending as it starts (pymilvus: "Open local milvus failed") on a new file
    or a Milvus Lite 2.5 file: started again, up to LITE_START_TRIES times, each retry a warning; a damaged file
    is refused at its first try."""
    import milvus_lite.server
    from reid.deploy import milvus_store
    monkeypatch.setattr(milvus_store, "LITE_START_PAUSE_S", 0.0)
    real = milvus_lite.server.Server.start
    tries = []

    def start(server, fail):
        tries.append(str(server._db_file))
        return False if len(tries) <= fail else real(server)

    def opened(path, fail):
        del tries[:]
        monkeypatch.setattr(milvus_lite.server.Server, "start", lambda server: start(server, fail))
        with milvus_store.MilvusGallery(milvus_store.parse_store("milvus:" + path)) as gallery:
            gallery.client.create_collection("c", dimension=4)
            return sorted(gallery.client.list_collections())

    fresh = str(tmp_path / "fresh.db")
    with caplog.at_level("WARNING", logger=milvus_store.__name__):
        assert opened(fresh, 2) == ["c"]
    assert tries == [fresh] * 3
    retries = [r.getMessage() for r in caplog.records if r.name == milvus_store.__name__]
    assert len(retries) == 2 and all(fresh in m and "ended as it started" in m for m in retries), retries
    assert open(fresh, "rb").read(16) == milvus_store.SQLITE_HEADER

    # a new file and a Milvus Lite 2.5 file (not open here: Milvus Lite keeps fresh.db's engine up) whose engine
    # never starts: every try made, then the one-line error
    copy = str(tmp_path / "copy.db")
    shutil.copy(fresh, copy)
    for path in (str(tmp_path / "never.db"), copy):
        with pytest.raises(UserError) as err:
            opened(path, milvus_store.LITE_START_TRIES)
        assert tries == [path] * milvus_store.LITE_START_TRIES
        assert "\n" not in str(err.value) and "cannot open the Milvus Lite file %s" % path in str(err.value)

    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"\0" * 4096)
    with pytest.raises(UserError, match="damaged or not a Milvus Lite database"):
        opened(str(damaged), 0)
    assert tries == [str(damaged)]


def test_store_arguments_are_checked_before_any_work(tmp_path):
    """An index named twice or not at all, float16 or a Milvus index for the other store, --nproc 0: one line
    each, before a model is built (no weights given here)."""
    index, search = tool("index").main, tool("search").main
    gallery = ["--gallery", str(tmp_path)]
    for args, expected in (([], "give the index to write: --output FILE.npz, or --store"),
                           (["--output", "g.npz", "--store", "milvus:g.db"], "name two indexes; give one"),
                           (["--store", "milvus:g.db", "--float16"], "holds float32 vectors; leave out --float16"),
                           (["--output", "g.npz", "--milvus-index", "hnsw"], "--milvus-index is for a Milvus store"),
                           (["--output", "g.npz", "--nproc", "0"], "--nproc and --nnodes must be at least 1")):
        with pytest.raises(UserError, match=expected):
            index(gallery + args)
    query = ["--query", str(tmp_path), "--output", str(tmp_path / "r.json")]
    for args, expected in (([], "give the gallery index: --index FILE.npz, or --store"),
                           (["--index", "g.npz", "--store", "milvus:g.db"], "name two indexes; give one"),
                           (["--store", "milvus:g.db", "--rerank"], "searched by its own vector index")):
        with pytest.raises(UserError, match=expected):
            search(query + args)
