"""A gallery index in Milvus: tools/index.py and tools/search.py with `--store milvus:PATH.db` (Milvus Lite, the
embedded engine: a local file, nothing to start) or `--store milvus://HOST:PORT[/COLLECTION]` (a Milvus server or
cluster), beside the `.npz` file of reid.deploy.gallery (docs/milvus.md).

One collection per gallery, a row per image:

  path     VARCHAR, the primary key: the image path relative to the gallery folder ("/" separated)
  vector   FLOAT_VECTOR (D), the L2-normalised feature (float32)
  pid, camid, size, mtime   INT64, as the .npz index's arrays of the same names

The collection's description and its properties (key META_KEY) hold the same JSON: the format and version, the
gallery folder, the feature size and the model that made the features (FeatureExtractor.describe()), checked
as the .npz index's meta is. Both, because Milvus Lite 2.5 keeps the description and no properties, Milvus Lite
3 the properties and no description, and a Milvus server both. The JSON is written when the collection is
made and never changed: a gallery that moved is indexed into a new collection.

Updates follow the .npz index's plan (gallery.plan_update): new images are extracted and inserted, changed ones
(another size or modification time) extracted and upserted, removed ones deleted, in that order, then flushed;
so an interrupted update leaves every row a valid feature of its image and the next run completes it (rows
already written match their files and are kept; the collection is read afresh, so no path is inserted twice).

Search: the collection's vector index (FLAT by default: exact, the numpy search's lists; IVF_FLAT or HNSW on
request), inner product (cosine similarity of normalised features); the filters of reid.deploy.search as
Milvus filter expressions, one search per distinct query camera (or person and camera).

pymilvus is optional: without it a Milvus store is a one-line error that names the pip command.

pymilvus and MindSpore in one process: MindSpore's checkpoint code is protobuf code generated in the old style,
which protobuf's C implementation (upb) refuses, so MindSpore cannot be imported once pymilvus has loaded that
implementation; importing MindSpore first (it asks for protobuf's pure-Python implementation) lets pymilvus
work, an order of magnitude slower when writing. So where this process runs MindSpore, open_store() puts the
collection in a process of its own (GalleryProcess: a fresh interpreter without MindSpore, where pymilvus has
protobuf's C implementation) and forwards every call there.
"""
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
import traceback
import warnings

import numpy as np

from reid.errors import UserError
from reid.deploy.gallery import INDEX_FORMAT, UNKNOWN, _known, check_same_model
from reid.deploy.search import FILTERS, JUNK_PID

SCHEME = "milvus"
DEFAULT_COLLECTION = "acl_reid_gallery"
META_KEY = "acl_reid.meta"
STORE_VERSION = 1
MAX_PATH = 65535                 # Milvus's longest VARCHAR
MAX_TOPK = 16384                 # Milvus's largest search limit
INDEX_TYPES = {"flat": "FLAT", "ivf": "IVF_FLAT", "hnsw": "HNSW"}
DEFAULT_HNSW = {"M": 16, "efConstruction": 200}
UPSERT_BYTES = 1 << 21           # bytes of float32 vectors per write call into Milvus Lite 2.5 (larger calls
                                 # were much slower there: bench/search.py); LARGER_WRITES times that into
LARGER_WRITES = 8                # Milvus Lite 3 and servers (each call costs Milvus Lite 3 a write of its log)
READ_BATCH = 16384               # rows per page when the rows are read back (Milvus's largest page)
CONNECT_TIMEOUT_S = 10
# Milvus Lite 2.5's engine, a separate process, at times ends as it starts on a busy machine ("Open local milvus
# failed" with nothing wrong with the file): a file that is new or reads as Milvus Lite 2.5's is tried again, the
# pause before try n + 1 n times LITE_START_PAUSE_S
LITE_START_TRIES = 3
LITE_START_PAUSE_S = 1.0
LOCKED = "it is open in another process (Milvus Lite allows one at a time); wait for it or stop it"
SQLITE_HEADER = b"SQLite format 3\x00"   # the first bytes of a Milvus Lite 2.5 file
PIP = "pip install -r requirements.txt (or requirements-torch.txt): pymilvus and milvus-lite"


