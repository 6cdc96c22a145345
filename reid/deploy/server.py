"""Search as a service: an HTTP API and a web page over one gallery index (tools/serve.py, docs/serving.md).

    app = build_app(ServeSettings(index="gallery.npz"), extractor_factory)    # an ASGI app (FastAPI)

What it is made of:

- `Gallery`: the index searched, an .npz file (`NpzGallery`, reloaded when the file is replaced) or a Milvus
  collection (`MilvusView`); each answers with the lists tools/search.py writes, plus each match's gallery id
  (its row in the index, or its place in the collection's sorted paths).
- A request's path: the event loop reads the upload; a preparation thread parses the form, decodes the image
  and resizes it (the test transform) and queues it; the model's thread takes every image queued as one batch
  (`Batcher`) and runs it (`ServingModel`); a search thread searches the batch's queries and writes each
  answer's JSON; the event loop sends it. Images are prepared while the previous batch runs.
- `Batcher`: the queue is drained on the model's one thread (the framework is only ever called from that
  thread: the model is also built there), while it holds requests: a batch is every request queued (at most
  `max_batch`), after waiting up to `window_s` (from the first one's arrival) for those still being uploaded or
  prepared; with none on their way it does not wait. The network's output for an image does not depend on
  the images beside it in the batch (eval mode), so a batched query gets the features it would get alone, to
  float rounding.
- Threads are set for a server (`Service`): ONNX Runtime's pool without spinning, numpy's BLAS at one thread,
  pools as many threads as cores; a FeatureExtractor used elsewhere keeps its defaults.

Limits (ServeSettings): the upload size, the pixel count (checked from the image header before decoding), top-k
bounds and gallery ids; each refusal is a 4xx JSON {"error": "..."} naming the problem and the fix. At most
`max_queue` search requests are in the server at once; one more is answered 503 with Retry-After. With a
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

from reid.errors import UserError

logger = logging.getLogger("acl_reid.serve")

PIP = ("pip install fastapi==0.163.2 uvicorn==0.54.0 python-multipart==0.0.34 (they are in requirements-torch.txt "
       "and requirements.txt)")
TOKEN_ENV = "ACL_REID_TOKEN"
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_PIXELS = 40_000_000
MAX_TOPK = 100
# search requests in the server at once (being uploaded, prepared, queued, extracted or searched); one more is
# answered 503: the queue, and the memory its uploads hold, stay bounded
MAX_QUEUE = 64
# gallery values (images x feature size) up to which an exact search is cheaper run where the batch is than
# handed to the search pool
INLINE_SEARCH_VALUES = 1 << 20
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
                 nprobe=16, ef=64, nlist=None, search_threads=None, model_threads=None, max_queue=MAX_QUEUE):
        """`search_threads` (each of the preparation and search pools) and `model_threads` (ONNX Runtime's
        intra-op pool): None for one per core."""
        self.index, self.store, self.gallery_root, self.token = index, store, gallery_root, token or None
        self.max_upload, self.max_pixels, self.max_topk = int(max_upload), int(max_pixels), int(max_topk)
        self.max_batch, self.window_s, self.reload_s = int(max_batch), float(window_s), float(reload_s)
        self.nprobe, self.ef, self.nlist = nprobe, ef, nlist
        self.search_threads = int(search_threads) if search_threads else None
        self.model_threads = int(model_threads) if model_threads else None
        self.max_queue = max(1, int(max_queue))


class ApiError(Exception):
    """A refusal: HTTP `status` and a message naming the problem (and the fix); `headers` to send with it."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


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


# ------------------------------------------------------------------------------------------------ threads
def server_cores():
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _onnx_files(net):
    """The ExportedModel files of ONNX Runtime behind an extractor's network (none for another engine)."""
    files = [net.big, net.single] if hasattr(net, "big") and hasattr(net, "single") else [net]
    return [f for f in files if getattr(f, "format", None) == "onnx" and hasattr(getattr(f, "runner", None),
                                                                                  "session")]


