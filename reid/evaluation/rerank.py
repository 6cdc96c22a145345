"""k-reciprocal re-ranking (Zhong et al., CVPR 2017), numpy, vectorised.

Same algorithm and defaults (k1 20, k2 6, lambda 0.3) as the authors' reference code used by torchreid:

1. ``original`` = the squared distances of the joint set (queries then gallery), each row divided by its max.
2. ``R(i)`` = the k-reciprocal neighbours of i among its k1+1 nearest: j in top(i) with i in top(j).
   The set is expanded with ``R_half(c)`` (k = round(k1/2)) of each c in R(i) that shares more than 2/3 of
   its members with R(i).
3. ``V[i, j]`` = exp(-original[i, j]) normalised over the expanded set (0 elsewhere); then local query
   expansion: V[i] = mean of V over i's k2 nearest neighbours.
4. Jaccard distance 1 - sum(min(V_i, V_j)) / sum(max(V_i, V_j)); final = (1 - lambda) * jaccard +
   lambda * original, query rows x gallery columns.

Nearest-neighbour lists use a stable order (distance, then index). V is kept sparse (each row has at most a few
hundred non-zeros) and the joint N x N distance matrix is never materialised: rows are assembled from the three
blocks in chunks. Memory: the input blocks plus O(N * k1^2).
"""
import numpy as np

from reid.errors import UserError

DEFAULT_BLOCK_ELEMENTS = 1 << 22


class _JointDistances(object):
    """Rows and entries of the joint ((Q+G) x (Q+G)) squared, row-max-normalised distance, from the blocks."""

    def __init__(self, q_g, q_q, g_g):
        self.q_g, self.q_q, self.g_g = (np.asarray(a, dtype=np.float32) for a in (q_g, q_q, g_g))
        self.nq, self.ng = self.q_g.shape
        if self.q_q.shape != (self.nq, self.nq) or self.g_g.shape != (self.ng, self.ng):
            raise UserError("re-ranking needs q_g (Q,G), q_q (Q,Q) and g_g (G,G) distances; got %s, %s, %s"
                            % (self.q_g.shape, self.q_q.shape, self.g_g.shape))
        self.n = self.nq + self.ng
        self.row_max = np.empty(self.n, np.float32)

    def raw_rows(self, start, stop):
        """Squared distances of joint rows start..stop-1 (not normalised)."""
        parts = []
        if start < self.nq:
            a, b = start, min(stop, self.nq)
            parts.append(np.concatenate([self.q_q[a:b], self.q_g[a:b]], 1))
        if stop > self.nq:
            a, b = max(start, self.nq) - self.nq, stop - self.nq
            parts.append(np.concatenate([self.q_g[:, a:b].T, self.g_g[a:b]], 1))
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.square(rows)

    def entries(self, i, j):
        """Normalised joint distances at index arrays (i, j) (same shape); needs row_max filled."""
        i, j = np.broadcast_arrays(np.asarray(i), np.asarray(j))
        out = np.empty(i.shape, np.float32)
        iq, jq = i < self.nq, j < self.nq
        for mask, block, ii, jj in ((iq & jq, self.q_q, i, j), (iq & ~jq, self.q_g, i, j - self.nq),
                                    (~iq & jq, self.q_g, j, i - self.nq),
                                    (~iq & ~jq, self.g_g, i - self.nq, j - self.nq)):
            out[mask] = block[ii[mask], jj[mask]]
        return np.square(out) / self.row_max[i]


