"""Search as a service: an HTTP API and a web page over one gallery index (tools/serve.py, docs/serving.md).

    app = build_app(ServeSettings(index="gallery.npz"), extractor_factory)    # an ASGI app (FastAPI)

What it is made of:

- `Gallery`: the index searched, an .npz file (`NpzGallery`, reloaded when the file is replaced) or a Milvus
  collection (`MilvusView`); each answers with the lists tools/search.py writes, plus each match's gallery id
  (its row in the index, or its place in the collection's sorted paths).
- `Batcher`: requests that arrive together share one extraction. Each request puts its decoded image on an
  asyncio queue; a collector takes the first and every one queued behind it (at most `max_batch`), waits up to
  `window_s` for those still being uploaded or decoded (none on their way: no wait), and runs the batch through
  the FeatureExtractor on one dedicated thread (the framework is only ever called from that thread: the model
  is also built there). Requests that arrive while a batch runs queue up for the next. The network's output
  for an image does not depend on the images beside it in the batch (eval mode), so a batched query gets the
  features it would get alone, to float rounding.
- The search itself runs on a small thread pool, off the event loop; so do decoding and index reloads.

Limits (ServeSettings): the upload size, the pixel count (checked from the image header before decoding), top-k
bounds and gallery ids; each refusal is a 4xx JSON {"error": "..."} naming the problem and the fix. With a
token, every /api/ route but the health check wants `Authorization: Bearer TOKEN`.

FastAPI, uvicorn and python-multipart are imported only here; without them `require_web()` is a one-line error
naming the pip command.
"""
import asyncio
import hmac
import io
import logging
import mimetypes
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from compat.errors import UserError

logger = logging.getLogger("acl_reid.serve")

PIP = ("pip install fastapi==0.163.2 uvicorn==0.54.0 python-multipart==0.0.34 (they are in requirements-torch.txt "
       "and requirements.txt)")
TOKEN_ENV = "ACL_REID_TOKEN"
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_PIXELS = 40_000_000
MAX_TOPK = 100
FORM_OVERHEAD = 64 * 1024          # multipart headers and boundaries around the image, beyond the upload limit
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


