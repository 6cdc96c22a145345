"""Speed of evaluate_rank at Market-1501 scale: ours (vectorised, chunked) against the fast-reid / torchreid
algorithm on the same distance matrix, in one run, with a check that both give the same numbers.

    python bench/eval.py [--queries 3368 --gallery 15913 --dim 256 --seed 0] [--msmt]

References timed on the same inputs:
* the per-query numpy loop of fast-reid / torchreid (``eval_market1501`` of their ``rank.py``, re-implemented
  here: full ``np.argsort`` of the matrix, then one Python iteration per query);
* ``np.argsort`` of the matrix alone: the first step of their Cython evaluator (``rank_cy.pyx`` sorts the whole
  matrix with numpy before its C loops), so a lower bound of the Cython evaluator's time;
* the Cython evaluator itself when ``fastreid`` or ``torchreid`` with a built ``rank_cy`` is importable (they
  are not project requirements).
``--msmt`` also evaluates MSMT17-scale features (11,659 x 82,161) block by block and reports time and peak
traced memory (the full float32 distance matrix would be 3.8 GB).
"""
import argparse
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.evaluation.distance import compute_distance  # noqa: E402
from reid.evaluation.evaluator import evaluate_features  # noqa: E402
from reid.evaluation.rank import evaluate_rank  # noqa: E402


def reference_loop(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50, indices=None):
    """fast-reid / torchreid numpy evaluation: argsort everything (``indices``, if not given), then a Python
    loop over queries."""
    num_q, num_g = distmat.shape
    max_rank = min(max_rank, num_g)
    if indices is None:
        indices = np.argsort(distmat, axis=1)
    matches = (g_pids[indices] == q_pids[:, np.newaxis]).astype(np.int32)
    all_cmc, all_ap, all_inp = [], [], []
    for q in range(num_q):
        order = indices[q]
        keep = np.invert((g_pids[order] == q_pids[q]) & (g_camids[order] == q_camids[q]))
        raw_cmc = matches[q][keep]
        if not np.any(raw_cmc):
            continue
        cmc = raw_cmc.cumsum()
        last = np.max(np.where(raw_cmc == 1))
        all_inp.append(cmc[last] / (last + 1.0))
        cmc[cmc > 1] = 1
        all_cmc.append(cmc[:max_rank])
        precision = raw_cmc.cumsum() / (np.arange(len(raw_cmc)) + 1.0)
        all_ap.append((precision * raw_cmc).sum() / raw_cmc.sum())
    return np.asarray(all_cmc, np.float32).sum(0) / len(all_cmc), np.mean(all_ap), np.mean(all_inp)


def cython_evaluator():
    for module in ("fastreid.evaluation.rank_cylib.rank_cy", "torchreid.metrics.rank_cylib.rank_cy"):
        try:
            mod = __import__(module, fromlist=["evaluate_cy"])
            return module, mod.evaluate_cy
        except Exception:  # not installed, or installed without the compiled extension
            continue
    return None, None


