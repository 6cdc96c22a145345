"""Query x gallery distances in numpy, computed in row blocks.

* ``cosine``: 1 - <q/|q|, g/|g|> (fast-reid's test metric; L2 normalisation with eps 1e-12 as F.normalize).
* ``euclidean``: the true Euclidean distance sqrt(max(|q|^2 + |g|^2 - 2 q.g, 0)). fast-reid returns the squared
  value; the ranking is the same, and the k-reciprocal re-ranking squares its input as in the original.
"""
import numpy as np

from reid.errors import UserError

METRICS = ("cosine", "euclidean")
DEFAULT_BLOCK_ELEMENTS = 1 << 23


def _as_features(x, name):
    x = np.asarray(x)
    if x.ndim != 2:
        raise UserError("%s must be a 2-D (num_samples, dim) feature array, got shape %s" % (name, x.shape))
    if x.dtype != np.float64:
        x = x.astype(np.float32, copy=False)
    return x


def normalize(x, eps=1e-12):
    norm = np.sqrt((x.astype(np.float64) ** 2).sum(1, keepdims=True))
    return (x / np.maximum(norm, eps)).astype(x.dtype, copy=False)


def check_metric(metric):
    if metric not in METRICS:
        raise UserError("unknown distance metric %r; use one of: %s (TEST.METRIC)" % (metric, ", ".join(METRICS)))


def distance_blocks(qf, gf, metric="cosine", chunk_size=None):
    """Yield (start, stop, block) with block = distances of queries start..stop-1 to the whole gallery."""
    check_metric(metric)
    qf, gf = _as_features(qf, "query features"), _as_features(gf, "gallery features")
    if qf.shape[1] != gf.shape[1]:
        raise UserError("query features have dim %d but gallery features dim %d" % (qf.shape[1], gf.shape[1]))
    if metric == "cosine":
        qf, gf = normalize(qf), normalize(gf)
    else:
        g_sq = (gf.astype(np.float64) ** 2).sum(1).astype(gf.dtype)
    step = int(chunk_size) if chunk_size else max(1, DEFAULT_BLOCK_ELEMENTS // max(1, gf.shape[0]))
    for start in range(0, qf.shape[0], step):
        q = qf[start:start + step]
        dot = q @ gf.T
        if metric == "cosine":
            block = 1.0 - dot
        else:
            q_sq = (q.astype(np.float64) ** 2).sum(1).astype(q.dtype)
            block = np.sqrt(np.maximum(q_sq[:, None] + g_sq[None, :] - 2.0 * dot, 0.0))
        yield start, start + q.shape[0], block.astype(np.result_type(qf, gf), copy=False)


def compute_distance(qf, gf, metric="cosine", chunk_size=None):
    """(num_query, num_gallery) distance matrix (float32 for float32 features)."""
    qf, gf = _as_features(qf, "query features"), _as_features(gf, "gallery features")
    out = np.empty((qf.shape[0], gf.shape[0]), dtype=np.result_type(qf, gf))
    for start, stop, block in distance_blocks(qf, gf, metric, chunk_size):
        out[start:stop] = block
    return out
