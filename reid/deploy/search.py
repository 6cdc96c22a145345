"""Top-k search of query features in a gallery: exact in bounded memory (numpy), or through faiss.

Scores are cosine similarities of L2-normalised features (higher is better; 1 - score is test.py's cosine
distance). Ranks are ordered by (score descending, gallery index ascending), so exact ties are broken as the
evaluation breaks them.

Exact search never holds the query x gallery matrix: queries go in blocks, and for each block the gallery is
scanned in blocks; every gallery block gives its own top-k (a partial selection, reid.evaluation.rerank's
`topk_stable`), merged into the running top-k. Memory: the gallery itself plus one block of scores and one
float32 copy of a gallery block (each at most `block_elements` values, 16 MB by default).

Filters (`exclude`): "camera" leaves out the gallery images taken by the query's camera; "protocol" is the
evaluation protocol of test.py: the gallery images of the query's identity taken by its camera, and junk
images (pid -1), are left out. Where an id is not known (gallery.UNKNOWN) nothing is left out for it.

faiss (optional, `faiss-cpu`): "faiss-flat" is its exact inner-product index, "faiss-ivf" an inverted-file
index (approximate: it searches `nprobe` of `nlist` clusters), for galleries in the millions.
"""
import time

import numpy as np

from reid.errors import UserError
from reid.deploy.gallery import UNKNOWN

FILTERS = ("none", "camera", "protocol")
METHODS = ("exact", "faiss-flat", "faiss-ivf")
DEFAULT_BLOCK_ELEMENTS = 1 << 22
QUERY_BLOCK = 1024
JUNK_PID = -1


def exclusion(mode, q_pids=None, q_camids=None, g_pids=None, g_camids=None):
    """fn(q0, q1, g0, g1) -> bool mask (queries q0..q1-1 x gallery g0..g1-1) of the items `mode` leaves out, or
    None for "none"."""
    if mode not in FILTERS:
        raise UserError("unknown filter %r; use one of: %s" % (mode, ", ".join(FILTERS)))
    if mode == "none":
        return None
    q_camids, g_camids = np.asarray(q_camids, np.int64), np.asarray(g_camids, np.int64)
    if mode == "camera":
        def mask(q0, q1, g0, g1):
            qc, gc = q_camids[q0:q1, None], g_camids[None, g0:g1]
            return (qc == gc) & (qc != UNKNOWN)
        return mask
    q_pids, g_pids = np.asarray(q_pids, np.int64), np.asarray(g_pids, np.int64)

    def mask(q0, q1, g0, g1):
        qc, gc = q_camids[q0:q1, None], g_camids[None, g0:g1]
        qp, gp = q_pids[q0:q1, None], g_pids[None, g0:g1]
        same = (qp == gp) & (qc == gc) & (qp != UNKNOWN) & (qc != UNKNOWN)
        return same | (gp == JUNK_PID)
    return mask


def _merge(idx, scores, new_idx, new_scores, k):
    """Top-k of two candidate sets per row, by (score desc, index asc); the first set's indices are lower."""
    idx = np.concatenate([idx, new_idx], 1)
    scores = np.concatenate([scores, new_scores], 1)
    order = np.lexsort((idx, -scores), axis=1)[:, :k]
    return np.take_along_axis(idx, order, 1), np.take_along_axis(scores, order, 1)