def market_like(rng, num_q, num_g, dim, num_ids=750, num_cams=6):
    """Features of identity clusters: queries one per (id, camera) drawn, gallery of the same ids + distractors."""
    centers = rng.randn(num_ids + 1, dim).astype(np.float32)
    q_pids = rng.randint(1, num_ids + 1, num_q)
    g_pids = np.concatenate([rng.randint(1, num_ids + 1, num_g - num_g // 15), np.zeros(num_g // 15, int)])
    q_cams, g_cams = rng.randint(0, num_cams, num_q), rng.randint(0, num_cams, num_g)
    qf = centers[q_pids] + 2.0 * rng.randn(num_q, dim).astype(np.float32)
    gf = centers[g_pids] + 2.0 * rng.randn(num_g, dim).astype(np.float32)
    return qf, gf, q_pids, g_pids, q_cams, g_cams


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3368)
    parser.add_argument("--gallery", type=int, default=15913)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--msmt", action="store_true", help="also run the MSMT17-scale blockwise evaluation")
    args = parser.parse_args()

    rng = np.random.RandomState(args.seed)
    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, args.queries, args.gallery, args.dim)
    distmat = compute_distance(qf, gf, "cosine")
    print("evaluate_rank on a %d x %d float32 distance matrix (numpy %s, %d CPUs)"
          % (args.queries, args.gallery, np.__version__, os.cpu_count() or 1))

    (cmc, mAP, mINP), t_ours = timed(evaluate_rank, distmat, q_pids, g_pids, q_cams, g_cams)
    # fast-reid's loop = its full argsort (numpy's default kind) + the per-query loop; timed in two parts
    indices, t_sort = timed(np.argsort, distmat, axis=1)
    (f_cmc, f_mAP, f_mINP), t_body = timed(reference_loop, distmat, q_pids, g_pids, q_cams, g_cams, indices=indices)
    t_loop = t_sort + t_body
    # Exact float32 ties exist at this size; numpy's default argsort orders them arbitrarily, ours by gallery
    # index. The identity check therefore runs the same loop on a stable argsort (not timed).
    stable = np.argsort(distmat, axis=1, kind="stable")
    r_cmc, r_mAP, r_mINP = reference_loop(distmat, q_pids, g_pids, q_cams, g_cams, indices=stable)
    del indices, stable
    print("  ours (vectorised, chunked)          : %7.2f s" % t_ours)
    print("  fast-reid/torchreid numpy loop      : %7.2f s   ours is %.1fx faster" % (t_loop, t_loop / t_ours))
    print("  np.argsort of the matrix only       : %7.2f s   ours is %.1fx faster (lower bound of the Cython "
          "evaluator, which starts with this sort)" % (t_sort, t_sort / t_ours))
    name, evaluate_cy = cython_evaluator()
    if evaluate_cy is None:
        print("  Cython evaluator                    :  not importable (fastreid/torchreid not installed)")
    else:
        (c_cmc, c_ap, c_inp), t_cy = timed(evaluate_cy, distmat, q_pids, g_pids, q_cams, g_cams, 50, False)
        print("  Cython evaluator (%s): %7.2f s   ours is %.1fx faster" % (name, t_cy, t_cy / t_ours))
    cmc_diff = float(np.abs(cmc - r_cmc).max())
    same = cmc_diff < 1e-6 and abs(mAP - r_mAP) < 1e-9 and abs(mINP - r_mINP) < 1e-9
    print("  Rank-1 %.2f%%  mAP %.2f%%  mINP %.2f%%" % (cmc[0] * 100, mAP * 100, mINP * 100))
    print("  identical to the loop with ties ordered by gallery index: %s (max |cmc diff| %.1e, |mAP diff| %.1e, "
          "|mINP diff| %.1e)" % ("yes" if same else "NO", cmc_diff, abs(mAP - r_mAP), abs(mINP - r_mINP)))
    print("  vs the loop with numpy's default (unstable) argsort: |mAP diff| %.1e, |mINP diff| %.1e, max |cmc diff| "
          "%.1e (order of exactly tied float32 distances only)"
          % (abs(mAP - f_mAP), abs(mINP - f_mINP), float(np.abs(cmc - f_cmc).max())))
    if args.msmt:
        del distmat
        qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, 11659, 82161, 128, num_ids=3060, num_cams=15)
        tracemalloc.start()
        res, t_msmt = timed(evaluate_features, qf, gf, q_pids, g_pids, q_cams, g_cams, metric="cosine")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print("MSMT17 scale 11659 x 82161 (distances + ranking block by block): %.1f s, peak traced memory "
              "%.0f MB (a full float32 distance matrix: %.0f MB); Rank-1 %.2f%% mAP %.2f%%"
              % (t_msmt, peak / 2 ** 20, 11659 * 82161 * 4 / 2 ** 20, res["Rank-1"], res["mAP"]))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