WEB_MODULES = (("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("python_multipart", "python-multipart"))


def require_web():
    """The web modules, or a one-line error naming those missing and what to install."""
    missing = []
    for module, package in WEB_MODULES:
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise UserError("the search server needs %s, not installed here; %s" % (" and ".join(missing), PIP))


def is_loopback(host):
    if host in LOOPBACK:
        return True
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServeSettings:
    """What the app serves and its limits; every field has the command's default."""

    def __init__(self, index=None, store="npz", gallery_root=None, token=None, max_upload=MAX_UPLOAD_BYTES,
                 max_pixels=MAX_PIXELS, max_topk=MAX_TOPK, max_batch=32, window_s=0.01, reload_s=2.0,
                 nprobe=16, ef=64, nlist=None, search_threads=2):
        self.index, self.store, self.gallery_root, self.token = index, store, gallery_root, token or None
        self.max_upload, self.max_pixels, self.max_topk = int(max_upload), int(max_pixels), int(max_topk)
        self.max_batch, self.window_s, self.reload_s = int(max_batch), float(window_s), float(reload_s)
        self.nprobe, self.ef, self.nlist, self.search_threads = nprobe, ef, nlist, int(search_threads)


class ApiError(Exception):
    """A refusal: HTTP `status` and a message naming the problem (and the fix)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


# --------------------------------------------------------------------------------------------- galleries
def _file_stamp(path):
    """What tells a replaced file: (inode, size, mtime_ns), or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class NpzSnapshot:
    """One loaded .npz index and what is built on it (a faiss index per method, on first use)."""

    def __init__(self, index, stamp, generation):
        self.index, self.stamp, self.generation = index, stamp, generation
        self.loaded_at = time.time()
        self._faiss, self._lock = {}, threading.Lock()

    def faiss(self, method, nlist):
        from reid.deploy.search import build_faiss
        with self._lock:
            if method not in self._faiss:
                self._faiss[method] = build_faiss(self.index.features, method, nlist)
            return self._faiss[method]


class NpzGallery:
    """An .npz index file, searched as tools/search.py --index searches it, and loaded again when the file is
    replaced (tools/index.py renames a complete new file over it: the old one is read whole or the new one,
    never half of either). A replacement that cannot be loaded, or was made by another model, leaves the loaded
    index serving; the error is logged and kept in the summary until a good file replaces it."""

    kind = "npz"

    def __init__(self, path, model, root=None, nlist=None):
        from reid.deploy.gallery import load_index
        self.path, self.model, self.root_override, self.nlist = path, model, root, nlist
        stamp = _file_stamp(path)
        self.current = NpzSnapshot(load_index(path), stamp, 1)
        self.reload_error, self._failed_stamp = None, None
        self._reload_lock = threading.Lock()

    @property
    def index_model(self):
        return self.current.index.model

    def name(self):
        return self.path

    def reload_if_changed(self):
        """Load the file again when it was replaced since; True when a new index is serving."""
        from reid.deploy.gallery import check_same_model, load_index
        with self._reload_lock:
            stamp = _file_stamp(self.path)
            if stamp is None or stamp == self.current.stamp or stamp == self._failed_stamp:
                return False
            try:
                index = load_index(self.path)
                check_same_model(self.path, index.model, self.model, "index it with the model this server runs, or "
                                 "start the server again on the new index")
            except UserError as exc:
                self._failed_stamp, self.reload_error = stamp, str(exc)
                logger.error("the replaced index could not be loaded, the previous one (%d images) keeps serving: %s",
                             len(self.current.index), exc)
                return False
            # the stamp taken before loading: a file replaced again while this one was read differs from it and
            # is loaded at the next check
            self.current = NpzSnapshot(index, stamp, self.current.generation + 1)
            self.reload_error, self._failed_stamp = None, None
            logger.info("reloaded %s: %d images (generation %d)", self.path, len(index), self.current.generation)
            return True

    def snapshot(self):
        return self.current

    def size(self, snap):
        return len(snap.index)

    def root(self, snap):
        return self.root_override or snap.index.root

    def summary(self, snap):
        from reid.deploy.gallery import UNKNOWN
        index = snap.index
        return {"store": "npz", "index": os.path.abspath(self.path), "images": len(index),
                "feature_size": int(index.features.shape[1]), "dtype": str(index.features.dtype),
                "ids_known": int((index.pids != UNKNOWN).sum()), "cameras": bool((index.camids != UNKNOWN).any()),
                "gallery": self.root(snap), "generation": snap.generation,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap.loaded_at)),
                "reload_error": self.reload_error}

    def has_cameras(self, snap):
        from reid.deploy.gallery import UNKNOWN
        return bool((snap.index.camids != UNKNOWN).any())

    def search(self, snap, features, topk, mode, q_pids, q_camids, method):
        """[(id, path, pid, camid, score)] per query, best first."""
        from reid.deploy.search import exact_search, exclusion, faiss_search
        index = snap.index
        exclude = exclusion(mode, q_pids, q_camids, index.pids, index.camids)
        if method == "exact":
            idx, values = exact_search(features, index.features, topk, exclude)
        else:
            idx, values = faiss_search(snap.faiss(method, self.nlist), features, topk, exclude)
        root = self.root(snap)
        return [[(int(j),) + index.record(j, root) + (float(v),) for j, v in zip(row, vals) if j >= 0]
                for row, vals in zip(idx, values)]

    def record(self, snap, gid):
        """(path, pid, camid) of gallery id `gid`, or None."""
        if not 0 <= gid < len(snap.index):
            return None
        return snap.index.record(gid, self.root(snap))

    def close(self):
        pass