class StoreSpec:
    """Where an index lives: kind "npz" (`path`), or "milvus" (`uri` for pymilvus, `collection`, and `lite`:
    the Milvus Lite file, or None for a server)."""

    def __init__(self, kind, text, path=None, uri=None, collection=None, lite=None):
        self.kind, self.text, self.path = kind, text, path
        self.uri, self.collection, self.lite = uri, collection, lite

    def __str__(self):
        return self.text


def parse_store(text):
    """StoreSpec of a --store value: "npz", "milvus:PATH.db" or "milvus://HOST:PORT[/COLLECTION]"."""
    if text in (None, "", "npz"):
        return StoreSpec("npz", "npz")
    if text.startswith(SCHEME + "://"):
        rest = text[len(SCHEME) + 3:]
        address, _, collection = rest.partition("/")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in collection:
            raise UserError("--store %s: a Milvus server is milvus://HOST:PORT[/COLLECTION], e.g. "
                            "milvus://127.0.0.1:19530/gallery" % text)
        return StoreSpec(SCHEME, text, uri="http://%s:%s" % (host, port),
                         collection=_check_collection(collection or DEFAULT_COLLECTION, text))
    if text.startswith(SCHEME + ":"):
        path = text[len(SCHEME) + 1:]
        if not path.endswith(".db") or path.endswith("/.db") or path == ".db":
            raise UserError("--store %s: a Milvus Lite file is milvus:PATH.db (the name must end in .db)" % text)
        path = os.path.abspath(path)
        return StoreSpec(SCHEME, text, uri=path, collection=DEFAULT_COLLECTION, lite=path)
    raise UserError("--store %s: use npz (the default: the --output / --index file), milvus:PATH.db (Milvus Lite) "
                    "or milvus://HOST:PORT[/COLLECTION] (a Milvus server)" % text)


def _check_collection(name, text):
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UserError("--store %s: a collection name is letters, digits and _ (not first a digit), got %r"
                        % (text, name))
    return name


