"""CMC, mAP and mINP of a query x gallery distance matrix (numpy only), chunked over queries.

Protocol (Market-1501, as fast-reid / torchreid): for each query, gallery items with the same pid *and*
the same camera are removed; the remaining ones are ranked by distance; the query's pid in that list are its
correct matches; a query without any correct match is skipped (it does not count in the averages).

* AP   = mean over the correct matches of the precision at each of them (fast-reid's definition).
* mINP = mean of (number of correct matches) / (position of the last one, 1-based) (fast-reid's definition).
* CMC[k] = fraction of valid queries whose first correct match is at position <= k+1.

Ties: items are ordered by distance, then by gallery index (what a stable argsort gives). fast-reid uses
numpy's default (unstable) argsort, so its order among exactly equal distances is unspecified.

How it avoids sorting the rows: the metrics only need the position of each correct match in the kept list.
A query's positives (its pid in the gallery) are few; they are ordered by (distance, gallery index), which also
counts the removed same-camera ones ahead of each match. What is left is, for each correct match, the number of
items of the row ahead of it in (distance, gallery index) order. Two rankers compute it (``ranker=``):

* ``"counting"`` (the default): the row is counted, not sorted. Its items are put in about gallery/4 bins of
  equal width between the row's nearest item and its farthest correct match (one pass, a histogram); the items
  in bins below a match's bin are ahead of it, and only the few items that share a bin with a match are
  ordered exactly (distance, then gallery index). A bin index is a monotone function of the distance, so the
  counts are exact, ties included. When few items lie at or below the farthest correct match (a good model),
  those are cut out and sorted instead. Cost per query: O(gallery + positives log positives) whatever the
  model's quality.
* ``"cut-out"`` (the previous one, kept selectable until the counting one has proven itself): the items no
  farther than the row's farthest correct match are cut out; a short cut-out is sorted, a long float32 one is
  compared key by key with each match. Its cost follows the number of items ahead of the last correct match, so
  it is fast on good models and up to a sort of the row on poor ones.

Memory: the positives of a chunk of queries plus the counting ranker's block (a few rows' working arrays,
BLOCK) or one row's cut-out, so an MSMT17-scale matrix (11,659 x 82,161) is processed in bounded memory, and no
(query x gallery) index matrix is ever built.

CUHK03 single-shot variant (``use_metric_cuhk03=True``, the "cuhk03" metric of fast-reid / torchreid): the CMC is
averaged over ``num_repeats`` draws in which one image per gallery identity is kept (chosen uniformly, the query's
own identity among its valid images); AP and mINP stay those of the full kept list. Draws come from
``numpy.random.default_rng([seed, query_index])``, so the result depends neither on the chunk size nor on
global random state.
"""
import numpy as np

from reid.errors import UserError

# Distance entries per block of queries when evaluate_rank is given the whole matrix (also the block size of
# evaluate_features' distance blocks); the ranking itself holds only one row's cut-out at a time.
DEFAULT_BLOCK_ELEMENTS = 1 << 22
# Cut-outs (items up to a query's farthest correct match) at least this long are counted without sorting.
LONG_CUT_OUT = 4096
RANKERS = ("counting", "cut-out")
# The counting ranker (_less_counting): a row whose items up to its farthest correct match are at most
# 1/SHORT_CUT_OUT of it is sorted instead of binned; about PER_BIN items per bin; bins beyond the farthest match
# at most SPREAD times those up to it; BLOCK distances binned at a time (about 30 bytes of working arrays each).
# Set where bench/eval.py's Market- and MSMT-scale cases ran fastest; any values give the same counts.
SHORT_CUT_OUT = 8
PER_BIN = 4
SPREAD = 4
BLOCK = 1 << 18