class MilvusSnapshot:
    def __init__(self, paths, generation):
        self.paths, self.generation = paths, generation
        self.ids = {p: i for i, p in enumerate(paths)}
        self.loaded_at = time.time()


class MilvusView:
    """A Milvus collection written by tools/index.py --store, searched by its own vector index as tools/search.py
    --store searches it. Gallery ids are places in the collection's sorted paths, read again when the
    collection's row count changes (a collection is updated in place, not replaced). Every Milvus call runs on
    one thread of its own (the client is not shared between threads)."""

    kind = "milvus"

    def __init__(self, spec, nprobe=16, ef=64, root=None):
        from reid.deploy.milvus_store import open_gallery
        self.spec, self.nprobe, self.ef, self.root_override = spec, nprobe, ef, root
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="acl-reid-milvus")
        self.gallery = self.pool.submit(open_gallery, spec).result()
        self.index_model = self.gallery.model
        self.current = self.pool.submit(self._read, 1).result()
        self.reload_error = None

    def _read(self, generation):
        rows = self.gallery.rows(("path", "pid", "camid"))
        snap = MilvusSnapshot(rows["path"], generation)
        snap.pids, snap.camids = rows["pid"], rows["camid"]
        return snap

    def name(self):
        return "collection %s of %s" % (self.gallery.name, self.spec)

    def reload_if_changed(self):
        count = self.pool.submit(self.gallery.count).result()
        if count == len(self.current.paths):
            return False
        self.current = self.pool.submit(self._read, self.current.generation + 1).result()
        return True

    def snapshot(self):
        return self.current

    def size(self, snap):
        return len(snap.paths)

    def root(self, snap):
        return self.root_override or self.gallery.root

    def summary(self, snap):
        from reid.deploy.gallery import UNKNOWN
        kind, params = self.pool.submit(self.gallery.index_info).result()
        return {"store": str(self.spec), "index": self.name(), "images": len(snap.paths),
                "feature_size": self.gallery.meta.get("feature_size"), "dtype": "float32",
                "ids_known": sum(1 for p in snap.pids if p != UNKNOWN),
                "cameras": any(c != UNKNOWN for c in snap.camids), "gallery": self.root(snap),
                "generation": snap.generation, "vector_index": kind.upper(),
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap.loaded_at)),
                "reload_error": self.reload_error}

    def has_cameras(self, snap):
        from reid.deploy.gallery import UNKNOWN
        return any(c != UNKNOWN for c in snap.camids)

    def search(self, snap, features, topk, mode, q_pids, q_camids, method):
        if method != "exact":
            raise ApiError(400, "a Milvus store is searched by its own vector index; leave out method=%s" % method)
        hits = self.pool.submit(self.gallery.search, features, topk, mode, q_pids, q_camids, self.nprobe,
                                self.ef).result()
        root = self.root(snap)
        out = []
        for row in hits:
            out.append([(snap.ids.get(rel, -1), os.path.join(root, *rel.split("/")), pid, camid, score)
                        for rel, score, pid, camid in row])
        return out

    def record(self, snap, gid):
        from reid.deploy.gallery import _known
        if not 0 <= gid < len(snap.paths):
            return None
        return (os.path.join(self.root(snap), *snap.paths[gid].split("/")), _known(snap.pids[gid]),
                _known(snap.camids[gid]))

    def close(self):
        self.pool.submit(self.gallery.close).result()
        self.pool.shutdown()


