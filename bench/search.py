"""Gallery search at scale: exact top-k (reid.deploy.search, numpy, gallery blocks) against faiss's exact flat
index and its approximate IVF index, on 100k and 1M gallery vectors at the full model's feature size (2048):

  build     seconds to build the index (faiss: add / train + add; ours: nothing beyond the array)
  queries/s top-10 search of the query set, all queries in one call
  peak RSS  each method runs in a process of its own, which generates the gallery itself, chunk by chunk
  recall@10 of each method's top-10 against our exact top-10
  same      ours exact against faiss flat: queries whose ranked lists are identical, and whether every
            difference is a tie (scores within 1e-5)

The gallery: random unit vectors (seeded, chunk by chunk, so every process builds the same one), with 10
planted near-duplicates of each query at cosine similarities from ~0.95 to ~0.45 (a random pair at this size
is ~0 +- 0.02), so that every query has a true top-10 for the approximate index to find. "exact, float16" is
our search over a float16 gallery (tools/index.py --float16: half the memory).

--store milvus adds Milvus Lite rows (reid.deploy.milvus_store, the code tools/index.py --store runs): the
gallery inserted into a collection of a new Milvus Lite file, then searched with its FLAT (exact), IVF_FLAT
and HNSW indexes. Both environments have Milvus Lite 3 (in the process, on faiss; an older Milvus Lite 2.5
runs its C++ engine in a child process, FLAT and IVF only); --milvus picks them
(ENV:INDEX[:MODE]; python: pymilvus on protobuf's pure-Python implementation, which MindSpore sets for any
process that imports it; ms-here: MindSpore imported first (through compat, as the extraction does), then the
collection opened in this process, the one order that works there; ms: the same, the collection opened as
tools/index.py opens it on the MindSpore backend, in a process of its own, milvus_store.open_store):

  insert    rows/s of the inserts (build: the seconds from the last insert until the first search answered:
            flush and index build)
  peak RSS  the process's, plus Milvus Lite 2.5's engine process's where one runs (the sum of the two peaks)
  disk      the size of the Milvus Lite file (folder) afterwards

    python bench/search.py [--sizes 100k,1m] [--queries 200] [--nprobe 16,64,256]
    python bench/search.py --store milvus [--milvus torch:flat,torch:ivf,torch:hnsw,mindspore:flat,mindspore:ivf]
        [--ef 64,256]
"""
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import run_isolated  # noqa: E402

SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
MILVUS = "torch:flat,torch:ivf,torch:hnsw,mindspore:flat,mindspore:ivf,mindspore:flat:python"
MODES = {"python": "protobuf python", "ms-here": "MindSpore first, this process",
         "ms": "MindSpore first, own process"}
HNSW = {"M": 16, "efConstruction": 200}
# a Milvus process above this is stopped and its rows say so (Milvus Lite 3 keeps the collection in the process;
# the machine's other jobs keep their memory)
MAX_RSS_MB = 20000
DIM = 2048
CHUNK = 16384
PLANTS = 10
TOPK = 10