def tune_onnx_for_serving(net, threads):
    """The ONNX Runtime sessions of `net` opened again with a server's thread settings: an intra-op pool of
    `threads`, no inter-op pool, and its threads not spinning between runs. Spinning suits a script that runs
    batch after batch; in a server the pool would keep the cores busy after each batch and slow down the
    event loop, the decoding and the search, which need them between batches. Only the server's own
    extractor is changed: a FeatureExtractor used elsewhere keeps ONNX Runtime's defaults."""
    files = _onnx_files(net)
    if not files:
        return 0
    import onnxruntime
    for f in files:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        f.runner.session = onnxruntime.InferenceSession(f.path, options, providers=["CPUExecutionProvider"])
    return len(files)


class BlasLimit:
    """numpy's BLAS pool held at one thread while a server runs (threadpoolctl, where it is installed): the
    search's matrix products are small and run on a pool of their own, whose threads would otherwise each
    start the BLAS pool (one thread per core) and spin on it. Restored by `restore()`."""

    def __init__(self):
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            self._limits = None
            return
        self._limits = threadpool_limits(1, user_api="blas")

    def restore(self):
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None


class ServingModel:
    """The extractor's network as the server runs it: `run(images (N, 3, H, W) float32, test transform
    applied)` -> (N, D) features, as `extractor(images)` gives them, on the model thread.

    Exported files (onnx, mindir) run from numpy with no framework tensors between: the flipped copies (TEST.FLIP)
    go in the same run as the images. Fixed-batch files (MindSpore's export: one of batch B, one of batch 1)
    run a batch's last images either one by one or padded into one run of B, whichever `calibrate()`
    measured to be quicker for that count (each image is computed on its own in eval mode: padding changes no
    feature). The eager and compiled engines run through the extractor's own evaluation loop."""

    def __init__(self, extractor, threads):
        from reid.evaluation.distance import normalize
        self.extractor, self._normalize = extractor, normalize
        self.net = extractor.net                 # weights: built (or exported and loaded) here, once
        self.exported = extractor.engine in ("onnx", "mindir")
        self.onnx_files = tune_onnx_for_serving(self.net, threads) if extractor.engine == "onnx" else 0
        self.fixed = self.net if hasattr(self.net, "big") and hasattr(self.net, "single") else None
        self.pad_from = None    # fixed-batch files: the smallest remainder padded into one run of the big file

    def calibrate(self):
        """Warm-up: one run of each file, and for fixed-batch files the count of images from which one padded
        run of the big file is quicker than that many runs of the single one."""
        size = self.extractor.image_size
        self.run(np.zeros((1, 3) + size, np.float32))
        if self.fixed is None:
            return
        big, single = self.fixed.big, self.fixed.single
        one = np.zeros((1, 3) + size, np.float32)
        full = np.zeros((big.batch, 3) + size, np.float32)
        t_single = min(self._seconds(single.run, one) for _ in range(3))
        t_big = min(self._seconds(big.run, full) for _ in range(3))
        self.pad_from = max(1, min(big.batch, int(np.ceil(t_big / max(t_single, 1e-9)))))

    @staticmethod
    def _seconds(fn, arg):
        start = time.perf_counter()
        fn(arg)
        return time.perf_counter() - start

    def _run_files(self, images):
        if self.fixed is None:
            return self.net.run(images)
        big, single = self.fixed.big, self.fixed.single
        count = len(images)
        full = count - count % big.batch
        parts = [big.run(images[:full])] if full else []
        rest = images[full:]
        if len(rest):
            padded = self.pad_from is not None and len(rest) >= self.pad_from
            parts.append(big.run(rest) if padded else single.run(rest))     # ExportedModel.run pads a short chunk
        return np.concatenate(parts)

    def run(self, images):
        images = np.ascontiguousarray(images, np.float32)
        ex = self.extractor
        if self.exported:
            if ex.flip:
                both = self._run_files(np.concatenate([images, images[:, :, :, ::-1]]))
                n = len(images)
                features = (both[:n] + both[n:]) / np.float32(2.0)
            else:
                features = self._run_files(images)
        else:
            from reid.evaluation.extract import extract_features
            net = ex._prepare(len(images))        # the compiled graph's build for this batch size, once
            features = extract_features(net, [{"images": images}], ex.flip, compiled=ex.engine == "compiled")[0]
        features = np.ascontiguousarray(features, np.float32)
        return self._normalize(features) if ex.normalize else features