# ------------------------------------------------------------------------------------------------ batching
class Batcher:
    """Dynamic batching of feature extraction (module docstring): `submit(image)` from request handlers, `run()`
    as one task of the event loop. `extract(list of images) -> (N, D)` runs on `pool` (one thread)."""

    POLL_S = 0.002        # how often the collector looks again whether requests are still on their way

    def __init__(self, extract, pool, max_batch, window_s):
        self.extract, self.pool = extract, pool
        self.max_batch, self.window_s = max(1, int(max_batch)), max(0.0, float(window_s))
        self.queue = None
        self.batches = self.images = self.largest = 0
        self.on_the_way = 0    # requests being read or decoded, whose images will be submitted (event loop only)

    async def submit(self, image):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((image, future))
        return await future

    async def run(self):
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.window_s
            while len(batch) < self.max_batch:
                if not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0 or not self.on_the_way:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), min(left, self.POLL_S)))
                except asyncio.TimeoutError:
                    pass
            batch = [(image, future) for image, future in batch if not future.done()]  # clients that left
            if not batch:
                continue
            try:
                features = await loop.run_in_executor(self.pool, self.extract, [image for image, _ in batch])
            except Exception as exc:   # handed to every request of the batch
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            self.images += len(batch)
            self.largest = max(self.largest, len(batch))
            for row, (_, future) in enumerate(batch):
                if not future.done():
                    future.set_result(features[row])


# ------------------------------------------------------------------------------------------------ images
def decode_upload(data, max_pixels):
    """The RGB uint8 array of an uploaded image file, decoded as tools/search.py reads a query file; an
    ApiError naming what is wrong (not an image, truncated, over the pixel limit) otherwise."""
    from PIL import Image
    from reid.data.common import image_bytes_or_problem
    if not data:
        raise ApiError(400, "the image is empty (0 bytes); send an image file in the multipart field 'image'")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as probe:
                width, height = probe.size
    except Image.DecompressionBombError:
        width = height = None
    except Exception:   # not an image PIL knows: the decoder below says what it is
        width = height = 0
    if width is None or width * height > max_pixels:
        raise ApiError(413, "the image has %s pixels, over the server's limit of %d; send a smaller image (or "
                       "start the server with a larger --max-pixels)" % (
                           "%d x %d" % (width, height) if width else "too many", max_pixels))
    image, reason = image_bytes_or_problem(data)
    if image is None:
        raise ApiError(400, "the upload is not an image that can be read: %s; send a JPEG, PNG or BMP file" % reason)
    return image


def read_gallery_image(path):
    from reid.data.common import image_or_problem
    image, reason = image_or_problem(path)
    if image is None:
        raise ApiError(404, "gallery image %s cannot be read: %s (the gallery changed since indexing?)"
                       % (path, reason))
    return image