def _normalize(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def queries_and_plants(num_gallery, num_queries, seed=0):
    """(queries (Q, DIM), planted {gallery row: (query, noise scale)})."""
    rng = np.random.default_rng([seed, 0])
    queries = _normalize(rng.standard_normal((num_queries, DIM), dtype=np.float32))
    rows = rng.choice(num_gallery, num_queries * PLANTS, replace=False)
    scales = np.tile(np.linspace(0.3, 2.0, PLANTS), num_queries)   # similarity ~ 1 / sqrt(1 + scale^2)
    return queries, {int(r): (i // PLANTS, float(s)) for i, (r, s) in enumerate(zip(rows, scales))}


def gallery_chunk(start, num_gallery, queries, plants, seed=0):
    """Rows start..start+CHUNK-1 of the gallery (the same for every caller)."""
    stop = min(start + CHUNK, num_gallery)
    rng = np.random.default_rng([seed, 1, start])
    chunk = rng.standard_normal((stop - start, DIM), dtype=np.float32)
    for row in range(start, stop):
        if row in plants:
            q, scale = plants[row]
            noise = np.random.default_rng([seed, 2, row]).standard_normal(DIM, dtype=np.float32) / np.sqrt(DIM)
            chunk[row - start] = queries[q] + np.float32(scale) * noise
    return _normalize(chunk)


def chunks(num_gallery, queries, plants):
    for start in range(0, num_gallery, CHUNK):
        yield start, gallery_chunk(start, num_gallery, queries, plants)


def run(method, num_gallery, num_queries, nprobe=None):
    """One method in this process: {"build", "search" seconds, "indices", "scores"}."""
    from reid.deploy import search as ours
    queries, plants = queries_and_plants(num_gallery, num_queries)
    out = {}
    if method.startswith("exact"):
        dtype = np.float16 if method.endswith("float16") else np.float32
        gallery = np.empty((num_gallery, DIM), dtype)
        for start, chunk in chunks(num_gallery, queries, plants):
            gallery[start:start + len(chunk)] = chunk
        out["build"] = 0.0
        start = time.perf_counter()
        out["indices"], out["scores"] = ours.exact_search(queries, gallery, TOPK)
        out["search"] = time.perf_counter() - start
        return out
    faiss = ours.import_faiss()
    build = 0.0        # generating the gallery is not counted
    if method == "faiss-flat":
        index = faiss.IndexFlatIP(DIM)
    else:
        nlist = int(np.sqrt(num_gallery))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, nlist, faiss.METRIC_INNER_PRODUCT)
        train = np.concatenate([chunk for _, chunk in chunks(min(num_gallery, 40 * nlist), queries, plants)])
        start = time.perf_counter()
        index.train(train)
        build += time.perf_counter() - start
        del train
        out["nlist"] = nlist
    for _, chunk in chunks(num_gallery, queries, plants):
        start = time.perf_counter()
        index.add(chunk)
        build += time.perf_counter() - start
    out["build"] = build
    searches = {}
    for probe in (nprobe or [None]):
        if probe is not None:
            index.nprobe = int(probe)
        start = time.perf_counter()
        scores, indices = index.search(queries, TOPK)
        searches[probe] = (time.perf_counter() - start, indices.astype(np.int64), scores)
    out["searches"] = searches
    return out


def run_milvus(index_type, num_gallery, num_queries, nprobe=None, ef=None, protobuf=None):
    """One Milvus Lite collection of the gallery in this process's environment: {"insert", "build" seconds,
    "searches" {parameter: (seconds, indices, scores)}, "engine_peak_mb", "disk_mb", "lite"}. `protobuf`:
    "python" runs pymilvus on protobuf's pure-Python implementation, as in a process that imported MindSpore
    (it sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, which this process would otherwise inherit
    from the benchmark's own); "ms-here": MindSpore imported first through compat, the collection in this
    process; "ms": MindSpore imported first, the collection opened by open_store (in a process of its own);
    None: protobuf's default, no MindSpore."""
    import tempfile
    os.environ.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    if protobuf == "python":
        os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = protobuf

    from reid.deploy import milvus_store as store
    from reid.deploy.gallery import INDEX_FORMAT
    if protobuf in ("ms", "ms-here"):
        import compat
        compat.torch            # MindSpore, as the extraction of tools/index.py imports it
        store.SEPARATE_PROCESS = protobuf == "ms"
    queries, plants = queries_and_plants(num_gallery, num_queries)
    out = {"lite": store.lite_version()}
    with tempfile.TemporaryDirectory(prefix="bench-milvus-") as folder:
        spec = store.parse_store("milvus:" + os.path.join(folder, "g.db"))
        gallery = store.open_store(spec) if protobuf in ("ms", "ms-here") else store.MilvusGallery(spec)
        params = {"ivf": {"nlist": int(np.sqrt(num_gallery))}, "hnsw": HNSW}.get(index_type)
        gallery.create({"format": INDEX_FORMAT, "root": folder, "feature_size": DIM, "model": {}}, DIM, index_type,
                       params)
        insert = 0.0
        ids = np.zeros(CHUNK, np.int64)
        for start, chunk in chunks(num_gallery, queries, plants):
            paths = ["%08d.jpg" % i for i in range(start, start + len(chunk))]
            begin = time.perf_counter()
            gallery.upsert(paths, chunk, ids, ids, ids, ids, new=True)
            insert += time.perf_counter() - begin
        out["insert"] = insert
        begin = time.perf_counter()
        gallery.flush()
        gallery.search(queries[:1], TOPK)
        out["build"] = time.perf_counter() - begin
        searches = {}
        for value in ({"ivf": nprobe, "hnsw": ef}.get(index_type) or [None]):
            begin = time.perf_counter()
            lists = gallery.search(queries, TOPK, nprobe=value if index_type == "ivf" else None,
                                   ef=value if index_type == "hnsw" else None)
            seconds = time.perf_counter() - begin
            indices = np.array([[int(p[:-4]) for p, *_ in row] for row in lists], np.int64)
            scores = np.array([[m[1] for m in row] for row in lists], np.float32)
            searches[value] = (seconds, indices, scores)
        out["searches"] = searches
        out["engine_peak_mb"] = _lite_engine_peak_mb(spec.lite)
        gallery.close()
        out["disk_mb"] = sum(os.path.getsize(os.path.join(top, name)) for top, _, names in os.walk(folder)
                             for name in names) / 1e6
    return out


def _lite_engine_peak_mb(path):
    """Peak RSS of Milvus Lite 2.5's engine process for the file `path` (0: Milvus Lite 3 runs in this one)."""
    from milvus_lite.server_manager import server_manager_instance
    from bench.timing import _rss_mb
    for key, server in server_manager_instance._servers.items():
        process = getattr(server, "_p", None)
        if os.path.realpath(str(key)) == os.path.realpath(path) and process is not None:
            return _rss_mb(process.pid, "VmHWM")
    return 0.0


def compare_lists(a_idx, a_sc, b_idx, b_sc, tie=1e-5):
    """(queries whose ranked lists are identical, whether every difference is a tie): the scores agree rank for
    rank within `tie`, and an item ranked differently has a score within `tie` of the item it replaces."""
    same = int((a_idx == b_idx).all(1).sum())
    ties_only = True
    for q in np.flatnonzero(~(a_idx == b_idx).all(1)):
        if np.abs(a_sc[q] - b_sc[q]).max() > tie:
            ties_only = False
            continue
        for r in np.flatnonzero(a_idx[q] != b_idx[q]):
            group = set(a_idx[q][np.abs(a_sc[q] - a_sc[q, r]) <= tie])
            at_the_end = a_sc[q, r] - a_sc[q, -1] <= tie        # tied with the last rank: either may be left out
            ties_only &= bool(b_idx[q, r] in group or at_the_end)
    return same, ties_only


def recall(approx, exact):
    return float(np.mean([len(set(a) & set(e)) / float(len(e)) for a, e in zip(approx, exact)]))


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1m", help="comma-separated: %s" % ", ".join(SIZES))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--nprobe", default="16,64,256", help="faiss-ivf clusters searched per query (comma-separated)")
    parser.add_argument("--store", choices=("npz", "milvus"), default="npz", help="milvus: add Milvus Lite rows")
    parser.add_argument("--milvus", default=MILVUS, help="ENV:INDEX pairs for --store milvus (default %(default)s)")
    parser.add_argument("--ef", default="64,256", help="Milvus HNSW candidates per query (comma-separated)")
    args = parser.parse_args()
    nprobe = [int(v) for v in args.nprobe.split(",") if v]
    ef = [int(v) for v in args.ef.split(",") if v]
    milvus = [tuple(v.split(":")) for v in args.milvus.split(",") if v] if args.store == "milvus" else []
    for size in args.sizes.split(","):
        n = SIZES[size]
        print("%s gallery vectors x %d dims (%.1f GB as float32), %d queries, top-%d" % (
            size, DIM, n * DIM * 4 / 1e9, args.queries, TOPK), flush=True)
        got = {}
        for method in ("exact", "exact, float16", "faiss-flat", "faiss-ivf"):
            kwargs = dict(method=method, num_gallery=n, num_queries=args.queries,
                          nprobe=nprobe if method == "faiss-ivf" else None)
            got[method] = run_isolated("mindspore", "bench.search:run", kwargs)
        exact = got["exact"]
        rows = [("exact (ours, numpy)", exact["build"], exact["search"], exact["indices"], exact["scores"],
                 exact["peak_rss_mb"]),
                ("exact, float16 (ours)", 0.0, got["exact, float16"]["search"], got["exact, float16"]["indices"],
                 got["exact, float16"]["scores"], got["exact, float16"]["peak_rss_mb"])]
        flat = got["faiss-flat"]
        seconds, idx, scores = flat["searches"][None]
        rows.append(("faiss IndexFlatIP", flat["build"], seconds, idx, scores, flat["peak_rss_mb"]))
        ivf = got["faiss-ivf"]
        for probe, (seconds, idx, scores) in ivf["searches"].items():
            rows.append(("faiss IVFFlat nlist %d nprobe %d" % (ivf["nlist"], probe), ivf["build"], seconds, idx,
                         scores, ivf["peak_rss_mb"]))
        extra = {}
        for env, index_type, *protobuf in milvus:
            got = run_isolated(env, "bench.search:run_milvus", dict(index_type=index_type, num_gallery=n,
                                                                    num_queries=args.queries, nprobe=nprobe, ef=ef,
                                                                    protobuf=protobuf[0] if protobuf else None),
                               timeout=6 * 3600, max_rss_mb=MAX_RSS_MB)
            if "killed_above_mb" in got:
                print("  %s %s on %s: not measured, stopped above %d MB of resident memory" % (
                    "Milvus Lite", index_type.upper(), env, MAX_RSS_MB), flush=True)
                continue
            for value, (seconds, idx, scores) in got["searches"].items():
                parameter = "" if value is None else " %s %d" % ("nprobe" if index_type == "ivf" else "ef", value)
                label = "Milvus Lite %s %s%s%s" % (got["lite"], index_type.upper(), parameter,
                                                   ", " + MODES[protobuf[0]] if protobuf else "")
                rows.append((label, got["build"], seconds, idx, scores, got["peak_rss_mb"] + got["engine_peak_mb"]))
                extra[label] = (n / got["insert"], got["disk_mb"])
        print("  %-44s %9s %11s %11s %10s %10s %8s" % ("method", "build s", "queries/s", "peak RSS MB", "recall@10",
                                                      "insert/s", "disk MB"))
        for name, build, seconds, idx, _, rss in rows:
            rate, disk = extra.get(name, (None, None))
            print("  %-44s %9.1f %11.1f %11.0f %10.4f %10s %8s" % (
                name, build, args.queries / seconds, rss, recall(idx, exact["indices"]),
                "-" if rate is None else "%.0f" % rate, "-" if disk is None else "%.0f" % disk), flush=True)
        same, ties_only = compare_lists(exact["indices"], exact["scores"], flat["searches"][None][1],
                                        flat["searches"][None][2])
        print("  ours exact vs faiss IndexFlatIP: %d of %d ranked lists identical; every difference a tie: %s"
              % (same, args.queries, "yes" if ties_only else "NO"))


if __name__ == "__main__":
    main()