def topk_stable(rows, k):
    """First k columns of a stable argsort of each row (ties by index), without sorting whole rows."""
    n = rows.shape[1]
    if k >= n:
        return np.argsort(rows, axis=1, kind="stable")
    part = np.argpartition(rows, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(rows, part, 1).max(1)
    # The selection is exact unless values equal to the k-th one straddle the boundary.
    ambiguous = np.flatnonzero((rows <= kth[:, None]).sum(1) > k)
    vals = np.take_along_axis(rows, part, 1)
    order = np.lexsort((part, vals), axis=1)
    top = np.take_along_axis(part, order, 1)
    for r in ambiguous:
        top[r] = np.argsort(rows[r], kind="stable")[:k]
    return top


def _reciprocal(rank, k):
    """Mask (N, k+1): rank[i, t] is a k-reciprocal neighbour of i."""
    fwd = rank[:, :k + 1]
    back = rank[fwd, :k + 1]
    return (back == np.arange(rank.shape[0])[:, None, None]).any(2)


def _row_unique(padded):
    """Per row unique non-negative values of a -1-padded int array: (sorted values, validity mask)."""
    vals = np.sort(padded, axis=1)
    keep = vals >= 0
    keep[:, 1:] &= vals[:, 1:] != vals[:, :-1]
    return vals, keep


def _sparse_rows(cols, vals, keep):
    """CSR triplet arrays (indptr, indices, data) from padded per-row arrays."""
    counts = keep.sum(1)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return indptr, cols[keep].astype(np.int64), vals[keep]


def _gather_ranges(starts, lengths):
    """Concatenation of the index ranges [s, s+l) for each (s, l)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + np.arange(total) - offsets


def re_ranking(q_g_dist, q_q_dist, g_g_dist, k1=20, k2=6, lambda_value=0.3, chunk_size=None):
    """Re-ranked (Q, G) distance matrix (float32). See the module docstring."""
    k1, k2 = int(k1), int(k2)
    if k1 < 1 or k2 < 1 or not 0.0 <= float(lambda_value) <= 1.0:
        raise UserError("re-ranking needs K1 >= 1, K2 >= 1 and 0 <= LAMBDA <= 1 (TEST.RERANK), got %s, %s, %s"
                        % (k1, k2, lambda_value))
    joint = _JointDistances(q_g_dist, q_q_dist, g_g_dist)
    n, nq = joint.n, joint.nq
    step = int(chunk_size) if chunk_size else max(1, DEFAULT_BLOCK_ELEMENTS // n)

    # Nearest neighbours of every joint row (row normalisation does not change a row's order).
    kk = min(max(k1 + 1, k2), n)
    rank = np.empty((n, kk), np.int64)
    for start in range(0, n, step):
        rows = joint.raw_rows(start, min(start + step, n))
        mx = rows.max(1)
        joint.row_max[start:start + len(rows)] = np.where(mx > 0, mx, 1.0)
        rank[start:start + len(rows)] = topk_stable(rows, kk)

    k1 = min(k1, kk - 1)
    half = int(np.around(k1 / 2.0))
    recip = _reciprocal(rank, k1)                                   # (N, k1+1)
    recip_half = _reciprocal(rank, half)                            # (N, half+1)
    fwd = rank[:, :k1 + 1]
    members = np.where(recip, fwd, -1)                              # R(i), -1 padded
    half_members = np.where(recip_half, rank[:, :half + 1], -1)     # R_half(i)

    # Expansion: add R_half(c) for every c in R(i) sharing > 2/3 of R_half(c) with R(i).
    cols_parts = []
    exp_step = max(1, DEFAULT_BLOCK_ELEMENTS // ((k1 + 1) ** 2 * (half + 1)))
    for start in range(0, n, exp_step):
        stop = min(start + exp_step, n)
        mem = members[start:stop]                                   # (c, k1+1)
        cand_half = half_members[fwd[start:stop]]                   # (c, k1+1, half+1)
        valid_half = cand_half >= 0
        shared = ((cand_half[:, :, :, None] == mem[:, None, None, :]) & (mem[:, None, None, :] >= 0)).any(3)
        inter = (shared & valid_half).sum(2)
        accept = recip[start:stop] & (inter > 2.0 / 3.0 * valid_half.sum(2))
        added = np.where(accept[:, :, None] & valid_half, cand_half, -1).reshape(stop - start, -1)
        cols_parts.append(np.concatenate([mem, added], 1))
    expansion, keep = _row_unique(np.concatenate(cols_parts))

    # V: exp(-distance) over the expanded set, normalised per row (sparse, CSR).
    row_ids = np.broadcast_to(np.arange(n)[:, None], expansion.shape)
    weights = np.zeros(expansion.shape, np.float32)
    weights[keep] = np.exp(-joint.entries(row_ids[keep], expansion[keep]))
    total = weights.sum(1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)  # an empty set (only with massive exact ties) stays all-zero
    indptr, indices, data = _sparse_rows(expansion, weights, keep)

    if k2 != 1:  # local query expansion: mean of V over the k2 nearest neighbours
        nbrs = rank[:, :k2]
        lengths = (indptr[1:] - indptr[:-1])[nbrs]                  # (N, k2)
        pos = _gather_ranges(indptr[:-1][nbrs].reshape(-1), lengths.reshape(-1))
        owner = np.repeat(np.arange(n), lengths.sum(1))
        key = owner * n + indices[pos]
        uniq, inverse = np.unique(key, return_inverse=True)
        summed = np.bincount(inverse, weights=data[pos].astype(np.float64)) / k2
        counts = np.bincount(uniq // n, minlength=n)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        indices, data = uniq % n, summed.astype(np.float32)

    # Inverted index restricted to gallery rows (only gallery columns of the result are needed).
    row_of = np.repeat(np.arange(n), indptr[1:] - indptr[:-1])
    in_gallery = row_of >= nq
    by_col = np.argsort(indices[in_gallery], kind="stable")
    inv_rows = row_of[in_gallery][by_col] - nq
    inv_vals = data[in_gallery][by_col]
    inv_ptr = np.concatenate([[0], np.cumsum(np.bincount(indices[in_gallery], minlength=n))])

    ng = joint.ng
    final = np.empty((nq, ng), np.float32)
    q_step = max(1, step // max(ng, 1))
    for start in range(0, nq, q_step):
        stop = min(start + q_step, nq)
        e0, e1 = indptr[start], indptr[stop]
        q_local = np.repeat(np.arange(stop - start), indptr[start + 1:stop + 1] - indptr[start:stop])
        cols, vals = indices[e0:e1], data[e0:e1]
        lengths = inv_ptr[cols + 1] - inv_ptr[cols]
        pos = _gather_ranges(inv_ptr[cols], lengths)
        mins = np.minimum(np.repeat(vals, lengths), inv_vals[pos])
        shared = np.bincount(np.repeat(q_local, lengths) * ng + inv_rows[pos], weights=mins,
                             minlength=(stop - start) * ng).reshape(stop - start, ng)
        jaccard = 1.0 - shared / (2.0 - shared)
        original = np.square(joint.q_g[start:stop]) / joint.row_max[start:stop, None]
        final[start:stop] = jaccard * (1.0 - lambda_value) + original * lambda_value
    return final