# ------------------------------------------------------------------------------------------------ the app
class Service:
    """What the app runs on: the gallery, the extractor on its thread, the batcher and the search pool."""

    def __init__(self, settings, extractor_factory, model_pool=None):
        """`model_pool`: the one-thread executor the model runs on (default: one of its own, shut down with the
        service); given, the caller owns it (an extractor built there is reused by several services)."""
        self.settings = settings
        self._own_pool = model_pool is None
        self.model_pool = model_pool or ThreadPoolExecutor(1, thread_name_prefix="acl-reid-model")
        self.search_pool = ThreadPoolExecutor(settings.search_threads, thread_name_prefix="acl-reid-search")
        self.extractor = self.model_pool.submit(extractor_factory).result()
        self.describe = self.model_pool.submit(self.extractor.describe).result()
        self.gallery = self._open_gallery()
        self.batcher = Batcher(self._extract, self.model_pool, settings.max_batch, settings.window_s)
        self._tasks = []

    def _open_gallery(self):
        from reid.deploy.gallery import check_same_model
        from reid.deploy.milvus_store import parse_store
        s = self.settings
        spec = parse_store(s.store)
        if spec.kind == "npz":
            gallery = NpzGallery(s.index, self.describe, s.gallery_root, s.nlist)
        else:
            gallery = MilvusView(spec, s.nprobe, s.ef, s.gallery_root)
        check_same_model(gallery.name(), gallery.index_model, self.describe,
                         "serve with the model the index was made with (leave out the model arguments), or index "
                         "the gallery with this one (tools/index.py --rebuild)")
        return gallery

    def _extract(self, images):
        return np.asarray(self.extractor(list(images)), np.float32)

    def warm_up(self):
        """The extractor's one-time work (an export, a graph build) before the first request, on its thread."""
        size = self.extractor.image_size
        batch = self.settings.max_batch if self.extractor.engine == "compiled" else 1
        self.model_pool.submit(self._extract, [np.zeros(size + (3,), np.uint8)] * batch).result()

    async def start(self):
        self.batcher.queue = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self.batcher.run())]
        if self.settings.reload_s > 0:
            self._tasks.append(asyncio.ensure_future(self._watch()))

    async def stop(self):
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self.gallery.close()
        self.search_pool.shutdown(wait=True)
        if self._own_pool:
            self.model_pool.shutdown(wait=True)

    async def _watch(self):
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.reload_s)
            try:
                await loop.run_in_executor(self.search_pool, self.gallery.reload_if_changed)
            except Exception as exc:   # a failed check is logged; the loaded index keeps serving
                logger.error("checking the index for a replacement failed: %s", exc)

    # ------------------------------------------------------------------------------------------ search
    def options(self, topk, mode, method, snap):
        from reid.deploy.search import FILTERS, METHODS
        s = self.settings
        if topk < 1 or topk > s.max_topk:
            raise ApiError(400, "topk must be in 1..%d, got %d" % (s.max_topk, topk))
        if mode not in FILTERS:
            raise ApiError(400, "unknown filter %r; use one of: %s" % (mode, ", ".join(FILTERS)))
        if method not in METHODS:
            raise ApiError(400, "unknown method %r; use one of: %s" % (method, ", ".join(METHODS)))
        if mode != "none" and not self.gallery.has_cameras(snap):
            raise ApiError(400, "filter %s needs camera ids, and the index has none; search with filter=none"
                           % mode)

    async def search(self, image, query, q_pid, q_camid, topk, mode, method, timing=None):
        """The entry tools/search.py writes for one query (plus each match's id), and the snapshot searched;
        `timing` (a dict) gets the seconds spent waiting for the features (queue and extraction) and searching."""
        from reid.deploy.gallery import UNKNOWN
        timing = {} if timing is None else timing
        snap = self.gallery.snapshot()
        self.options(topk, mode, method, snap)
        start = time.perf_counter()
        feature = await self.batcher.submit(image)
        timing["extract"] = time.perf_counter() - start
        loop = asyncio.get_running_loop()
        pid = UNKNOWN if q_pid is None else q_pid
        camid = UNKNOWN if q_camid is None else q_camid
        start = time.perf_counter()
        args = (snap, feature[None], topk, mode, np.array([pid]), np.array([camid]), method)
        try:
            lists = await loop.run_in_executor(self.search_pool, self.gallery.search, *args)
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        timing["search"] = time.perf_counter() - start
        entry = {"query": query}
        if q_pid is not None:
            entry["pid"] = int(q_pid)
        if q_camid is not None:
            entry["camid"] = int(q_camid)
        entry["matches"] = []
        for gid, path, pid, camid, score in lists[0]:
            match = {"path": path, "score": round(float(score), 6)}
            match.update({k: v for k, v in (("pid", pid), ("camid", camid)) if v is not None})
            match["id"] = gid
            entry["matches"].append(match)
        return entry, snap

    def summary(self):
        snap = self.gallery.snapshot()
        d = self.describe
        model = {k: d.get(k) for k in ("kind", "weights", "model", "engine", "backend", "feature_size", "flip")
                 if d.get(k) is not None}
        for key in ("weights_sha256", "model_sha256", "config_sha256"):
            if d.get(key):
                model[key] = str(d[key])[:12]
        s = self.settings
        from reid.deploy.search import FILTERS, METHODS
        return dict(self.gallery.summary(snap), model=model,
                    limits={"max_upload_bytes": s.max_upload, "max_pixels": s.max_pixels, "max_topk": s.max_topk},
                    batching={"max_batch": s.max_batch, "window_ms": round(s.window_s * 1000, 3),
                              "batches": self.batcher.batches, "images": self.batcher.images,
                              "largest": self.batcher.largest},
                    filters=list(FILTERS), methods=list(METHODS) if self.gallery.kind == "npz" else ["exact"],
                    token=bool(s.token))