def topk_blocks(num_queries, num_gallery, score_block, k, exclude=None, block_elements=DEFAULT_BLOCK_ELEMENTS,
                max_rows=None):
    """(indices (Q, k) int64, scores (Q, k) float32) of the k best gallery items per query, where
    score_block(q0, q1, g0, g1) gives the float32 scores of a block (at most `block_elements` of them, and at
    most `max_rows` gallery items). Rows with fewer than k items left after `exclude` are padded with index -1
    and score -inf."""
    from reid.evaluation.rerank import topk_stable
    k = int(k)
    if k < 1:
        raise UserError("--topk must be at least 1, got %d" % k)
    qb = max(1, min(num_queries, QUERY_BLOCK))
    gb = max(k, min(int(block_elements) // qb, int(max_rows or num_gallery)), 1)
    out_idx = np.full((num_queries, min(k, num_gallery)), -1, np.int64)
    out_sc = np.full(out_idx.shape, -np.inf, np.float32)
    for q0 in range(0, num_queries, qb):
        q1 = min(q0 + qb, num_queries)
        idx = np.zeros((q1 - q0, 0), np.int64)
        sc = np.zeros((q1 - q0, 0), np.float32)
        for g0 in range(0, num_gallery, gb):
            g1 = min(g0 + gb, num_gallery)
            block = np.asarray(score_block(q0, q1, g0, g1), np.float32)
            if exclude is not None:
                block[exclude(q0, q1, g0, g1)] = -np.inf
            top = topk_stable(-block, min(k, g1 - g0))
            idx, sc = _merge(idx, sc, top + g0, np.take_along_axis(block, top, 1), k)
        out_idx[q0:q1], out_sc[q0:q1] = idx, sc
    out_idx[~np.isfinite(out_sc)] = -1
    return out_idx, out_sc


def exact_search(queries, gallery, k, exclude=None, block_elements=DEFAULT_BLOCK_ELEMENTS):
    """Exact top-k by inner product of `queries` (Q, D) and `gallery` (G, D) (float32 or float16, an array or a
    memory map; normalised rows give cosine similarities); see topk_blocks."""
    queries = np.ascontiguousarray(queries, np.float32)
    _check_dims(queries, gallery)

    def score_block(q0, q1, g0, g1):
        return queries[q0:q1] @ np.asarray(gallery[g0:g1], np.float32).T
    # a gallery block is also copied to float32 when stored otherwise: at most block_elements values too
    rows = max(int(k), int(block_elements) // max(1, queries.shape[1]))
    return topk_blocks(len(queries), len(gallery), score_block, k, exclude, block_elements, max_rows=rows)


def _check_dims(queries, gallery):
    if queries.ndim != 2 or gallery.ndim != 2 or queries.shape[1] != gallery.shape[1]:
        raise UserError("query features %s and gallery features %s differ in size; search with the model the "
                        "index was made with" % (queries.shape, gallery.shape))


def import_faiss():
    try:
        import faiss
    except ImportError:
        raise UserError("faiss is not installed; pip install faiss-cpu==1.8.0.post1 (it is in the requirements "
                        "files), or search with --method exact") from None
    return faiss


def build_faiss(gallery, method="faiss-flat", nlist=None, train_size=None, seed=0):
    """A faiss inner-product index of `gallery`, added in blocks (faiss keeps its own float32 copy). IVF:
    `nlist` clusters (default sqrt(G): its k-means and the assignment of every row cost G x nlist x D;
    docs/retrieval.md has the times), trained on `train_size` sampled rows (default 40 per cluster)."""
    faiss = import_faiss()
    if method not in METHODS[1:]:
        raise UserError("unknown faiss method %r; use %s" % (method, " or ".join(METHODS[1:])))
    n, d = gallery.shape
    if method == "faiss-flat":
        index = faiss.IndexFlatIP(d)
    else:
        nlist = int(nlist or max(1, min(n // 39, int(np.sqrt(n)))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        count = min(n, int(train_size or 40 * nlist))
        rows = np.sort(np.random.default_rng(seed).choice(n, count, replace=False))
        index.train(np.ascontiguousarray(gallery[rows], np.float32))
    step = max(1, (1 << 26) // max(d, 1))
    for start in range(0, n, step):
        index.add(np.ascontiguousarray(gallery[start:start + step], np.float32))
    return index


def faiss_search(index, queries, k, exclude=None, nprobe=None):
    """(indices, scores) as exact_search gives, from a faiss index; with `exclude`, rows whose top-k lost items
    to it are searched again deeper until k are left or the gallery is exhausted."""
    queries = np.ascontiguousarray(queries, np.float32)
    if nprobe is not None and hasattr(index, "nprobe"):
        index.nprobe = int(nprobe)
    n, k = index.ntotal, int(k)
    width = min(k, n)
    out_idx = np.full((len(queries), width), -1, np.int64)
    out_sc = np.full(out_idx.shape, -np.inf, np.float32)
    rows, depth = np.arange(len(queries)), width
    while len(rows):
        scores, idx = index.search(queries[rows], depth)
        scores = scores.astype(np.float32)
        if exclude is not None:
            for j, r in enumerate(rows):
                valid = idx[j] >= 0
                if valid.any():
                    gone = exclude(r, r + 1, 0, n)[0][idx[j][valid]]
                    scores[j, np.flatnonzero(valid)[gone]] = -np.inf
        scores[idx < 0] = -np.inf
        order = np.lexsort((np.where(idx < 0, n, idx), -scores), axis=1)[:, :width]
        top_idx, top_sc = np.take_along_axis(idx, order, 1), np.take_along_axis(scores, order, 1)
        out_idx[rows], out_sc[rows] = top_idx, top_sc
        short = np.isinf(top_sc).any(1) & (depth < n)
        rows, depth = rows[short], min(n, depth * 4)
    out_idx[~np.isfinite(out_sc)] = -1
    return out_idx, out_sc


def search(queries, gallery, k, exclude=None, method="exact", nlist=None, nprobe=None):
    """(indices, scores, seconds spent building a faiss index) of `method` (METHODS)."""
    if method not in METHODS:
        raise UserError("unknown search method %r; use one of: %s" % (method, ", ".join(METHODS)))
    if method == "exact":
        return exact_search(queries, gallery, k, exclude) + (0.0,)
    _check_dims(np.asarray(queries), gallery)
    start = time.perf_counter()
    index = build_faiss(gallery, method, nlist)
    built = time.perf_counter() - start
    return faiss_search(index, queries, k, exclude, nprobe) + (built,)


def rank1_from_lists(indices, q_pids, g_pids, q_camids, g_camids):
    """(Rank-1 in percent, queries counted) of ranked lists searched with the "protocol" filter: a query counts
    when its identity is known and the gallery holds it in another camera (test.py's valid queries), and scores
    when its first match is that identity."""
    q_pids, g_pids = np.asarray(q_pids), np.asarray(g_pids)
    q_camids, g_camids = np.asarray(q_camids), np.asarray(g_camids)
    hits = counted = 0
    for q, row in enumerate(indices):
        if q_pids[q] in (UNKNOWN, JUNK_PID) or not ((g_pids == q_pids[q]) & (g_camids != q_camids[q])).any():
            continue
        counted += 1
        hits += int(row[0] >= 0 and g_pids[row[0]] == q_pids[q])
    return (100.0 * hits / counted if counted else float("nan")), counted


MAX_RERANK_GALLERY = 20000   # re-ranking holds gallery x gallery float32 distances (docs/retrieval.md#search)


def rank_gallery(queries, gallery, k, exclude=None, method="exact", rerank=None, aqe=None, nlist=None, nprobe=None):
    """The ranked lists of test.py's options on top of `search`: `aqe` (dict of reid.evaluation.aqe's options)
    expands query and gallery features first; `rerank` (dict of re_ranking's options) replaces the scores by
    k-reciprocal re-ranked distances. Returns dict(indices, values, value ("score": cosine similarity, higher
    is better; "distance" after re-ranking, lower is better), build_seconds)."""
    from reid.evaluation import aqe as expand, compute_distance, re_ranking
    from reid.evaluation.distance import normalize
    if (rerank or aqe) and method != "exact":
        raise UserError("re-ranking and query expansion run on exact search; leave out --method %s" % method)
    if aqe:
        queries, gallery = (normalize(f) for f in expand(queries, gallery, **aqe))
    if not rerank:
        idx, scores, built = search(queries, gallery, k, exclude, method, nlist, nprobe)
        return {"indices": idx, "values": scores, "value": "score", "build_seconds": built}
    if len(gallery) > MAX_RERANK_GALLERY:
        raise UserError("re-ranking holds gallery x gallery distances in memory: %d gallery images is more than the "
                        "%d it is offered for; search without --rerank" % (len(gallery), MAX_RERANK_GALLERY))
    distances = re_ranking(compute_distance(queries, gallery), compute_distance(queries, queries),
                           compute_distance(gallery, gallery), **rerank)
    idx, neg = topk_blocks(len(queries), len(gallery), lambda q0, q1, g0, g1: -distances[q0:q1, g0:g1], k, exclude)
    return {"indices": idx, "values": -neg, "value": "distance", "build_seconds": 0.0}