# ------------------------------------------------------------------------------------------------ batching
class Query:
    """One search request on its way through the server: its prepared image, what to search, where to answer."""

    __slots__ = ("image", "snap", "topk", "mode", "method", "name", "pid", "camid", "loop", "future", "timing",
                 "queued", "cancelled")

    def __init__(self, snap, topk, mode, method, loop):
        self.snap, self.topk, self.mode, self.method = snap, topk, mode, method
        self.loop, self.future = loop, loop.create_future()
        self.image = self.name = self.pid = self.camid = None
        self.timing, self.queued, self.cancelled = {}, 0.0, False


def _settle(answers):
    """On the event loop: each (future, result, exception) handed to its request (unless it left)."""
    for future, result, exc in answers:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


def answer_threadsafe(queries, results=None, exc=None):
    """Hand results (one per query) or one exception to the requests of `queries`, from any thread: one call
    into each event loop for all of them."""
    by_loop = {}
    for i, q in enumerate(queries):
        by_loop.setdefault(q.loop, []).append((q.future, None if results is None else results[i], exc))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, answers)
        except RuntimeError:      # the loop is closed: the requests are gone
            pass


class Batcher:
    """Dynamic batching of feature extraction (module docstring). Request handlers count a request in with
    `coming()` as its upload starts; the thread that prepares it (decoding, resizing) either queues it with
    `put(query)` or drops it with `gone()`. The queue is drained on `pool` (the model's one thread) only
    while it holds requests: a batch is every request queued (at most `max_batch`), after waiting, while
    some are still being uploaded or prepared, until the first one queued has waited `window_s`; with none
    on their way it does not wait. `run_batch(queries)` runs on that thread; requests that arrive meanwhile
    form the next batch."""

    def __init__(self, run_batch, pool, max_batch, window_s):
        import collections
        self.run_batch, self.pool = run_batch, pool
        self.max_batch, self.window_s = max(1, int(max_batch)), max(0.0, float(window_s))
        self._cond = threading.Condition()
        self._items = collections.deque()
        self._draining = self._closed = False
        self.on_the_way = 0      # requests counted in and not yet queued or dropped
        self.batches = self.images = self.largest = 0

    def queued(self):
        return len(self._items)

    def idle(self):
        """Whether the request counted in last is the only one in the batcher (none queued, none running, none
        other on its way): it may then be prepared on the model's thread, which is waiting anyway."""
        return self.on_the_way <= 1 and not self._draining and not self._items

    def waiting(self):
        """Requests queued or on their way."""
        return self.on_the_way + len(self._items)

    def coming(self):
        with self._cond:
            self.on_the_way += 1

    def gone(self):
        with self._cond:
            self.on_the_way -= 1
            self._cond.notify_all()

    def put(self, query, on_model_thread=False):
        """Queue a prepared request; `on_model_thread`: called there, where the queue is then drained at once."""
        with self._cond:
            self.on_the_way -= 1
            if self._closed:
                raise ApiError(503, "the server is stopping; send the request again to the next one")
            query.queued = time.perf_counter()
            self._items.append(query)
            self._cond.notify_all()
            start = not self._draining
            self._draining = True
        if start and on_model_thread:
            self._drain()
        elif start:
            try:
                self.pool.submit(self._drain)
            except RuntimeError:      # the pool was shut down: the server is stopping
                with self._cond:
                    self._draining = False

    def _next_batch(self):
        with self._cond:
            if not self._items or self._closed:
                self._draining = False
                return None
            deadline = self._items[0].queued + self.window_s
            while len(self._items) < self.max_batch and self.on_the_way > 0 and not self._closed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [self._items.popleft() for _ in range(min(self.max_batch, len(self._items)))]

    def _drain(self):
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            batch = [q for q in batch if not q.cancelled]     # clients that left
            if not batch:
                continue
            self.batches += 1
            self.images += len(batch)
            self.largest = max(self.largest, len(batch))
            try:
                self.run_batch(batch)
            except Exception as exc:   # a fault of the batch's: handed to each of its requests
                answer_threadsafe(batch, exc=exc)

    def close(self):
        """Stop taking requests; those still queued are answered 503."""
        with self._cond:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._cond.notify_all()
        if left:
            answer_threadsafe(left, exc=ApiError(503, "the server is stopping; send the request again"))


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