def _int_param(request, name, default=None):
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, "%s must be an integer, got %r" % (name, value[:40])) from None


async def _read_body(request, limit):
    """The request body, refused (413) as soon as it passes `limit` bytes (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            too_big = int(declared) > limit
        except ValueError:
            raise ApiError(400, "the Content-Length header %r is not a number" % declared[:40]) from None
        if too_big:
            raise ApiError(413, "the upload is %s bytes, over the server's limit of %d; send a smaller image (or start "
                           "the server with a larger --max-upload-mb)" % (declared, limit - FORM_OVERHEAD))
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, "the upload is over the server's limit of %d bytes; send a smaller image (or start the "
                           "server with a larger --max-upload-mb)" % (limit - FORM_OVERHEAD))
        chunks.append(chunk)
    return b"".join(chunks)


async def _upload(request, settings):
    """(image file bytes, file name) of a search request: the multipart field `image`, or the whole body when
    it is sent as image/* or application/octet-stream."""
    from starlette.requests import Request
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await _read_body(request, settings.max_upload + FORM_OVERHEAD)
    if kind.startswith("image/") or kind == "application/octet-stream":
        if len(body) > settings.max_upload:
            raise ApiError(413, "the image is %d bytes, over the server's limit of %d" % (len(body),
                                                                                        settings.max_upload))
        return body, None
    if kind != "multipart/form-data":
        raise ApiError(415, "send the image as multipart/form-data in the field 'image' (curl -F image=@photo.jpg), "
                       "or as the body with Content-Type image/jpeg; got %r" % (kind or "no Content-Type"))
    sent = [False]

    async def receive():
        if sent[0]:
            return {"type": "http.disconnect"}
        sent[0] = True
        return {"type": "http.request", "body": body, "more_body": False}
    replay = Request(request.scope, receive)
    try:
        form = await replay.form(max_files=4, max_fields=32)
    except Exception as exc:   # the parser's errors: a body that is not the multipart it says
        raise ApiError(400, "the multipart body cannot be parsed (%s); send the image in the field 'image'"
                       % (str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)) from None
    try:
        item = form.get("image")
        if item is None or isinstance(item, str):
            raise ApiError(400, "no file in the multipart field 'image' (fields sent: %s); send the image there"
                           % (", ".join(sorted(form.keys())[:8]) or "none"))
        data = await item.read()
        if len(data) > settings.max_upload:
            raise ApiError(413, "the image is %d bytes, over the server's limit of %d" % (len(data),
                                                                                        settings.max_upload))
        return data, os.path.basename((item.filename or "").replace("\\", "/")) or None
    finally:
        await form.close()


def _query_ids(request, name):
    """(pid, camid) of a query: the `pid` / `camid` parameters, else a Market-1501-style file name's."""
    from reid.deploy.gallery import UNKNOWN, ids_from_name
    pid, camid = ids_from_name(name) if name else (UNKNOWN, UNKNOWN)
    pid = _int_param(request, "pid", None if pid == UNKNOWN else int(pid))
    camid = _int_param(request, "camid", None if camid == UNKNOWN else int(camid))
    return pid, camid


def build_app(settings, extractor_factory=None, warm_up=True, ready=None, service=None):
    """The FastAPI app of `settings`, on `service` (a Service), or on one made when the app starts (its
    lifespan): `extractor_factory()` makes the FeatureExtractor on the model's thread, the gallery is opened and
    checked against that model, and the model warmed up (`warm_up`). `ready(service)` is called once it
    serves."""
    require_web()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    state = {}

    @asynccontextmanager
    async def lifespan(app):
        svc = service
        if svc is None:
            svc = Service(settings, extractor_factory)
            if warm_up:
                svc.warm_up()
        state["service"] = svc
        await svc.start()
        if ready is not None:
            ready(svc)
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="acl-reid search", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json",
                  description="Person re-identification search over a gallery index (docs/serving.md).")

    def error(status, message):
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(request, exc):
        return error(exc.status, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        text = {404: "no such page: %s" % request.url.path[:200],
                405: "method %s is not allowed on %s" % (request.method, request.url.path[:200])}
        return error(exc.status_code, text.get(exc.status_code, str(exc.detail)))

    @app.exception_handler(UserError)
    async def user_error(request, exc):
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def server_error(request, exc):     # a fault of the server's: logged with its trace, answered in JSON
        logger.exception("%s %s failed", request.method, request.url.path)
        return error(500, "the server failed on this request (%s: %s); its log has the details"
                     % (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else ""))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        problems = ["%s: %s" % (".".join(str(p) for p in e.get("loc", ())[1:]) or "request", e.get("msg"))
                    for e in exc.errors()[:3]]
        return error(400, "; ".join(problems))

    @app.middleware("http")
    async def guard(request, call_next):
        path = request.url.path
        if settings.token and path.startswith("/api/") and path != "/api/health":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), settings.token.encode()):
                return error(401, "this server wants its access token: send the header 'Authorization: Bearer "
                             "TOKEN' (the page asks for it once)" if not token else "wrong access token")
        try:
            return await call_next(request)
        except ApiError as exc:
            return error(exc.status, exc.message)

    def current():
        return state["service"]

    @app.get("/", include_in_schema=False)
    async def page():
        with open(os.path.join(STATIC, "index.html"), encoding="utf-8") as fh:
            return HTMLResponse(fh.read(), headers={"Cache-Control": "no-cache"})

    @app.get("/api/health", summary="Whether the server answers, and the index's size")
    async def health():
        svc = current()
        return {"status": "ok", "images": svc.gallery.size(svc.gallery.snapshot())}

    @app.get("/api/summary", summary="The index: size, model identity, engine, limits, batching")
    async def summary():
        return current().summary()

    search_doc = {"requestBody": {"content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["image"],
        "properties": {"image": {"type": "string", "format": "binary"}}}}}, "required": True}}
    params_doc = ("Query parameters: topk (1..max_topk, default 10), filter (none | camera | protocol), camid and "
                  "pid (the query's; default from a Market-1501-style file name), method (exact | faiss-flat | "
                  "faiss-ivf).")

    def search_params(request):
        return (_int_param(request, "topk", 10), request.query_params.get("filter", "none"),
                request.query_params.get("method", "exact"))

    def answer(entry, snap, timing):
        """The JSON, the index generation searched, and where the time went (Server-Timing, milliseconds)."""
        spent = ", ".join("%s;dur=%.1f" % (k, v * 1000) for k, v in timing.items())
        return JSONResponse(entry, headers={"X-Index-Generation": str(snap.generation), "Server-Timing": spent})

    @app.post("/api/search", summary="Search the gallery for an uploaded image", openapi_extra=search_doc,
              description="The JSON of one tools/search.py result, each match with its gallery id. " + params_doc)
    async def search(request: Request):
        svc = current()
        topk, mode, method = search_params(request)
        svc.options(topk, mode, method, svc.gallery.snapshot())     # before the upload is read
        start = time.perf_counter()
        svc.batcher.on_the_way += 1
        try:
            data, name = await _upload(request, settings)
            timing = {"upload": time.perf_counter() - start}
            loop = asyncio.get_running_loop()
            start = time.perf_counter()
            image = await loop.run_in_executor(svc.search_pool, decode_upload, data, settings.max_pixels)
            timing["decode"] = time.perf_counter() - start
            pid, camid = _query_ids(request, name)
        finally:    # nothing awaits from here to the image's place in the queue (Service.search)
            svc.batcher.on_the_way -= 1
        entry, snap = await svc.search(image, name or "upload", pid, camid, topk, mode, method, timing)
        return answer(entry, snap, timing)

    def gallery_record(gid, request):
        svc = current()
        snap = svc.gallery.snapshot()
        generation = _int_param(request, "generation")
        if generation is not None and generation != snap.generation:
            raise ApiError(409, "gallery id %d is of index generation %d, and the index was reloaded since "
                           "(generation %d); search again" % (gid, generation, snap.generation))
        record = svc.gallery.record(snap, gid)
        if record is None:
            raise ApiError(404, "no gallery image has id %d: ids are 0..%d; take them from a search's matches"
                           % (gid, svc.gallery.size(snap) - 1))
        return svc, snap, record

    @app.post("/api/gallery/{gid}/search", summary="Search the gallery for one of its own images",
              description="As /api/search with gallery image `gid` as the query. " + params_doc)
    async def search_from(gid: int, request: Request):
        svc, snap, (path, pid, camid) = gallery_record(gid, request)
        topk, mode, method = search_params(request)
        svc.options(topk, mode, method, snap)
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        svc.batcher.on_the_way += 1
        try:
            image = await loop.run_in_executor(svc.search_pool, read_gallery_image, path)
        finally:
            svc.batcher.on_the_way -= 1
        timing = {"decode": time.perf_counter() - start}
        pid, camid = _int_param(request, "pid", pid), _int_param(request, "camid", camid)
        entry, snap = await svc.search(image, path, pid, camid, topk, mode, method, timing)
        return answer(entry, snap, timing)

    @app.get("/api/gallery/{gid}", summary="A gallery image's record: path, pid, camid")
    async def gallery_item(gid: int, request: Request):
        _, snap, (path, pid, camid) = gallery_record(gid, request)
        item = {"id": gid, "path": path}
        item.update({k: v for k, v in (("pid", pid), ("camid", camid)) if v is not None})
        return item

    @app.get("/api/gallery/{gid}/image", summary="A gallery image's file, by id (never by a path)")
    async def gallery_image(gid: int, request: Request):
        _, snap, (path, _, _) = gallery_record(gid, request)
        if not os.path.isfile(path):
            raise ApiError(404, "gallery image %d (%s) is not on disk: the gallery moved since indexing? start the "
                           "server with --gallery DIR" % (gid, path))
        kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
        return FileResponse(path, media_type=kind, headers={"Cache-Control": "private, max-age=300"})

    return app


def _version():
    from reid import __version__
    return __version__


def run_server(settings, extractor_factory, host="127.0.0.1", port=8000, log_level="info", graceful_s=30):
    """Serve until SIGTERM or SIGINT: requests in flight finish (for up to `graceful_s`), then 0 is returned."""
    import contextlib
    import signal
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # the connections accepted inherit it: without, a keep-alive client waits out its delayed-ACK timer on
    # every answer written in two parts (headers, body)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise UserError("cannot listen on %s port %d: %s; pick another --port (0: any free one) or --host"
                        % (host, port, exc.strerror or exc)) from None
    # listening from here on: the "serving ... at" line is printed before uvicorn takes the socket, and a
    # client that connects on seeing it waits in the backlog instead of being refused
    sock.listen(2048)
    bound = sock.getsockname()[1]
    shown = "[%s]" % host if ":" in host else host

    def ready(service):
        summary = service.summary()
        print("serving %s (%d images, engine %s) at http://%s:%d/%s" % (
            summary["index"], summary["images"], summary["model"].get("engine"), shown, bound,
            "  (the page asks for the access token once; or open the address with #token=TOKEN)"
            if settings.token else ""), flush=True)

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(settings, extractor_factory)      # a problem with the index or model: one line, not served
    service.warm_up()
    app = build_app(settings, service=service, ready=ready)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_s, access_log=True)

    class Server(uvicorn.Server):
        """uvicorn's server without its re-raising of the signal after a graceful shutdown (which would end
        the process by that signal instead of exit status 0)."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    server = Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 1