class GalleryIndex(object):
    """Gallery ids grouped by pid (gallery index order inside a group), reused by every chunk of queries."""

    def __init__(self, g_pids, g_camids):
        self.g_pids = np.asarray(g_pids).reshape(-1)
        self.g_camids = np.asarray(g_camids).reshape(-1)
        self.size = self.g_pids.size
        self.order = np.argsort(self.g_pids, kind="stable")
        sorted_pids = self.g_pids[self.order]
        self.pids, self.starts, self.counts = np.unique(sorted_pids, return_index=True, return_counts=True)

    def group_of(self, q_pids):
        """(group index, count of gallery items with that pid) for each query pid (count 0 if absent)."""
        gi = np.searchsorted(self.pids, q_pids)
        gi_c = np.minimum(gi, max(len(self.pids) - 1, 0))
        present = (gi < len(self.pids)) & (self.pids[gi_c] == q_pids) if len(self.pids) else np.zeros(len(q_pids), bool)
        return gi_c, np.where(present, self.counts[gi_c] if len(self.pids) else 0, 0)


def _float32_keys(values, columns, bits):
    """int64 keys ordered as (distance, gallery index) for float32 ``values`` (no NaN) at gallery ``columns``:
    an order-preserving 32-bit code of the value above ``bits`` bits of index. ``values`` is overwritten.

    The code is the IEEE bit pattern with the sign bit flipped for non-negative values and all bits flipped for
    negative ones; -0.0 is first made 0.0 (they compare equal, so they must tie and fall back to the index).
    """
    values += np.float32(0.0)
    code = values.view(np.uint32)
    flip = values.view(np.int32) >> 31               # -1 (all bits set) for negative values, else 0
    flip |= np.int32(-(1 << 31))
    code ^= flip.view(np.uint32)
    keys = code.astype(np.int64)
    keys <<= bits
    keys |= columns
    return keys


def _items_ahead(dist, dpos, gidx, good, ranker="counting"):
    """For each good slot (r, j): how many items of row r come before gallery item gidx[r, j] (distance dpos[r, j])
    in (distance, gallery index) order, i.e. its 0-based position in a stable argsort of the row. Other slots: 0.
    Each row's good slots must be in that order already (rank_chunk sorts the positives). `ranker` (RANKERS)
    picks how; both give the same counts."""
    r, j = np.nonzero(good)                         # row-major: each row's good slots together, in order
    bounds = np.searchsorted(r, np.arange(dist.shape[0] + 1))
    count = _less_cut_out if ranker == "cut-out" else _less_counting
    ahead = np.zeros(dpos.shape, np.int64)
    ahead[r, j] = count(dist, dpos[r, j], gidx[r, j], bounds)
    return ahead


def _less_cut_out(dist, probes, columns, bounds):
    """The items ahead of each probe (distance probes[t] of gallery item columns[t]; row i's probes are
    probes[bounds[i]:bounds[i + 1]], in order), by cutting out what lies up to each row's farthest probe.

    No row is sorted whole: only the items no farther than the row's farthest good match can be ahead of one
    (usually a small part of the row), and only those are cut out. A short cut-out is sorted and each match's
    distance looked up in it; exact ties are then resolved by gallery index in the row. A long float32 cut-out
    (what compute_distance and re_ranking give) is not sorted: its items get int64 keys ordered as (distance,
    gallery index), and a match's position is the number of keys below its own, one comparison pass per match,
    ties included; a sort is used instead if the identity has very many images.
    """
    n = dist.shape[1]
    less = np.empty(len(probes), np.int64)
    if dist.dtype == np.float32:
        bits = max(1, (n - 1).bit_length())
        probe_keys = _float32_keys(probes.copy(), columns, bits)
    for row in np.flatnonzero(bounds[1:] > bounds[:-1]):
        a, b = bounds[row], bounds[row + 1]
        d = dist[row]
        ahead_of_last = d <= probes[b - 1]          # probes[b - 1]: the farthest good match of the row
        size = np.count_nonzero(ahead_of_last)
        # comparing costs (matches x cut-out), sorting (cut-out x log2 cut-out) and falls out of cache on long
        # cut-outs; the thresholds are where the Market- and MSMT-scale benchmarks broke even
        if dist.dtype == np.float32 and size >= LONG_CUT_OUT and b - a <= 4 * int(size).bit_length():
            cut = np.flatnonzero(ahead_of_last)
            keys = _float32_keys(d.take(cut), cut, bits)
            less[a:b] = [np.count_nonzero(keys < key) for key in probe_keys[a:b]]
        else:
            less[a:b] = _sorted_cut_out(d, probes[a:b], columns[a:b], ahead_of_last)
    return less