MAX_FORM_FILES, MAX_FORM_FIELDS, MAX_FIELD_BYTES = 4, 32, 1024 * 1024


def _form_problem(text):
    return ApiError(400, "the multipart body cannot be parsed (%s); send the image in the field 'image'" % text)


def parse_form(body, content_type):
    """{field name: (file name or None, bytes)} of a multipart/form-data body (the last part of each name),
    parsed in one go with python-multipart (the parser Starlette uses, with its rules: every part names its
    field, a part with a file name is a file; at most MAX_FORM_FILES files and MAX_FORM_FIELDS other fields,
    each of these at most MAX_FIELD_BYTES). Runs off the event loop."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise _form_problem("Missing boundary in multipart.")
    parts, state = {}, {"field": b"", "value": b"", "disposition": b"", "data": [], "size": 0, "files": 0,
                         "fields": 0}

    def on_part_begin():
        state.update(disposition=b"", data=[], size=0, name=None, filename=None)

    def on_header_field(data, start, end):
        state["field"] += data[start:end]

    def on_header_value(data, start, end):
        state["value"] += data[start:end]

    def on_header_end():
        if state["field"].lower() == b"content-disposition":
            state["disposition"] = state["value"]
        state["field"] = state["value"] = b""

    def on_headers_finished():
        _, options = parse_options_header(state["disposition"])
        if b"name" not in options:
            raise _form_problem('The Content-Disposition header field "name" must be provided.')
        state["name"] = options[b"name"].decode("utf-8", "replace")
        if b"filename" in options:
            state["files"] += 1
            if state["files"] > MAX_FORM_FILES:
                raise _form_problem("Too many files. Maximum number of files is %d." % MAX_FORM_FILES)
            state["filename"] = options[b"filename"].decode("utf-8", "replace")
        else:
            state["fields"] += 1
            if state["fields"] > MAX_FORM_FIELDS:
                raise _form_problem("Too many fields. Maximum number of fields is %d." % MAX_FORM_FIELDS)

    def on_part_data(data, start, end):
        state["size"] += end - start
        if state["filename"] is None and state["size"] > MAX_FIELD_BYTES:
            raise _form_problem("Part exceeded maximum size of %dKB." % (MAX_FIELD_BYTES // 1024))
        state["data"].append(data[start:end])

    def on_part_end():
        parts[state["name"]] = (state["filename"], b"".join(state["data"]))

    callbacks = {"on_part_begin": on_part_begin, "on_part_data": on_part_data, "on_part_end": on_part_end,
                 "on_header_field": on_header_field, "on_header_value": on_header_value,
                 "on_header_end": on_header_end, "on_headers_finished": on_headers_finished}
    try:
        parser = MultipartParser(boundary, callbacks)
        parser.write(body)
        parser.finalize()
    except FormParserError:
        raise _form_problem("Invalid multipart data.") from None
    return parts


def upload_image(body, content_type, max_upload):
    """(image file bytes, file name) of a search request's body: the multipart field `image`, or the whole body
    when it is sent as image/* or application/octet-stream."""
    kind = content_type.split(";")[0].strip().lower()
    if kind.startswith("image/") or kind == "application/octet-stream":
        if len(body) > max_upload:
            raise ApiError(413, "the image is %d bytes, over the server's limit of %d" % (len(body), max_upload))
        return body, None
    if kind != "multipart/form-data":
        raise ApiError(415, "send the image as multipart/form-data in the field 'image' (curl -F image=@photo.jpg), "
                       "or as the body with Content-Type image/jpeg; got %r" % (kind or "no Content-Type"))
    form = parse_form(body, content_type)
    item = form.get("image")
    if item is None or item[0] is None:
        raise ApiError(400, "no file in the multipart field 'image' (fields sent: %s); send the image there"
                       % (", ".join(sorted(form)[:8]) or "none"))
    filename, data = item
    if len(data) > max_upload:
        raise ApiError(413, "the image is %d bytes, over the server's limit of %d" % (len(data), max_upload))
    return data, os.path.basename(filename.replace("\\", "/")) or None


def json_body(entry):
    """The bytes Starlette's JSONResponse writes for `entry` (made off the event loop)."""
    import json
    return json.dumps(entry, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------------------------------------------ the app
class Service:
    """What the app runs on: the gallery, the extractor on its thread, the batcher and the thread pools.

    Threads, chosen for a server on C cores (`server_cores()`): the network on one thread of its own (ONNX
    Runtime's intra-op pool of C threads that do not spin, `tune_onnx_for_serving`), request preparation
    (multipart parsing, decoding, resizing) on a pool of C threads, so that the next batch's images are ready
    while one runs, and the search (with building the answer's JSON) on another pool of C threads, with
    numpy's BLAS at one thread (`BlasLimit`). The event loop only reads uploads and writes answers."""

    def __init__(self, settings, extractor_factory, model_pool=None):
        """`model_pool`: the one-thread executor the model runs on (default: one of its own, shut down with the
        service); given, the caller owns it (an extractor built there is reused by several services)."""
        self.settings = settings
        self.cores = server_cores()
        threads = settings.search_threads or self.cores
        self._own_pool = model_pool is None
        self.model_pool = model_pool or ThreadPoolExecutor(1, thread_name_prefix="acl-reid-model")
        self.prep_pool = ThreadPoolExecutor(threads, thread_name_prefix="acl-reid-prepare")
        self.search_pool = ThreadPoolExecutor(threads, thread_name_prefix="acl-reid-search")
        self.reload_pool = ThreadPoolExecutor(1, thread_name_prefix="acl-reid-reload")
        self._blas = BlasLimit()
        self.extractor = self.model_pool.submit(extractor_factory).result()
        self.describe = self.model_pool.submit(self.extractor.describe).result()
        self.gallery = self._open_gallery()
        self.model = self.model_pool.submit(ServingModel, self.extractor, settings.model_threads or self.cores
                                            ).result()
        self.transform = self.extractor.transform
        self.batcher = Batcher(self._run_batch, self.model_pool, settings.max_batch, settings.window_s)
        self.in_flight = self.refused = 0     # search requests in the server now; refused with 503 (event loop)
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

    def warm_up(self):
        """The model's one-time work (an export, a graph build) and its calibration before the first request."""
        if self.extractor.engine == "compiled":
            size = self.extractor.image_size
            self.model_pool.submit(self.model.run, np.zeros((self.settings.max_batch, 3) + size, np.float32)
                                   ).result()
        self.model_pool.submit(self.model.calibrate).result()

    async def start(self):
        self._tasks = []
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
        self.batcher.close()
        self.prep_pool.shutdown(wait=True)
        self.search_pool.shutdown(wait=True)
        self.reload_pool.shutdown(wait=True)
        self.gallery.close()
        if self._own_pool:
            self.model_pool.shutdown(wait=True)
        self._blas.restore()

    async def _watch(self):
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.reload_s)
            try:
                await loop.run_in_executor(self.reload_pool, self.gallery.reload_if_changed)
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

    def admit(self):
        """Count a search request in, or refuse it (503) when the server holds `max_queue` already."""
        if self.in_flight >= self.settings.max_queue:
            self.refused += 1
            raise ApiError(503, "the server is busy: %d search requests are in it, its limit; send the request "
                           "again in a moment (Retry-After)" % self.in_flight, {"Retry-After": "1"})
        self.in_flight += 1

    def prepare(self, query, read, on_model_thread=False):
        """On the preparation pool (or the model's thread, when it is idle): `read()` -> (RGB image, name, pid,
        camid) (parsing and decoding the upload, or reading a gallery file), resized by the test transform,
        then queued for the next batch. A problem answers the request at once."""
        start = time.perf_counter()
        try:
            image, query.name, query.pid, query.camid = read()
            query.image = self.transform(image)
        except Exception as exc:
            self.batcher.gone()
            answer_threadsafe([query], exc=exc)
            return
        query.timing["decode"] = time.perf_counter() - start
        try:
            self.batcher.put(query, on_model_thread)
        except ApiError as exc:
            answer_threadsafe([query], exc=exc)

    async def submit(self, query, read):
        """The request's answer (JSON bytes) once `read` has been prepared, extracted in a batch and searched.
        The caller has counted it in with `self.batcher.coming()`."""
        # a request alone is prepared, extracted and searched on the model's thread: no hand-over between
        # threads; with others in the server it is prepared on the preparation pool while a batch runs
        alone = self.batcher.idle()
        try:
            (self.model_pool if alone else self.prep_pool).submit(self.prepare, query, read, alone)
        except RuntimeError:
            self.batcher.gone()
            raise ApiError(503, "the server is stopping; send the request again") from None
        try:
            return await query.future
        except asyncio.CancelledError:
            query.cancelled = True        # the client left: its image is dropped from the batch
            raise

    def _run_batch(self, batch):
        """On the model thread: the batch's features, handed to the search pool."""
        features = self.model.run(np.stack([q.image for q in batch]))
        done = time.perf_counter()
        for q in batch:
            q.image = None
            q.timing["extract"] = done - q.queued
        if not self.batcher.waiting() and all(self._searched_quickly(q) for q in batch):
            self._search_batch(batch, features)       # nothing waits for the model: no hand-over
            return
        try:
            self.search_pool.submit(self._search_batch, batch, features)
        except RuntimeError:
            answer_threadsafe(batch, exc=ApiError(503, "the server is stopping; send the request again"))

    def _searched_quickly(self, query):
        """Whether the query's search takes a fraction of a millisecond (exact, in an .npz index of at most
        INLINE_SEARCH_VALUES values): then it runs on the model's thread when nothing else waits for it."""
        return (self.gallery.kind == "npz" and query.method == "exact"
                and query.snap.index.features.size <= INLINE_SEARCH_VALUES)

    def _search_batch(self, batch, features):
        """On the search pool: the queries of a batch that search alike (index snapshot, topk, filter, method)
        searched together, each answer's JSON made."""
        from reid.deploy.gallery import UNKNOWN
        groups = {}
        for row, q in enumerate(batch):
            groups.setdefault((id(q.snap), q.topk, q.mode, q.method), []).append(row)
        for rows in groups.values():
            queries = [batch[r] for r in rows]
            q0 = queries[0]
            start = time.perf_counter()
            try:
                pids = np.array([UNKNOWN if q.pid is None else q.pid for q in queries])
                camids = np.array([UNKNOWN if q.camid is None else q.camid for q in queries])
                lists = self.gallery.search(q0.snap, features[rows], q0.topk, q0.mode, pids, camids, q0.method)
                took = time.perf_counter() - start
                bodies = []
                for q, matches in zip(queries, lists):
                    q.timing["search"] = took
                    bodies.append((self._entry(q, matches), q.snap, q.timing))
            except UserError as exc:
                answer_threadsafe(queries, exc=ApiError(400, str(exc)))
                continue
            except Exception as exc:
                answer_threadsafe(queries, exc=exc)
                continue
            answer_threadsafe(queries, bodies)

    @staticmethod
    def _entry(q, matches):
        """The JSON of the entry tools/search.py writes for one query (plus each match's id)."""
        entry = {"query": q.name}
        if q.pid is not None:
            entry["pid"] = int(q.pid)
        if q.camid is not None:
            entry["camid"] = int(q.camid)
        entry["matches"] = []
        for gid, path, pid, camid, score in matches:
            match = {"path": path, "score": round(float(score), 6)}
            match.update({k: v for k, v in (("pid", pid), ("camid", camid)) if v is not None})
            match["id"] = gid
            entry["matches"].append(match)
        return json_body(entry)

    async def search(self, image, query, q_pid, q_camid, topk, mode, method, timing=None):
        """The entry tools/search.py writes for one decoded RGB image (a dict), and the snapshot searched; the
        Python API of what the search routes do."""
        import json
        snap = self.gallery.snapshot()
        self.options(topk, mode, method, snap)
        q = Query(snap, topk, mode, method, asyncio.get_running_loop())
        self.batcher.coming()
        body, snap, spent = await self.submit(q, lambda: (image, query, q_pid, q_camid))
        if timing is not None:
            timing.update(spent)
        return json.loads(body), snap

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
        b = self.batcher
        return dict(self.gallery.summary(snap), model=model,
                    limits={"max_upload_bytes": s.max_upload, "max_pixels": s.max_pixels, "max_topk": s.max_topk,
                            "max_queue": s.max_queue},
                    batching={"max_batch": s.max_batch, "window_ms": round(s.window_s * 1000, 3),
                              "batches": b.batches, "images": b.images, "largest": b.largest,
                              "in_flight": self.in_flight, "refused_busy": self.refused},
                    threads={"cores": self.cores, "model_intra_op": (s.model_threads or self.cores)
                             if self.model.onnx_files else None,
                             "prepare": self.prep_pool._max_workers, "search": self.search_pool._max_workers},
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


def _query_ids(given, name):
    """(pid, camid) of a query: the `pid` / `camid` parameters `given`, else a Market-1501-style file name's."""
    from reid.deploy.gallery import UNKNOWN, ids_from_name
    pid, camid = ids_from_name(name) if name else (UNKNOWN, UNKNOWN)
    return (given[0] if given[0] is not None else None if pid == UNKNOWN else int(pid),
            given[1] if given[1] is not None else None if camid == UNKNOWN else int(camid))


class TokenGuard:
    """ASGI middleware: every /api/ request but the health check must send `Authorization: Bearer TOKEN`, or
    is answered 401 (a plain ASGI layer: Starlette's BaseHTTPMiddleware would add a task and two streams to
    every request)."""

    def __init__(self, app, token, error):
        self.app, self.token, self.error = app, token.encode(), error

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/api/") and path != "/api/health":
            given = ""
            for key, value in scope.get("headers", ()):
                if key == b"authorization":
                    given = value.decode("latin-1")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode("latin-1", "replace"), self.token):
                response = self.error(401, "wrong access token" if token else "this server wants its access token: "
                                      "send the header 'Authorization: Bearer TOKEN' (the page asks for it once)")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(settings, extractor_factory=None, warm_up=True, ready=None, service=None):
    """The FastAPI app of `settings`, on `service` (a Service), or on one made when the app starts (its
    lifespan): `extractor_factory()` makes the FeatureExtractor on the model's thread, the gallery is opened and
    checked against that model, and the model warmed up (`warm_up`). `ready(service)` is called once it
    serves."""
    require_web()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
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

    def error(status, message, headers=None):
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(request, exc):
        return error(exc.status, exc.message, exc.headers)

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

    if settings.token:
        app.add_middleware(TokenGuard, token=settings.token, error=error)

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

    def answer(body, snap, timing):
        """The JSON, the index generation searched, and where the time went (Server-Timing, milliseconds)."""
        spent = ", ".join("%s;dur=%.1f" % (k, timing[k] * 1000) for k in ("upload", "decode", "extract", "search")
                          if k in timing)
        return Response(body, media_type="application/json",
                        headers={"X-Index-Generation": str(snap.generation), "Server-Timing": spent})

    def given_ids(request):
        return _int_param(request, "pid"), _int_param(request, "camid")

    @app.post("/api/search", summary="Search the gallery for an uploaded image", openapi_extra=search_doc,
              description="The JSON of one tools/search.py result, each match with its gallery id. " + params_doc)
    async def search(request: Request):
        svc = current()
        topk, mode, method = search_params(request)
        snap = svc.gallery.snapshot()
        svc.options(topk, mode, method, snap)     # before the upload is read
        given = given_ids(request)
        svc.admit()
        try:
            query = Query(snap, topk, mode, method, asyncio.get_running_loop())
            start = time.perf_counter()
            svc.batcher.coming()
            try:
                body = await _read_body(request, settings.max_upload + FORM_OVERHEAD)
            except BaseException:
                svc.batcher.gone()
                raise
            upload = time.perf_counter() - start
            content_type = request.headers.get("content-type", "")

            def read():        # on a preparation thread
                data, name = upload_image(body, content_type, settings.max_upload)
                image = decode_upload(data, settings.max_pixels)
                return (image, name or "upload") + _query_ids(given, name)
            entry, snap, timing = await svc.submit(query, read)
            timing["upload"] = upload
            return answer(entry, snap, timing)
        finally:
            svc.in_flight -= 1

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
        given = given_ids(request)
        pid, camid = (given[0] if given[0] is not None else pid), (given[1] if given[1] is not None else camid)
        svc.admit()
        try:
            query = Query(snap, topk, mode, method, asyncio.get_running_loop())
            svc.batcher.coming()
            entry, snap, timing = await svc.submit(query, lambda: (read_gallery_image(path), path, pid, camid))
            return answer(entry, snap, timing)
        finally:
            svc.in_flight -= 1

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