def import_pymilvus():
    try:
        import pymilvus
    except ImportError:
        raise UserError("pymilvus is not installed, so there is no Milvus store; %s, or use the .npz index (leave "
                        "out --store)" % PIP) from None
    # pymilvus logs every failed call at ERROR level before raising: the one-line errors below say it once.
    # Milvus Lite 3's in-process server logs the calls it does not implement and answers without them
    for name in ("pymilvus", "pymilvus.milvus_client", "grpc._server", "milvus_lite"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return pymilvus


def lite_version():
    try:
        from importlib.metadata import version
        return version("milvus-lite")
    except Exception:   # not installed (a server needs none)
        return None


def _first_line(exc):
    text = getattr(exc, "message", None) or str(exc)
    text = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return text


def _lite_locked(path):
    """Whether another process holds the lock of the Milvus Lite file `path` (both layouts: 2.5's lock file
    beside the file, 3's LOCK inside its folder). Never asked of a file this process has open: a POSIX lock
    is the process's, and taking and dropping it here would drop Milvus Lite 2.5's (its engine then stops)."""
    import fcntl
    from milvus_lite.server_manager import server_manager_instance
    if any(os.path.realpath(str(p)) == os.path.realpath(path) for p in list(server_manager_instance._servers)):
        return False
    lock = os.path.join(path, "LOCK") if os.path.isdir(path) else os.path.join(
        os.path.dirname(path), ".%s.lock" % os.path.basename(path))
    if not os.path.exists(lock):
        return False
    with open(lock, "a") as fh:
        for take in (fcntl.flock, fcntl.lockf):
            try:
                take(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            take(fh, fcntl.LOCK_UN)
    return False


def _lite_problem(path, exc):
    """One phrase saying why Milvus Lite could not open `path`."""
    version = lite_version() or "?"
    if _lite_locked(path):
        return LOCKED
    if os.path.exists(path):
        folder = os.path.isdir(path)
        if version.startswith("2.") and folder:
            return ("it is a folder, as Milvus Lite 3 writes (this environment has Milvus Lite %s, which reads its "
                    "own single-file format); index with --store milvus:NEW.db here" % version)
        if not version.startswith("2.") and not folder and _sqlite_file(path):
            return ("it is a Milvus Lite 2.5 file (this environment has Milvus Lite %s, which keeps a folder); "
                    "index with --store milvus:NEW.db here" % version)
        return ("it is damaged or not a Milvus Lite database (%s); index again into a new file (or remove this one "
                "first)" % _first_line(exc))
    return "%s; check the path" % _first_line(exc)


def connect(spec, timeout=None):
    """A pymilvus MilvusClient of `spec`; every way it cannot connect is a one-line error naming the store."""
    pymilvus = import_pymilvus()
    if spec.lite:
        if lite_version() is None:
            raise UserError("milvus-lite is not installed, so there is no Milvus Lite file; %s, or give a Milvus "
                            "server (--store milvus://HOST:PORT)" % PIP)
        folder = os.path.dirname(spec.lite)
        if not os.path.isdir(folder):
            raise UserError("--store %s: the folder %s does not exist; create it first" % (spec, folder))
        name = os.path.basename(spec.lite)
        if (lite_version() or "").startswith("2.") and (len(name) > 35 or not all(c.isalnum() or c in "._-"
                                                                                     for c in name)):
            raise UserError("--store %s: Milvus Lite %s takes file names of at most 35 letters, digits, '.', '-' and "
                            "'_'; rename it" % (spec, lite_version()))
        # asked first: Milvus Lite 2.5, failing to take the lock, removes the lock file of the process that holds it
        if _lite_locked(spec.lite):
            raise UserError("cannot open the Milvus Lite file %s: %s" % (spec.lite, LOCKED))
    for attempt in range(1, LITE_START_TRIES + 1):
        try:
            return _client(pymilvus, spec, timeout)
        except Exception as exc:   # pymilvus's own exceptions, and what Milvus Lite raises while it starts
            if attempt == LITE_START_TRIES or not _lite_start_failed(spec, exc):
                _refuse(spec, exc)
            logging.getLogger(__name__).warning(
                "Milvus Lite's engine for %s ended as it started (try %d of %d); starting it again in %.0f s",
                spec.lite, attempt, LITE_START_TRIES, LITE_START_PAUSE_S * attempt)
            time.sleep(LITE_START_PAUSE_S * attempt)


def _client(pymilvus, spec, timeout):
    root = logging.getLogger()
    level = root.level
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # milvus-lite 2.5 imports the deprecated pkg_resources
            root.setLevel(logging.CRITICAL)      # and logs its failures on the root logger
            return pymilvus.MilvusClient(spec.uri, timeout=timeout or CONNECT_TIMEOUT_S)
    finally:
        root.setLevel(level)


def _lite_start_failed(spec, exc):
    """Whether `exc` is Milvus Lite 2.5's engine ending as it started while the file is new or reads as its own
    (a damaged file, or one another process holds, fails every try: refused at once)."""
    if (not spec.lite or not (lite_version() or "").startswith("2.") or _first_line(exc) != "Open local milvus failed"
            or _lite_locked(spec.lite)):
        return False
    if not os.path.exists(spec.lite):
        return True
    return not os.path.isdir(spec.lite) and _sqlite_file(spec.lite)


def _sqlite_file(path):
    """Whether the file `path` begins as SQLite's files do (Milvus Lite 2.5's format)."""
    with open(path, "rb") as fh:
        return fh.read(16) == SQLITE_HEADER


def _refuse(spec, exc):
    """Raise the one-line UserError of a store that `exc` kept from opening."""
    if spec.lite:
        raise UserError("cannot open the Milvus Lite file %s: %s" % (spec.lite, _lite_problem(spec.lite, exc))
                        ) from None
    raise UserError("cannot reach the Milvus server %s (%s): %s; check that it runs and the address and port "
                    "(--store milvus://HOST:PORT)" % (spec.uri, spec, _first_line(exc))) from None


# Where the collection is opened: None decides by the process (runs_mindspore()); True / False force a process of
# its own or this one (the tests that patch this module's functions, the benchmark's comparison)
SEPARATE_PROCESS = None


def runs_mindspore():
    """Whether this process runs (or will import) MindSpore: the MindSpore backend, installed here."""
    if "mindspore" in sys.modules:
        return True
    from compat.backend import requested_backend
    return requested_backend() == "mindspore" and importlib.util.find_spec("mindspore") is not None


def open_store(spec, timeout=None):
    """The gallery collection of `spec`: a MilvusGallery in this process, or, where this process runs MindSpore,
    a GalleryProcess with the same methods (the module docstring says why)."""
    separate = runs_mindspore() if SEPARATE_PROCESS is None else SEPARATE_PROCESS
    return GalleryProcess(spec, timeout) if separate else MilvusGallery(spec, timeout)


def open_gallery(spec, timeout=None):
    """The gallery collection of `spec` that tools/index.py wrote (an error when there is none): open_store's."""
    gallery = open_store(spec, timeout)
    try:
        if not gallery.exists():
            raise UserError("%s holds no collection %s; write it with tools/index.py --gallery DIR --store %s"
                            % (spec, spec.collection, spec))
        gallery.meta
    except BaseException:
        gallery.close()
        raise
    return gallery


class MilvusGallery:
    """A gallery collection of a Milvus store (see the module docstring). Every call that fails is a one-line
    UserError naming the store."""

    def __init__(self, spec, timeout=None):
        self.spec, self.name = spec, spec.collection
        self.client = connect(spec, timeout)
        self._meta = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close the connection. A Milvus Lite file's engine stays up (and its lock held) until the process
        exits, as Milvus Lite runs it (stopped and started again within one test process, Milvus Lite 2.5's
        engine at times did not come back)."""
        try:
            self.client.close()
        except Exception:   # closing what failed: nothing more to do
            pass

    def _call(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError:
            raise
        except Exception as exc:
            if type(exc).__module__.split(".")[0] not in ("pymilvus", "grpc", "milvus_lite"):
                raise
            hint = ("the file may be damaged: index again into a new file" if self.spec.lite
                    else "check the server (its logs) and run again")
            raise UserError("Milvus store %s failed to %s: %s; %s" % (self.spec, what, _first_line(exc), hint)
                            ) from None

    # ------------------------------------------------------------------------------------------ the collection
    def exists(self):
        return bool(self._call("list its collections", self.client.has_collection, self.name))

    @property
    def meta(self):
        """The collection's JSON meta (the module docstring), checked; an error when it was not made by
        tools/index.py."""
        if self._meta is None:
            info = self._call("describe collection %s" % self.name, self.client.describe_collection, self.name)
            text = (info.get("properties") or {}).get(META_KEY) or info.get("description") or ""
            try:
                meta = json.loads(text)
            except ValueError:
                meta = None
            if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT or meta.get("store") != SCHEME:
                raise UserError("collection %s of %s was not made by tools/index.py (its description is not an "
                                "acl-reid index's); give another collection or file" % (self.name, self.spec))
            if meta.get("version") != STORE_VERSION:
                raise UserError("collection %s of %s is of index version %r, this code reads version %d; index "
                                "again with --rebuild" % (self.name, self.spec, meta.get("version"), STORE_VERSION))
            self._meta = meta
            # a collection is searched and read once loaded (a server, Milvus Lite 3 after a restart, keep it
            # released)
            self._call("load collection %s" % self.name, self.client.load_collection, self.name)
        return self._meta

    @property
    def model(self):
        return self.meta["model"]

    @property
    def root(self):
        return self.meta["root"]

    def check_model(self, model, fix):
        check_same_model("collection %s of %s" % (self.name, self.spec), self.model, model, fix)

    def create(self, meta, dim, index_type="flat", index_params=None):
        """Make the collection (dropping one of that name), its meta and vector index."""
        pymilvus = import_pymilvus()
        DataType = pymilvus.DataType
        meta = dict(meta, store=SCHEME, version=STORE_VERSION)
        text = json.dumps(meta, sort_keys=True)
        schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False, description=text)
        schema.add_field("path", DataType.VARCHAR, is_primary=True, max_length=MAX_PATH)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(dim))
        for field in ("pid", "camid", "size", "mtime"):
            schema.add_field(field, DataType.INT64)
        if self.exists():
            self._call("drop collection %s" % self.name, self.client.drop_collection, self.name)
        self._call("create collection %s" % self.name, self.client.create_collection, self.name, schema=schema,
                   index_params=self._index_params(index_type, index_params), properties={META_KEY: text})
        self._meta = None
        return self.meta

    def _index_params(self, index_type, params=None):
        if index_type not in INDEX_TYPES:
            raise UserError("unknown Milvus index %r; use one of: %s" % (index_type, ", ".join(INDEX_TYPES)))
        kind = INDEX_TYPES[index_type]
        version = lite_version() or ""
        if self.spec.lite and kind == "HNSW" and version.startswith("2."):
            raise UserError("Milvus Lite %s builds FLAT and IVF indexes only (HNSW: Milvus Lite 3, Python >= 3.10, "
                            "or a Milvus server); use --milvus-index flat or ivf" % version)
        out = self.client.prepare_index_params()
        out.add_index(field_name="vector", index_name="vector", index_type=kind, metric_type="IP",
                      params={k: int(v) for k, v in (params or {}).items()})
        return out

    def index_info(self):
        """(index type as INDEX_TYPES names it, its build parameters)."""
        info = self._call("describe its vector index", self.client.describe_index, self.name, "vector")
        kind = str(info.get("index_type", "FLAT")).upper()
        name = {v: k for k, v in INDEX_TYPES.items()}.get(kind, kind.lower())
        params = info.get("params") if isinstance(info.get("params"), dict) else info
        keys = {"ivf": ("nlist",), "hnsw": ("M", "efConstruction")}.get(name, ())
        return name, {k: int(params[k]) for k in keys if k in params}

    def set_index(self, index_type, params=None):
        """Replace the vector index (no row changes) when another one is asked for."""
        if (index_type, dict(params or {})) == self.index_info():
            return False
        index_params = self._index_params(index_type, params)
        self._call("release collection %s" % self.name, self.client.release_collection, self.name)
        self._call("drop its vector index", self.client.drop_index, self.name, "vector")
        self._call("build its vector index", self.client.create_index, self.name, index_params)
        self._call("load collection %s" % self.name, self.client.load_collection, self.name)
        return True

    def count(self):
        self.meta         # checked and loaded
        rows = self._call("count its rows", self.client.query, self.name, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def rows(self, fields=("path", "size", "mtime")):
        """Every row's `fields` ({field: list}, sorted by path)."""
        self.meta         # checked and loaded
        out = {f: [] for f in fields}
        iterator = self._call("read its rows", self.client.query_iterator, self.name, batch_size=READ_BATCH,
                              filter="", output_fields=list(fields))
        try:
            while True:
                page = self._call("read its rows", iterator.next)
                if not page:
                    break
                for row in page:
                    for f in fields:
                        out[f].append(row[f])
        finally:
            iterator.close()
        order = sorted(range(len(out[fields[0]])), key=out["path"].__getitem__) if "path" in out else None
        return {f: [v[i] for i in order] if order is not None else v for f, v in out.items()}

    def previous(self):
        """What gallery.plan_update compares against: the stored rows (paths, sizes, mtimes, pids, camids) and
        the model."""
        return StoredRows(self.rows(("path", "size", "mtime", "pid", "camid")), self.model)

    def count_known(self):
        """Rows whose person id is known."""
        self.meta         # checked and loaded
        rows = self._call("count its rows", self.client.query, self.name, filter="pid != %d" % UNKNOWN,
                          output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def upsert(self, paths, features, pids, camids, sizes, mtimes, progress=None, new=False):
        """Insert or replace the rows of `paths`, in batches (UPSERT_BYTES); `new`: rows of paths the
        collection does not hold (inserted: Milvus does not look for the rows they replace)."""
        write = self.client.insert if new else self.client.upsert
        for start, stop in _write_calls(self.spec, features):
            batch = [{"path": paths[i], "vector": np.asarray(features[i], np.float32), "pid": int(pids[i]),
                      "camid": int(camids[i]), "size": int(sizes[i]), "mtime": int(mtimes[i])}
                     for i in range(start, stop)]
            self._call("write %d rows" % len(batch), write, self.name, batch)
            if progress is not None:
                progress(stop - start)

    def flush(self):
        """Persist what was written (Milvus Lite 3 also searches flushed rows far faster than fresh ones)."""
        self._call("flush collection %s" % self.name, self.client.flush, self.name)

    def delete(self, paths):
        paths = list(paths)
        for start in range(0, len(paths), READ_BATCH):
            self._call("delete rows", self.client.delete, self.name, ids=paths[start:start + READ_BATCH])

    def vectors(self, paths):
        """{path: float32 vector} of the rows `paths`."""
        self.meta         # checked and loaded
        out = {}
        for start in range(0, len(paths), 1024):
            rows = self._call("read vectors", self.client.query, self.name, ids=list(paths[start:start + 1024]),
                              output_fields=["path", "vector"])
            out.update({r["path"]: np.asarray(r["vector"], np.float32) for r in rows})
        return out

    # ------------------------------------------------------------------------------------------------ search
    def has_cameras(self):
        self.meta         # checked and loaded
        rows = self._call("query camera ids", self.client.query, self.name, filter="camid != %d" % UNKNOWN,
                          output_fields=["path"], limit=1)
        return bool(rows)

    def search(self, queries, k, mode="none", q_pids=None, q_camids=None, nprobe=None, ef=None):
        """[[(path, score, pid, camid), ...] per query], best first (ties by path), ids None where unknown,
        with `mode`'s filter (reid.deploy.search.FILTERS) as a Milvus filter expression."""
        if mode not in FILTERS:
            raise UserError("unknown filter %r; use one of: %s" % (mode, ", ".join(FILTERS)))
        k = int(k)
        if not 1 <= k <= MAX_TOPK:
            raise UserError("--topk must be in 1..%d with a Milvus store, got %d" % (MAX_TOPK, k))
        self.meta         # checked and loaded
        queries = np.ascontiguousarray(queries, np.float32)
        n = len(queries)
        q_pids = np.full(n, UNKNOWN, np.int64) if q_pids is None else np.asarray(q_pids, np.int64)
        q_camids = np.full(n, UNKNOWN, np.int64) if q_camids is None else np.asarray(q_camids, np.int64)
        groups = {}
        for q in range(n):
            groups.setdefault(filter_expression(mode, int(q_pids[q]), int(q_camids[q])), []).append(q)
        kind, _ = self.index_info()
        params = {"ivf": {"nprobe": int(nprobe or 16)}, "hnsw": {"ef": max(int(ef or 64), k)}}.get(kind, {})
        out = [None] * n
        for expression, members in groups.items():
            hits = self._call("search", self.client.search, self.name, data=[queries[q] for q in members], limit=k,
                              filter=expression, output_fields=["path", "pid", "camid"],
                              search_params={"metric_type": "IP", "params": params})
            for q, row in zip(members, hits):
                matches = [(h["entity"]["path"], float(h["distance"]), _known(h["entity"]["pid"]),
                            _known(h["entity"]["camid"])) for h in row]
                out[q] = sorted(matches, key=lambda m: (-m[1], m[0]))
        return out

    def rank1(self, lists, q_pids, q_camids):
        """(Rank-1 in percent, queries counted) of lists searched with the "protocol" filter, as
        reid.deploy.search.rank1_from_lists counts: a query whose identity the gallery holds in another
        camera."""
        hits = counted = 0
        holds = {}
        for q, row in enumerate(lists):
            pid, camid = int(q_pids[q]), int(q_camids[q])
            if pid in (UNKNOWN, JUNK_PID):
                continue
            if (pid, camid) not in holds:
                holds[(pid, camid)] = bool(self._call(
                    "query person ids", self.client.query, self.name, filter="pid == %d and camid != %d" % (pid, camid),
                    output_fields=["path"], limit=1))
            if not holds[(pid, camid)]:
                continue
            counted += 1
            hits += int(bool(row) and row[0][2] == pid)
        return (100.0 * hits / counted if counted else float("nan")), counted


def _write_calls(spec, features):
    """(start, stop) of each write call of (N, D) `features` into the store `spec`: as many rows a call as
    UPSERT_BYTES (times LARGER_WRITES beyond Milvus Lite 2.5) hold."""
    budget = UPSERT_BYTES * (1 if spec.lite and (lite_version() or "").startswith("2.") else LARGER_WRITES)
    step = max(1, budget // max(1, 4 * int(features.shape[1]) if len(features) else 1))
    return [(start, min(start + step, len(features))) for start in range(0, len(features), step)]


class GalleryProcess:
    """A MilvusGallery in a child process of its own (the module docstring says why): the same methods and
    properties, each call sent to the child and its answer (or its exception: a UserError is the same one-line
    error) returned. The child is a fresh interpreter that imports this module and pymilvus, never MindSpore,
    with protobuf's implementation as the user's environment had it before MindSpore set it. close() ends it
    and waits, so that a Milvus Lite file is free again when it returns."""

    PROPERTIES = ("meta", "model", "root")
    STOP_S = 60

    def __init__(self, spec, timeout=None):
        import threading
        from multiprocessing.connection import Connection
        self.spec, self.name = spec, spec.collection
        self._lock = threading.Lock()     # one call at a time on the pipe, whichever thread makes it
        if importlib.util.find_spec("pymilvus") is None:
            import_pymilvus()         # its one-line error
        reads, to_child = os.pipe()
        from_child, writes = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from reid.deploy.milvus_store import _serve; _serve(%d, %d)" % (reads, writes)],
                pass_fds=(reads, writes), env=child_environment(), stdin=subprocess.DEVNULL)
        finally:
            os.close(reads)
            os.close(writes)
        self._send, self._receive = Connection(to_child, readable=False), Connection(from_child, writable=False)
        try:
            self._call("open", spec, timeout)
        except BaseException:
            self.close()
            raise

    def _call(self, name, *args, **kwargs):
        if self.process is None:
            raise UserError("Milvus store %s: the connection is closed" % self.spec)
        try:
            with self._lock:
                self._send.send((name, args, kwargs))
                ok, value = self._receive.recv()
        except (EOFError, OSError):
            status = self.process.wait()
            self.process = None
            raise UserError("the process that holds the Milvus store %s ended (status %s; its error, if any, is "
                            "above); run again" % (self.spec, status)) from None
        if ok:
            return value
        raise value

    def __getattr__(self, name):
        if name.startswith("_") or name in ("process", "spec", "name"):
            raise AttributeError(name)
        if name in self.PROPERTIES:
            return self._call("getattr", name)
        return lambda *args, **kwargs: self._call("method", name, *args, **kwargs)

    def upsert(self, paths, features, pids, camids, sizes, mtimes, progress=None, new=False):
        """MilvusGallery.upsert, sent to the child one write call at a time (so `progress` is called here)."""
        for start, stop in _write_calls(self.spec, features):
            self._call("method", "upsert", list(paths[start:stop]), np.asarray(features[start:stop], np.float32),
                       *(np.asarray(a[start:stop], np.int64) for a in (pids, camids, sizes, mtimes)), new=new)
            if progress is not None:
                progress(stop - start)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close the collection and end the child (killed if it does not end within STOP_S)."""
        if getattr(self, "process", None) is None:
            return
        try:
            self._send.send(("close", (), {}))
        except OSError:
            pass
        for conn in (self._send, self._receive):
            conn.close()
        try:
            self.process.wait(self.STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def child_environment():
    """The environment of a GalleryProcess's child: this package importable, and protobuf's implementation
    variable as it was before compat imported MindSpore (which set it)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    from compat.backend import PROTOBUF_VARIABLE, protobuf_implementation_before_mindspore
    known, value = protobuf_implementation_before_mindspore()
    if known:
        env.pop(PROTOBUF_VARIABLE, None)
        if value is not None:
            env[PROTOBUF_VARIABLE] = value
    return env


def _serve(reads, writes):
    """The child of a GalleryProcess: open the collection, then answer calls until "close" or the end of the
    pipe. An exception goes back to the caller (as text when it cannot be pickled)."""
    from multiprocessing.connection import Connection
    from reid.errors import install_excepthook
    install_excepthook()
    receive, send = Connection(reads, writable=False), Connection(writes, readable=False)
    gallery = None
    try:
        while True:
            try:
                name, args, kwargs = receive.recv()
            except EOFError:
                return
            if name == "close":
                return
            try:
                if name == "open":
                    gallery = MilvusGallery(*args, **kwargs)
                    value = None
                elif name == "getattr":
                    value = getattr(gallery, args[0])
                else:
                    value = getattr(gallery, args[0])(*args[1:], **kwargs)
                answer = (True, value)
            except Exception as exc:
                answer = (False, exc if isinstance(exc, UserError) else RuntimeError(
                    "in the Milvus process: %s" % "".join(traceback.format_exception_only(type(exc), exc)).strip()))
            try:
                send.send(answer)
            except Exception as exc:   # a value that does not pickle
                send.send((False, RuntimeError("in the Milvus process: %s: %s" % (type(exc).__name__, exc))))
    except KeyboardInterrupt:
        return
    finally:
        if gallery is not None:
            gallery.close()
        send.close()


class StoredRows:
    """A collection's rows as gallery.plan_update reads a previous index: `paths`, `sizes`, `mtimes` (and
    `pids`, `camids`), `model`."""

    def __init__(self, rows, model):
        self.paths, self.model = rows["path"], model
        self.sizes, self.mtimes = (np.asarray(rows[k], np.int64) for k in ("size", "mtime"))
        self.pids, self.camids = (np.asarray(rows[k], np.int64) for k in ("pid", "camid"))


def filter_expression(mode, q_pid, q_camid):
    """The Milvus filter of reid.deploy.search.exclusion's `mode` for one query ("" for none)."""
    if mode == "camera":
        return "" if q_camid == UNKNOWN else "camid != %d" % q_camid
    if mode == "protocol":
        junk = "pid != %d" % JUNK_PID
        if UNKNOWN in (q_pid, q_camid):
            return junk
        # not (same person and same camera), written without `not`: Milvus Lite 2.5 cannot parse that
        return "%s and (pid != %d or camid != %d)" % (junk, q_pid, q_camid)
    return ""


# ------------------------------------------------------------------------------------------------ index.py
def write_plan(gallery, plan, extracted, problems, labels=None, index_type=None, index_params=None, progress=False):
    """Apply an UpdatePlan (gallery.plan_update, against gallery.previous() or nothing) whose images are
    extracted: create the collection when the plan has no previous index (dropping one of that name: --rebuild),
    upsert the new and changed rows, then
    delete the removed ones; set the vector index asked for. Returns the report gallery.assemble_index gives."""
    from reid.deploy.gallery import labels_for
    final = plan.final_paths(extracted)
    problems = list(plan.problems) + list(problems)
    if not final:
        raise UserError("none of the %d images under %s could be read (first: %s: %s); check the files"
                        % (len(plan.paths), plan.root, problems[0][0], problems[0][1]))
    if index_type == "ivf" and not (index_params or {}).get("nlist"):
        index_params = dict(index_params or {}, nlist=max(1, int(np.sqrt(len(final)))))
    if plan.previous is None:
        dim = len(next(iter(extracted.values())))
        model = dict(plan.model, feature_size=dim)
        meta = {"format": INDEX_FORMAT, "root": plan.root, "feature_size": dim, "dtype": "float32", "model": model,
                "labels": "csv" if labels is not None else "file names"}
        gallery.create(meta, dim, index_type or "flat", index_params)
    elif plan.root != gallery.root:
        raise UserError("collection %s of %s holds the gallery of %s, not of %s; index this folder into another "
                        "collection (or --rebuild)" % (gallery.name, gallery.spec, gallery.root, plan.root))
    elif index_type is not None:
        gallery.set_index(index_type, index_params)
    vectors = extracted
    if plan.previous is not None:
        # kept rows whose ids changed (another --labels CSV) are written again with their stored vectors
        kept = [rel for rel in final if rel in plan.kept]
        pids, camids = labels_for(kept, labels)
        stored = plan.previous
        relabel = [rel for rel, p, c in zip(kept, pids, camids)
                   if (int(stored.pids[plan.kept[rel]]), int(stored.camids[plan.kept[rel]])) != (int(p), int(c))]
        if relabel:
            vectors = dict(extracted)
            vectors.update(gallery.vectors(relabel))
    stored = set(plan.previous.paths) if plan.previous is not None else set()
    todo = [rel for rel in final if rel in vectors]
    bar = None
    if progress and todo:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="writing to Milvus", unit="row")
    try:
        for new in (True, False):   # new paths inserted, the others upserted (replacing their rows)
            rels = [rel for rel in todo if (rel not in stored) == new]
            if rels:
                pids, camids = labels_for(rels, labels)
                gallery.upsert(rels, np.stack([vectors[rel] for rel in rels]), pids, camids,
                               [plan.stats[r][0] for r in rels], [plan.stats[r][1] for r in rels],
                               progress=bar.update if bar is not None else None, new=new)
    finally:
        if bar is not None:
            bar.close()
    if plan.previous is not None:
        keep = set(final)
        gallery.delete([p for p in plan.previous.paths if p not in keep])
    gallery.flush()
    return plan.report(extracted, problems)