def _less_counting(dist, probes, columns, bounds):
    """What _less_cut_out gives, by counting (the module docstring). Per row, the distances are put in
    bins of equal width, about gallery/PER_BIN of them from the row's nearest item to its farthest good match
    (those beyond it go to the bins above, at most SPREAD times as many): one histogram gives the items in bins
    below each match's bin, and the few items that share a bin with a match (its mates) are ordered exactly by
    (distance, gallery index). The bin of a distance, trunc((d - lo) * scale), is monotone in d (each
    floating-point step is), so every item in a lower bin is nearer than the match and every item in a higher
    bin farther: the counts are exact. Rows are binned a block at a time (BLOCK distances), in one histogram
    per block; rows where few items are no farther than the last match (estimated on a sample of the row) are
    sorted instead."""
    n = dist.shape[1]
    less = np.empty(len(probes), np.int64)
    rows = np.flatnonzero(bounds[1:] > bounds[:-1])
    last = probes[bounds[rows + 1] - 1]             # the farthest good match of each row
    sample = max(1, n // 256)
    binned = np.count_nonzero(dist[:, ::sample][rows] <= last[:, None], axis=1) * (sample * SHORT_CUT_OUT) > n
    for row in rows[~binned]:
        a, b = bounds[row], bounds[row + 1]
        less[a:b] = _sorted_cut_out(dist[row], probes[a:b], columns[a:b])
    rows, last = rows[binned], last[binned]
    num_bins = max(1, n // PER_BIN)
    step = max(1, BLOCK // n)
    for start in range(0, len(rows), step):
        block = rows[start:start + step]
        k = len(block)
        x = dist[block]                             # a copy, turned into the bins' values in place
        lo = x.min(1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scale = ((num_bins - 1) / (last[start:start + step] - lo)).astype(x.dtype)
            x -= lo[:, None]
            x *= scale[:, None]
        top = x.max()
        if not top <= SPREAD * num_bins:            # items far beyond the last match, infinities, or rows whose
            x[~(np.isfinite(scale) & (scale > 0))] = 0     # matches all lie at the row's minimum: one bin each
            np.minimum(x, SPREAD * num_bins, out=x)
            top = x.max()
        width = int(top) + 1
        starts = np.arange(k) * width               # row i's bins are starts[i] .. starts[i] + width - 1
        bins = np.add(x.astype(np.int32), starts[:, None], dtype=np.intp).ravel()
        del x
        counts = np.bincount(bins, minlength=k * width)
        lens = bounds[block + 1] - bounds[block]
        slot_row = np.repeat(np.arange(k), lens)
        slots = np.arange(lens.sum()) + np.repeat(bounds[block] - (np.cumsum(lens) - lens), lens)
        probe_items = slot_row * n + columns[slots]
        probe_bins = bins[probe_items]
        # items in bins below each match's, within its row: sums of the histogram between the edges
        edges = np.unique(np.concatenate([starts, probe_bins]))
        sums = np.add.reduceat(counts, edges)
        before = np.cumsum(sums) - sums
        below = before[np.searchsorted(edges, probe_bins)] - before[np.searchsorted(edges, starts[slot_row])]
        shared = np.zeros(k * width, bool)
        shared[probe_bins] = True
        mates = shared[bins].nonzero()[0]           # the items in a match's bin (the matches among them)
        mate_bins = bins[mates]
        order = np.lexsort((dist[block[mates // n], mates % n], mate_bins))   # stable: then gallery index
        place = np.empty(len(mates), np.int64)
        place[order] = np.arange(len(mates))
        first_in_bin = np.searchsorted(mate_bins[order], probe_bins, "left")
        less[slots] = below + place[np.searchsorted(mates, probe_items)] - first_in_bin
    return less


def _sorted_cut_out(d, p, g, cut=None):
    """For the sorted probes p (distances of items g of row d): the items of d ahead of each, from a sort of the
    items no farther than the last probe (`cut`, the mask of those, when the caller has it); exact ties
    resolved by gallery index."""
    closer = d[d <= p[-1] if cut is None else cut]
    closer.sort()
    less = closer.searchsorted(p, "left")
    equal = closer.searchsorted(p, "right") - less
    for t in np.flatnonzero(equal > 1):             # others at exactly this distance: those at a lower index count
        less[t] += np.count_nonzero(d[:g[t]] == p[t])
    return less


def rank_chunk(dist, q_pids, q_camids, gallery, first_query_index=0, cuhk03=None, ranker="counting"):
    """Per-query results of one chunk of rows.

    Returns dict of arrays over the chunk's queries: ``valid`` (has a correct match), ``ap``, ``inp``,
    ``first`` (0-based position of the first correct match in the kept list), ``num_kept``, and with
    ``cuhk03=(num_repeats, seed, max_rank)`` also ``cmc`` (chunk, max_rank) of the single-shot draws.
    """
    dist = np.asarray(dist)
    if dist.dtype.kind != "f" or dist.dtype.itemsize < 4:
        dist = dist.astype(np.float32)
    c, n = dist.shape
    q_pids = np.asarray(q_pids).reshape(-1)
    q_camids = np.asarray(q_camids).reshape(-1)
    if c and np.isnan(dist.min()):  # min propagates NaN, one pass without a mask
        raise UserError("the distance matrix contains NaN (rows %s...); check the features for NaN/inf"
                        % np.flatnonzero(np.isnan(dist).any(1))[:5].tolist())

    group, count = gallery.group_of(q_pids)
    kmax = int(count.max()) if c else 0
    out = dict(valid=np.zeros(c, bool), ap=np.zeros(c), inp=np.zeros(c), first=np.full(c, -1, np.int64),
               num_kept=np.full(c, n, np.int64))
    if cuhk03 is not None:
        out["cmc"] = np.zeros((c, cuhk03[2]))
    if kmax == 0:
        return out

    # The query's positives (same pid), padded to kmax slots: gallery index, distance, good/junk flags.
    slot = np.arange(kmax)
    in_group = slot[None, :] < count[:, None]
    pos_sorted = np.minimum(gallery.starts[group][:, None] + slot[None, :], n - 1)
    gidx = np.where(in_group, gallery.order[pos_sorted], n + slot[None, :])  # padding sorts after everything
    rows = np.arange(c)[:, None]
    dpos = np.where(in_group, dist[rows, np.minimum(gidx, n - 1)], np.inf).astype(dist.dtype)
    junk = in_group & (gallery.g_camids[np.minimum(gidx, n - 1)] == q_camids[:, None])
    good = in_group & ~junk
    num_good = good.sum(1)
    out["num_kept"] = n - junk.sum(1)

    # Order the positives by (distance, gallery index); junk/good items ahead of each one follow by cumsum.
    perm = np.lexsort((gidx, dpos), axis=1)
    gidx, dpos = np.take_along_axis(gidx, perm, 1), np.take_along_axis(dpos, perm, 1)
    good, junk = np.take_along_axis(good, perm, 1), np.take_along_axis(junk, perm, 1)
    good_before = np.cumsum(good, 1) - good
    junk_before = np.cumsum(junk, 1) - junk

    ahead = _items_ahead(dist, dpos, gidx, good, ranker)
    kept_pos = ahead - junk_before  # 0-based position among kept items

    valid = num_good > 0
    safe_good = np.maximum(num_good, 1)
    precision = np.where(good, (good_before + 1) / np.where(good, kept_pos + 1.0, 1.0), 0.0)
    out["valid"] = valid
    # cumsum adds strictly left to right, so the padding (zeros, its width set by the chunk) cannot change the sum
    out["ap"] = np.where(valid, np.cumsum(precision, 1)[:, -1] / safe_good, 0.0)
    big = np.iinfo(np.int64).max
    out["first"] = np.where(valid, np.where(good, kept_pos, big).min(1), -1)
    last = np.where(good, kept_pos, -1).max(1)
    out["inp"] = np.where(valid, num_good / np.maximum(last + 1.0, 1.0), 0.0)

    if cuhk03 is not None:
        out["cmc"] = _cuhk03_cmc(dist, q_pids, group, count, gidx, good, valid, gallery, first_query_index, *cuhk03)
    return out


def _cuhk03_cmc(dist, q_pids, group, count, gidx_sorted, good_sorted, valid, gallery, first_query_index,
                num_repeats, seed, max_rank):
    """Single-shot CMC (see the module docstring), vectorised over the chunk, repeats and gallery identities."""
    c, n = dist.shape
    num_ids = len(gallery.pids)
    u = np.stack([np.random.default_rng([int(seed), first_query_index + i]).random((num_repeats, num_ids))
                  for i in range(c)]) if c else np.zeros((0, num_repeats, num_ids))
    # One sampled item per identity: the floor(u * count)-th item of its group.
    pick = gallery.starts[None, None, :] + np.minimum((u * gallery.counts[None, None, :]).astype(np.int64),
                                                       gallery.counts[None, None, :] - 1)
    sampled = gallery.order[pick]                                      # (c, R, P) gallery indices
    d_sampled = dist[np.arange(c)[:, None, None], sampled]
    # For the query's own identity draw among its valid (different-camera) images, in gallery index order.
    num_good = good_sorted.sum(1)
    own_u = np.take_along_axis(u, np.broadcast_to(group[:, None, None], (c, num_repeats, 1)), 2)[:, :, 0]
    # good_sorted is in (distance, index) order; re-sort the good items by gallery index for the draw.
    gidx_good = np.where(good_sorted, gidx_sorted, np.iinfo(np.int64).max)
    gidx_good = np.sort(gidx_good, 1)
    m = np.minimum((own_u * num_good[:, None]).astype(np.int64), np.maximum(num_good - 1, 0)[:, None])
    own_item = np.take_along_axis(gidx_good, m, 1) if gidx_good.shape[1] else np.zeros((c, num_repeats), np.int64)
    own_item = np.where(valid[:, None], own_item, 0)
    d_own = dist[np.arange(c)[:, None], own_item]
    ahead = (d_sampled < d_own[:, :, None]) | ((d_sampled == d_own[:, :, None]) & (sampled < own_item[:, :, None]))
    ahead[np.arange(c), :, group] = False                               # the own identity is not a competitor
    position = ahead.sum(2)                                              # (c, R) 0-based rank of the match
    ranks = np.arange(max_rank)
    cmc = (position[:, :, None] <= ranks[None, None, :]).mean(1)
    return np.where(valid[:, None], cmc, 0.0)


def _check_inputs(distmat, q_pids, g_pids, q_camids, g_camids):
    if distmat.ndim != 2:
        raise UserError("distmat must be a 2-D (num_query, num_gallery) array, got shape %s"
                        % (getattr(distmat, "shape", None),))
    nq, ng = distmat.shape
    for name, arr, n in (("q_pids", q_pids, nq), ("q_camids", q_camids, nq), ("g_pids", g_pids, ng),
                         ("g_camids", g_camids, ng)):
        if np.asarray(arr).reshape(-1).size != n:
            raise UserError("%s has %d entries but the distance matrix has %d %s" % (
                name, np.asarray(arr).size, n, "rows" if name[0] == "q" else "columns"))
    if nq == 0 or ng == 0:
        raise UserError("empty query (%d) or gallery (%d); check the test dataset folders" % (nq, ng))


def default_chunk_size(elements_per_row):
    return int(max(1, DEFAULT_BLOCK_ELEMENTS // max(1, elements_per_row)))


class RankAccumulator(object):
    """Collects per-query results chunk by chunk and reduces them to (cmc, mAP, mINP)."""

    def __init__(self, g_pids, g_camids, max_rank=50, use_metric_cuhk03=False, num_repeats=10, seed=0,
                 ranker="counting"):
        if ranker not in RANKERS:
            raise UserError("unknown ranker %r; use one of: %s" % (ranker, ", ".join(RANKERS)))
        self.ranker = ranker
        self.gallery = GalleryIndex(g_pids, g_camids)
        self.max_rank = int(min(max_rank, self.gallery.size))
        self.cuhk03 = (int(num_repeats), int(seed), self.max_rank) if use_metric_cuhk03 else None
        self.parts = []
        self.num_queries = 0

    def chunk_size(self):
        # The single-shot draws hold a few (repeats x identities) arrays per query on top of the row.
        extra = 4 * self.cuhk03[0] * len(self.gallery.pids) if self.cuhk03 is not None else 0
        return default_chunk_size(self.gallery.size + extra)

    def add(self, dist_chunk, q_pids, q_camids):
        part = rank_chunk(dist_chunk, q_pids, q_camids, self.gallery, self.num_queries, self.cuhk03, self.ranker)
        self.num_queries += len(part["valid"])
        self.parts.append(part)

    def per_query(self):
        return {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}

    def result(self):
        pq = self.per_query()
        valid = pq["valid"]
        if not valid.any():
            raise UserError("no query has a correct match in the gallery (all %d skipped); check that query and "
                            "gallery come from the same test set and carry the same pids" % len(valid))
        if self.cuhk03 is not None:
            cmc = pq["cmc"][valid].mean(0)
        else:
            first = pq["first"][valid]
            cmc = (first[:, None] <= np.arange(self.max_rank)[None, :]).mean(0)
        return cmc.astype(np.float64), float(pq["ap"][valid].mean()), float(pq["inp"][valid].mean())


def evaluate_rank(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50, use_metric_cuhk03=False,
                  chunk_size=None, num_repeats=10, seed=0, return_per_query=False, ranker="counting"):
    """(cmc (max_rank,), mAP, mINP) as fractions in 0..1; see the module docstring for the protocol.

    ``max_rank`` is capped at the gallery size (as fast-reid). ``chunk_size`` = queries per block (default:
    about 4M distance entries per block). ``return_per_query=True`` adds a dict of per-query arrays
    (``valid``, ``ap``, ``inp``, ``first``, ``num_kept``). ``ranker``: one of RANKERS (module docstring); both
    give the same numbers.
    """
    if not hasattr(distmat, "ndim"):
        distmat = np.asarray(distmat)  # arrays and memmaps are used as they are, row block by row block
    _check_inputs(distmat, q_pids, g_pids, q_camids, g_camids)
    acc = RankAccumulator(g_pids, g_camids, max_rank, use_metric_cuhk03, num_repeats, seed, ranker)
    q_pids, q_camids = np.asarray(q_pids).reshape(-1), np.asarray(q_camids).reshape(-1)
    step = int(chunk_size) if chunk_size else acc.chunk_size()
    for start in range(0, distmat.shape[0], step):
        acc.add(distmat[start:start + step], q_pids[start:start + step], q_camids[start:start + step])
    cmc, mAP, mINP = acc.result()
    if return_per_query:
        return cmc, mAP, mINP, acc.per_query()
    return cmc, mAP, mINP
