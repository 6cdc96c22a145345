"""Ranking metrics (known answers, loop and sklearn cross-checks, CUHK03 single-shot, bounded memory),
distances, k-reciprocal re-ranking, AQE, the evaluator glue, the results table and the rank-list images."""
import os
import tracemalloc

import numpy as np
import pytest

from compat.errors import UserError
from reid.evaluation import (aqe, compute_distance, evaluate_features, evaluate_rank, format_results_table,
                             options_from_cfg, re_ranking, save_rank_lists)


def market_loop(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50):
    """fast-reid / torchreid's per-query numpy algorithm (stable argsort, see rank.py on ties)."""
    nq, ng = distmat.shape
    max_rank = min(max_rank, ng)
    indices = np.argsort(distmat, axis=1, kind="stable")
    all_cmc, all_ap, all_inp = [], [], []
    for q in range(nq):
        order = indices[q]
        keep = ~((g_pids[order] == q_pids[q]) & (g_camids[order] == q_camids[q]))
        raw = (g_pids[order][keep] == q_pids[q]).astype(np.int64)
        if not raw.any():
            continue
        cmc = raw.cumsum()
        last = np.max(np.where(raw == 1))
        all_inp.append(cmc[last] / (last + 1.0))
        cmc[cmc > 1] = 1
        padded = np.ones(max_rank)
        padded[:min(max_rank, len(cmc))] = cmc[:max_rank]
        all_cmc.append(padded)
        all_ap.append((raw.cumsum() / (np.arange(len(raw)) + 1.0) * raw).sum() / raw.sum())
    return np.mean(all_cmc, 0), np.mean(all_ap), np.mean(all_inp)


def cuhk03_loop(distmat, q_pids, g_pids, q_camids, g_camids, max_rank, num_repeats, seed):
    """fast-reid's eval_cuhk03 loop, drawing with the same per-query uniforms as rank.py documents."""
    uniq = np.unique(g_pids)
    cmcs = []
    for q in range(distmat.shape[0]):
        order = np.argsort(distmat[q], kind="stable")
        keep = ~((g_pids[order] == q_pids[q]) & (g_camids[order] == q_camids[q]))
        kept = order[keep]
        raw = (g_pids[kept] == q_pids[q]).astype(np.int64)
        if not raw.any():
            continue
        u = np.random.default_rng([seed, q]).random((num_repeats, len(uniq)))
        cmc = np.zeros(max_rank)
        for rep in range(num_repeats):
            mask = np.zeros(len(kept), bool)
            for p_i, pid in enumerate(uniq):
                items = np.sort(kept[g_pids[kept] == pid])       # that identity's kept images, index order
                if len(items) == 0:
                    continue
                chosen = items[int(u[rep, p_i] * len(items))]
                mask[np.flatnonzero(kept == chosen)[0]] = True
            c = raw[mask].cumsum()
            c[c > 1] = 1
            full = np.ones(max_rank)
            full[:min(max_rank, len(c))] = c[:max_rank]
            cmc += full / num_repeats
        cmcs.append(cmc)
    return np.mean(cmcs, 0)


def arr(*xs):
    return [np.asarray(x) for x in xs]


# ----------------------------------------------------------------------------- known answers
def test_perfect_ranking_gives_ap_one():
    d, qp, gp, qc, gc = arr([[0.1, 0.2, 0.3, 0.4]], [1], [1, 1, 2, 3], [0], [1, 2, 0, 0])
    cmc, mAP, mINP = evaluate_rank(d, qp, gp, qc, gc)
    assert mAP == 1.0 and mINP == 1.0 and cmc.shape == (4,) and (cmc == 1).all()


def test_only_match_at_rank_three():
    d, qp, gp, qc, gc = arr([[0.1, 0.2, 0.3, 0.4]], [1], [2, 3, 1, 4], [0], [1, 1, 1, 1])
    cmc, mAP, mINP = evaluate_rank(d, qp, gp, qc, gc)
    assert mAP == pytest.approx(1 / 3) and mINP == pytest.approx(1 / 3)
    assert cmc.tolist() == [0, 0, 1, 1]


def test_two_matches_ap_and_minp():
    d, qp, gp, qc, gc = arr([[0.1, 0.2, 0.3, 0.4, 0.5]], [1], [1, 2, 3, 1, 4], [0], [1, 1, 1, 1, 1])
    cmc, mAP, mINP = evaluate_rank(d, qp, gp, qc, gc)
    assert mAP == pytest.approx((1 + 2 / 4) / 2) and mINP == pytest.approx(2 / 4) and cmc[0] == 1


def test_same_pid_same_camera_is_removed():
    # the nearest item is the query's identity from the query's camera: removed, so the match is at rank 2
    d, qp, gp, qc, gc = arr([[0.05, 0.1, 0.2]], [1], [1, 2, 1], [3], [3, 0, 0])
    cmc, mAP, mINP = evaluate_rank(d, qp, gp, qc, gc, max_rank=3)
    assert mAP == pytest.approx(0.5) and cmc.tolist() == [0, 1, 1]
    # from a camera none of them share, both images of the identity are valid matches (ranks 1 and 3)
    _, mAP2, _ = evaluate_rank(d, qp, gp, np.array([4]), gc)
    assert mAP2 == pytest.approx((1 + 2 / 3) / 2)


def test_queries_without_valid_match_are_skipped():
    d = np.array([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.5, 0.5, 0.1]])
    qp, qc = np.array([1, 9, 2]), np.array([0, 0, 5])      # pid 9 absent; pid 2 only in its own camera
    gp, gc = np.array([1, 2, 3]), np.array([1, 5, 1])
    cmc, mAP, mINP, per = evaluate_rank(d, qp, gp, qc, gc, return_per_query=True)
    assert per["valid"].tolist() == [True, False, False]
    assert mAP == 1.0 and cmc[0] == 1.0 and mINP == 1.0
    with pytest.raises(UserError, match="no query has a correct match"):
        evaluate_rank(d[1:], qp[1:], gp, qc[1:], gc)


def test_ties_are_broken_by_gallery_index():
    # all distances equal: the ranking is the gallery order
    d = np.zeros((1, 3), np.float32)
    _, mAP, mINP = evaluate_rank(d, np.array([1]), np.array([2, 1, 1]), np.array([0]), np.array([1, 1, 1]))
    assert mAP == pytest.approx((1 / 2 + 2 / 3) / 2) and mINP == pytest.approx(2 / 3)
    _, mAP_rev, _ = evaluate_rank(d, np.array([1]), np.array([1, 1, 2]), np.array([0]), np.array([1, 1, 1]))
    assert mAP_rev == 1.0
    # a tie between a match and a non-match at equal distance: lower index first
    d = np.array([[0.5, 0.5, 0.9]])
    _, a, _ = evaluate_rank(d, np.array([7]), np.array([3, 7, 7]), np.array([0]), np.array([1, 1, 1]))
    assert a == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_max_rank_is_capped_at_gallery_size_and_inputs_checked():
    d, qp, gp, qc, gc = arr([[0.3, 0.1]], [1], [1, 2], [0], [1, 1])
    cmc, _, _ = evaluate_rank(d, qp, gp, qc, gc, max_rank=50)
    assert cmc.tolist() == [0, 1]
    with pytest.raises(UserError, match="g_pids has 3 entries"):
        evaluate_rank(d, qp, np.array([1, 2, 3]), qc, gc)
    with pytest.raises(UserError, match="2-D"):
        evaluate_rank(np.zeros(3), qp, gp, qc, gc)
    with pytest.raises(UserError, match="NaN"):
        evaluate_rank(np.array([[np.nan, 0.1]]), qp, gp, qc, gc)


# ----------------------------------------------------------------------------- cross-checks
def random_case(rng, continuous):
    nq, ng, npid = rng.randint(1, 40), rng.randint(2, 150), rng.randint(1, 20)
    qp, gp = rng.randint(0, npid, nq), rng.randint(0, npid, ng)
    qp[0] = gp[0]  # at least one query has a match of its identity
    qc, gc = rng.randint(0, 3, nq), rng.randint(0, 3, ng)
    qc[0] = (gc[0] + 1) % 3
    d = rng.rand(nq, ng).astype(np.float32) if continuous else rng.randint(0, 5, (nq, ng)).astype(np.float64)
    return d, qp, gp, qc, gc


def test_matches_the_per_query_loop_including_ties():
    rng = np.random.RandomState(0)
    for trial in range(40):
        d, qp, gp, qc, gc = random_case(rng, continuous=trial % 2 == 0)
        ref = market_loop(d, qp, gp, qc, gc, 20)
        got = evaluate_rank(d, qp, gp, qc, gc, 20, chunk_size=rng.randint(1, 12))
        np.testing.assert_allclose(got[0], ref[0], atol=1e-12)
        assert got[1] == pytest.approx(ref[1], abs=1e-12) and got[2] == pytest.approx(ref[2], abs=1e-12)


def test_per_query_ap_matches_sklearn():
    from sklearn.metrics import average_precision_score
    rng = np.random.RandomState(1)
    nq, ng = 30, 200
    qp, gp = rng.randint(0, 12, nq), rng.randint(0, 12, ng)
    qc, gc = rng.randint(0, 4, nq), rng.randint(0, 4, ng)
    d = rng.rand(nq, ng)
    _, _, _, per = evaluate_rank(d, qp, gp, qc, gc, return_per_query=True, chunk_size=7)
    checked = 0
    for q in range(nq):
        keep = ~((gp == qp[q]) & (gc == qc[q]))
        y = gp[keep] == qp[q]
        if not y.any():
            assert not per["valid"][q]
            continue
        assert per["ap"][q] == pytest.approx(average_precision_score(y, -d[q, keep]), abs=1e-12)
        checked += 1
    assert checked > 20


def test_cuhk03_single_shot_matches_loop_and_is_chunk_independent():
    rng = np.random.RandomState(2)
    nq, ng = 25, 90
    qp, gp = rng.randint(0, 10, nq), rng.randint(0, 10, ng)
    qc, gc = rng.randint(0, 2, nq), rng.randint(0, 2, ng)
    d = rng.rand(nq, ng)
    d[:, ::7] = 0.5  # some ties
    ref = cuhk03_loop(d, qp, gp, qc, gc, 20, 10, 3)
    cmc_a, mAP_a, _ = evaluate_rank(d, qp, gp, qc, gc, 20, use_metric_cuhk03=True, seed=3, chunk_size=4)
    cmc_b, mAP_b, _ = evaluate_rank(d, qp, gp, qc, gc, 20, use_metric_cuhk03=True, seed=3)
    np.testing.assert_allclose(cmc_a, ref, atol=1e-12)
    np.testing.assert_array_equal(cmc_a, cmc_b)
    assert mAP_a == mAP_b == pytest.approx(market_loop(d, qp, gp, qc, gc, 20)[1], abs=1e-12)  # AP is not sampled
    # one image per gallery identity: nothing to sample, single-shot == Market CMC
    gp1 = np.arange(ng) % 45
    keep = np.unique(gp1, return_index=True)[1]
    args = (d[:, keep], qp % 45, gp1[keep], qc, gc[keep])
    np.testing.assert_allclose(evaluate_rank(*args, max_rank=20, use_metric_cuhk03=True)[0],
                               evaluate_rank(*args, max_rank=20)[0], atol=1e-12)


def test_cuhk03_single_shot_exact_values_on_a_hand_computed_case():
    """Two queries, 8 gallery images; the single-shot draw (one image per gallery identity) cannot change the
    outcome here, so the CMC is exact for every seed. Query 0 (pid 0, camera 0): g0 is pid 0 in camera 0 and
    removed; ranked g2 g3 g4 (all pid 2) before its match g1: Market rank 4, single-shot rank 2 (pid 2 is one
    draw). Query 1 (pid 1): g7 (pid 3), g0 g1 (pid 0), then its matches g5 g6: Market rank 4, single-shot rank
    3 (pid 0 is one draw). AP is not sampled: 1/4 and (1/4 + 2/5)/2, mAP = 0.2875."""
    g_pids = np.array([0, 0, 2, 2, 2, 1, 1, 3])
    g_cams = np.array([0, 1, 1, 1, 1, 1, 1, 1])
    dist = np.array([[0.05, 0.5, 0.1, 0.2, 0.3, 0.6, 0.7, 0.8],
                     [0.12, 0.15, 0.7, 0.8, 0.85, 0.4, 0.45, 0.1]])
    q_pids, q_cams = np.array([0, 1]), np.array([0, 0])
    for seed in (0, 1, 7):
        cmc, mAP, _ = evaluate_rank(dist, q_pids, g_pids, q_cams, g_cams, max_rank=5, use_metric_cuhk03=True,
                                    num_repeats=10, seed=seed)
        np.testing.assert_allclose(cmc, [0.0, 0.5, 1.0, 1.0, 1.0], atol=1e-12)
        assert mAP == pytest.approx(0.2875, abs=1e-12)
    cmc, mAP, _ = evaluate_rank(dist, q_pids, g_pids, q_cams, g_cams, max_rank=5)
    np.testing.assert_allclose(cmc, [0.0, 0.0, 0.0, 1.0, 1.0], atol=1e-12)
    assert mAP == pytest.approx(0.2875, abs=1e-12)


def test_memory_stays_bounded_by_the_chunk():
    rng = np.random.RandomState(3)
    ng = 4000
    gp, gc = rng.randint(0, 300, ng), rng.randint(0, 6, ng)

    def peak(nq):
        d = rng.rand(nq, ng).astype(np.float32)
        qp, qc = rng.randint(0, 300, nq), rng.randint(0, 6, nq)
        tracemalloc.start()
        evaluate_rank(d, qp, gp, qc, gc, chunk_size=50)
        out = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return out, d.nbytes

    small, _ = peak(200)
    large, nbytes = peak(800)
    # only the per-query results (a few numbers each) grow with the number of queries, not rows of distances
    assert (large - small) / 600 < 0.02 * ng * 4
    assert large < 0.35 * nbytes        # far below one copy of the distance matrix


# ----------------------------------------------------------------------------- ranking without sorting rows
RANKER_PATHS = {
    "counting": {},                                                  # as shipped
    "counting, every row binned": {"SHORT_CUT_OUT": 1 << 40, "BLOCK": 1, "PER_BIN": 1, "SPREAD": 1},
    "counting, coarse bins": {"SHORT_CUT_OUT": 1 << 40, "PER_BIN": 50},
    "counting, every row sorted": {"SHORT_CUT_OUT": 0},
    "cut-out": {},                                                   # the previous ranker
    "cut-out, keys": {"LONG_CUT_OUT": 1},     # every float32 cut-out counted by keys (not sorted), as long ones
}


@pytest.fixture(params=sorted(RANKER_PATHS))
def ranker(request, monkeypatch):
    """Runs a test with each ranker of reid.evaluation.rank, and with each path of each forced; returns the
    ranker's name (evaluate_rank's `ranker`). Bin sizes, blocks and thresholds change the speed, never a count."""
    from reid.evaluation import rank
    for name, value in RANKER_PATHS[request.param].items():
        monkeypatch.setattr(rank, name, value)
    return request.param.split(",")[0]


def per_query_loop(distmat, q_pids, g_pids, q_camids, g_camids):
    """Per-query valid / AP / mINP term / first-match position / kept count, one stable argsort per row."""
    out = {k: [] for k in ("valid", "ap", "inp", "first", "num_kept")}
    for q in range(distmat.shape[0]):
        order = np.argsort(distmat[q], kind="stable")
        keep = ~((g_pids[order] == q_pids[q]) & (g_camids[order] == q_camids[q]))
        raw = (g_pids[order][keep] == q_pids[q]).astype(np.int64)
        hits = np.flatnonzero(raw)
        out["valid"].append(len(hits) > 0)
        out["num_kept"].append(int(keep.sum()))
        out["first"].append(hits[0] if len(hits) else -1)
        out["ap"].append(np.mean(np.arange(1, len(hits) + 1) / (hits + 1.0)) if len(hits) else 0.0)
        out["inp"].append(len(hits) / (hits[-1] + 1.0) if len(hits) else 0.0)
    return {k: np.array(v) for k, v in out.items()}


def assert_per_query_equal(got, ref):
    for key in ("valid", "first", "num_kept"):
        np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
    for key in ("ap", "inp"):
        np.testing.assert_allclose(got[key], ref[key], rtol=0, atol=1e-12, err_msg=key)


def test_rank_known_answer_with_junk_and_ties_at_matches(ranker):
    # query 0: pid 1, camera 0. Stable order by (distance, index): g3, g0 (junk), g1, g2 (match), g6, g4 (junk),
    # g5 (match); the kept list g3 g1 g2 g6 g5 has its matches at ranks 3 and 5. g2 ties a junk item and a
    # non-match at a lower index, g5 ties a junk item at a lower index.
    d = np.array([[0.2, 0.2, 0.2, 0.1, 0.3, 0.3, 0.25]] * 3)
    gp, gc = np.array([1, 5, 1, 7, 1, 1, 8]), np.array([0, 1, 2, 1, 0, 3, 1])
    qp, qc = np.array([1, 9, 8]), np.array([0, 0, 1])   # pid 9 absent; pid 8 only in the query's own camera
    ap, inp = (1 / 3 + 2 / 5) / 2, 2 / 5
    shifted = np.float32(d - 0.2)
    shifted[:, [0, 2]] = -0.0                           # -0.0 and 0.0 are equal distances, ordered by index
    for dist in (d, d.astype(np.float32), d - 1.0, shifted):
        cmc, mAP, mINP, per = evaluate_rank(dist, qp, gp, qc, gc, max_rank=5, return_per_query=True, ranker=ranker)
        assert per["valid"].tolist() == [True, False, False]
        assert per["first"][0] == 2 and per["num_kept"].tolist() == [5, 7, 6]
        assert mAP == pytest.approx(ap, abs=1e-12) and mINP == pytest.approx(inp, abs=1e-12)
        assert cmc.tolist() == [0, 0, 1, 1, 1]
    # the match at +inf is still ranked (last), and -inf first
    far = d[:1].copy()
    far[0, 5], far[0, 3] = np.inf, -np.inf
    _, mAP, mINP = evaluate_rank(far, qp[:1], gp, qc[:1], gc, ranker=ranker)
    assert mAP == pytest.approx((1 / 3 + 2 / 5) / 2, abs=1e-12) and mINP == pytest.approx(2 / 5, abs=1e-12)


def hard_random_case(rng, kind):
    """Random pids/cameras (some query pids absent from the gallery) and distances of one of several kinds,
    most with many exact ties."""
    nq, ng, npid = rng.randint(1, 30), rng.randint(2, 120), rng.randint(1, 12)
    qp, gp = rng.randint(0, npid + 3, nq), rng.randint(0, npid, ng)
    qc, gc = rng.randint(0, 3, nq), rng.randint(0, 3, ng)
    qp[0], qc[0] = gp[0], (gc[0] + 1) % 3                # at least one query has a valid match
    gp[1:][rng.rand(ng - 1) < 0.1] = -1                  # junk images (Market-1501's pid -1)
    if kind == "float32":
        d = rng.rand(nq, ng).astype(np.float32)
    elif kind == "float32 ties":
        d = (rng.randint(0, 4, (nq, ng)) / 4).astype(np.float32)
    elif kind == "float64 ties":
        d = rng.randint(-3, 3, (nq, ng)) / 3.0
    elif kind == "int":
        d = rng.randint(0, 6, (nq, ng))
    elif kind == "signed zeros":
        d = np.array([-1.0, -0.5, -0.0, 0.0, 0.5], np.float32)[rng.randint(0, 5, (nq, ng))]
    else:  # "infinite"
        d = np.array([-np.inf, 0.0, 1.0, np.inf])[rng.randint(0, 4, (nq, ng))]
    return d, qp, gp, qc, gc


def test_rank_equals_stable_argsort_loop_on_random_cases_with_ties(ranker):
    rng = np.random.RandomState(11)
    kinds = ("float32", "float32 ties", "float64 ties", "int", "signed zeros", "infinite")
    for trial in range(60):
        d, qp, gp, qc, gc = hard_random_case(rng, kinds[trial % len(kinds)])
        ref = per_query_loop(d, qp, gp, qc, gc)
        cmc, mAP, mINP, per = evaluate_rank(d, qp, gp, qc, gc, 15, chunk_size=rng.randint(1, 8),
                                            return_per_query=True, ranker=ranker)
        assert_per_query_equal(per, ref)
        ref_cmc, ref_mAP, ref_mINP = market_loop(d, qp, gp, qc, gc, 15)
        np.testing.assert_allclose(cmc, ref_cmc, rtol=0, atol=1e-12)
        assert mAP == pytest.approx(ref_mAP, abs=1e-12) and mINP == pytest.approx(ref_mINP, abs=1e-12)


def test_rank_identity_with_many_images_matches_loop(ranker):
    # float32 rows are counted by comparison with the row's matches, or by sorting when an identity has many
    # images compared with the items ahead of its farthest match: both, with ties, against the loop
    rng = np.random.RandomState(15)
    ng = 200
    gp = np.where(rng.rand(ng) < 0.6, 1, rng.randint(2, 40, ng))   # identity 1: ~120 images, the others a few
    gc = rng.randint(0, 3, ng)
    qp, qc = np.array([1, 1, 5, 7, 1]), np.array([0, 3, 1, 2, 1])
    for d in ((rng.randint(0, 30, (5, ng)) / 30).astype(np.float32), rng.rand(5, ng).astype(np.float32)):
        _, _, _, per = evaluate_rank(d, qp, gp, qc, gc, return_per_query=True, chunk_size=2, ranker=ranker)
        assert_per_query_equal(per, per_query_loop(d, qp, gp, qc, gc))


def test_rank_results_do_not_depend_on_the_chunk_size(ranker):
    rng = np.random.RandomState(12)
    nq, ng = 37, 300
    qp, gp = rng.randint(0, 25, nq), rng.randint(0, 20, ng)   # pids 20..24: queries without a match
    qc, gc = rng.randint(0, 4, nq), rng.randint(0, 4, ng)
    d = (rng.randint(0, 50, (nq, ng)) / 50).astype(np.float32)  # many ties
    whole = evaluate_rank(d, qp, gp, qc, gc, return_per_query=True, ranker=ranker)
    assert not whole[3]["valid"].all() and whole[3]["valid"].any()
    for chunk in (1, 2, 5, 36, 37, 100):
        part = evaluate_rank(d, qp, gp, qc, gc, chunk_size=chunk, return_per_query=True, ranker=ranker)
        np.testing.assert_array_equal(part[0], whole[0])
        assert part[1:3] == whole[1:3]
        for key in whole[3]:
            np.testing.assert_array_equal(part[3][key], whole[3][key], err_msg=key)
    assert_per_query_equal(whole[3], per_query_loop(d, qp, gp, qc, gc))


def test_cuhk03_single_shot_random_cases_with_ties_match_loop(ranker):
    rng = np.random.RandomState(13)
    for trial in range(6):
        d, qp, gp, qc, gc = hard_random_case(rng, ("float32 ties", "float64 ties", "signed zeros")[trial % 3])
        ref = cuhk03_loop(d, qp, gp, qc, gc, 10, 4, trial)
        for chunk in (1, None):
            cmc, mAP, _ = evaluate_rank(d, qp, gp, qc, gc, 10, use_metric_cuhk03=True, num_repeats=4, seed=trial,
                                        chunk_size=chunk, ranker=ranker)
            np.testing.assert_allclose(cmc, ref[:len(cmc)], rtol=0, atol=1e-12)
            assert mAP == pytest.approx(market_loop(d, qp, gp, qc, gc, 10)[1], abs=1e-12)


def test_counting_ranker_equals_the_loop_on_poor_and_good_models(monkeypatch):
    """Features of 40 identities at three noise levels: near-random (correct matches deep in every row: rows
    binned), medium, and near-perfect (matches first: rows sorted); with junk (pid -1), same-camera images,
    queries without a valid match and distances rounded to make ties. Per query equal to the stable-argsort
    loop (fast-reid's algorithm), the CUHK03 single-shot CMC to its loop, and the counting ranker took both of
    its paths."""
    from reid.evaluation import rank
    sorted_rows = []
    real = rank._sorted_cut_out
    monkeypatch.setattr(rank, "_sorted_cut_out", lambda *args: sorted_rows.append(1) or real(*args))
    rng = np.random.RandomState(16)
    centers = rng.randn(40, 16)
    gp = rng.randint(0, 40, 1500)
    gp[rng.rand(1500) < 0.05] = -1
    qp = np.concatenate([rng.randint(0, 40, 58), [-1, 41]])      # a junk query and one without any match
    qc, gc = rng.randint(0, 6, 60), rng.randint(0, 6, 1500)
    for noise, binned in ((30.0, True), (1.0, None), (0.05, False)):
        qf = centers[np.maximum(qp, 0) % 40] + noise * rng.randn(60, 16)
        gf = centers[np.maximum(gp, 0)] + noise * rng.randn(1500, 16)
        d = np.round(compute_distance(qf, gf, "cosine") * 256) / 256
        del sorted_rows[:]
        cmc, mAP, mINP, per = evaluate_rank(d, qp, gp, qc, gc, 20, return_per_query=True, chunk_size=17)
        assert_per_query_equal(per, per_query_loop(d, qp, gp, qc, gc))
        ref = market_loop(d, qp, gp, qc, gc, 20)
        np.testing.assert_allclose(cmc, ref[0], rtol=0, atol=1e-12)
        assert (mAP, mINP) == (pytest.approx(ref[1], abs=1e-12), pytest.approx(ref[2], abs=1e-12))
        valid = int(per["valid"].sum())
        if binned is not None:     # poor: every row binned; near-perfect: every row sorted
            assert len(sorted_rows) == (0 if binned else valid), (noise, len(sorted_rows), valid)
        cuhk = evaluate_rank(d, qp, gp, qc, gc, 20, use_metric_cuhk03=True, num_repeats=2, seed=1)[0]
        np.testing.assert_allclose(cuhk, cuhk03_loop(d, qp, gp, qc, gc, 20, 2, 1), rtol=0, atol=1e-12)
    assert mAP > 0.95


def test_unknown_ranker_is_refused():
    d, qp, gp, qc, gc = arr([[0.1, 0.2]], [1], [1, 2], [0], [1, 1])
    with pytest.raises(UserError, match="unknown ranker 'sort'; use one of: counting, cut-out"):
        evaluate_rank(d, qp, gp, qc, gc, ranker="sort")


@pytest.mark.parametrize("ranker", ["cut-out", "counting"])
def test_rank_memory_when_the_last_match_ends_every_row(ranker, monkeypatch):
    # the worst case for the cut-out: every query's farthest match is the farthest item of its row, so each row
    # is cut out whole. Memory holds one row's cut-out plus the chunk's positives (chunk x images per identity),
    # never a (chunk x gallery) block: small even with the whole matrix as one chunk. The counting ranker bins
    # every row here, BLOCK distances at a time (about 30 bytes of working arrays each): bounded by BLOCK, set
    # small here to show it.
    from reid.evaluation import rank
    monkeypatch.setattr(rank, "BLOCK", 1 << 14)
    rng = np.random.RandomState(14)
    nq, ng = 400, 8000
    gp, gc = rng.randint(0, 600, ng), rng.randint(0, 6, ng)
    qp, qc = gp[rng.randint(0, ng, nq)], rng.randint(6, 8, nq)  # cameras 6, 7: every positive is a valid match
    d = rng.rand(nq, ng).astype(np.float32)
    d[np.arange(nq), np.array([np.flatnonzero(gp == p)[-1] for p in qp])] = 2.0
    peaks = []
    for chunk in (25, nq):
        tracemalloc.start()
        _, _, mINP, per = evaluate_rank(d, qp, gp, qc, gc, chunk_size=chunk, return_per_query=True,
                                         ranker=ranker)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert per["valid"].all()
        assert mINP == pytest.approx(np.mean([(gp == p).sum() / ng for p in qp]), abs=1e-12)
    block = 40 * rank.BLOCK if ranker == "counting" else 0
    assert peaks[0] < 0.05 * d.nbytes + block and peaks[1] < 0.15 * d.nbytes + block, (peaks, d.nbytes)


# ----------------------------------------------------------------------------- distances, re-ranking, AQE
def test_distances():
    rng = np.random.RandomState(4)
    q, g = rng.randn(7, 5).astype(np.float32), rng.randn(11, 5).astype(np.float32)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    np.testing.assert_allclose(compute_distance(q, g, "cosine"), 1 - qn @ gn.T, atol=1e-6)
    eu = np.sqrt(((q[:, None].astype(np.float64) - g[None]) ** 2).sum(-1))
    np.testing.assert_allclose(compute_distance(q, g, "euclidean"), eu, atol=1e-5)
    np.testing.assert_array_equal(compute_distance(q, g, "euclidean", chunk_size=3),
                                  compute_distance(q, g, "euclidean"))
    assert compute_distance(q, g).dtype == np.float32
    with pytest.raises(UserError, match="unknown distance metric"):
        compute_distance(q, g, "manhattan")
    with pytest.raises(UserError, match="dim 5 but gallery features dim 4"):
        compute_distance(q, g[:, :4])


def rerank_loop(q_g, q_q, g_g, k1, k2, lam):
    """The authors' reference algorithm, written as plain loops over a dense V (stable argsort)."""
    nq = q_g.shape[0]
    orig = np.concatenate([np.concatenate([q_q, q_g], 1), np.concatenate([q_g.T, g_g], 1)]).astype(np.float32) ** 2
    orig = np.transpose(orig / np.max(orig, axis=0))
    n = orig.shape[0]
    rank = np.argsort(orig, axis=1, kind="stable")

    def recip(i, k):
        fwd = rank[i, :k + 1]
        return fwd[[i in rank[j, :k + 1] for j in fwd]]

    V = np.zeros((n, n), np.float32)
    for i in range(n):
        r = recip(i, k1)
        expansion = list(r)
        for c in r:
            rc = recip(c, int(np.around(k1 / 2.0)))
            if len(np.intersect1d(rc, r)) > 2.0 / 3 * len(rc):
                expansion += list(rc)
        e = np.unique(expansion)
        w = np.exp(-orig[i, e])
        V[i, e] = w / w.sum()
    if k2 != 1:
        V = np.stack([V[rank[i, :k2]].mean(0) for i in range(n)])
    final = np.zeros((nq, n - nq))
    for i in range(nq):
        for j in range(nq, n):
            mins = np.minimum(V[i], V[j]).sum()
            final[i, j - nq] = (1 - mins / (2 - mins)) * (1 - lam) + orig[i, j] * lam
    return final


def clustered(rng, num_ids, per_id, dim, noise):
    centers = rng.randn(num_ids, dim)
    pids = np.repeat(np.arange(num_ids), per_id)
    return (centers[pids] + noise * rng.randn(len(pids), dim)).astype(np.float32), pids


def test_rerank_matches_reference_loop():
    rng = np.random.RandomState(5)
    for nq, ng, k1, k2 in ((8, 40, 20, 6), (12, 36, 5, 3), (6, 30, 20, 1)):
        x, _ = clustered(rng, 8, (nq + ng) // 8 + 1, 12, 0.8)
        x = x[:nq + ng]
        d = compute_distance(x, x, "euclidean").astype(np.float64)
        d = (d + d.T) / 2  # exactly symmetric, so both row-normalisation conventions agree
        ref = rerank_loop(d[:nq, nq:], d[:nq, :nq], d[nq:, nq:], k1, k2, 0.3)
        got = re_ranking(d[:nq, nq:], d[:nq, :nq], d[nq:, nq:], k1, k2, 0.3, chunk_size=5)
        np.testing.assert_allclose(got, ref, atol=2e-6)


def test_rerank_and_aqe_improve_a_clustered_case():
    rng = np.random.RandomState(6)
    x, pids = clustered(rng, 30, 7, 16, 0.9)
    cams = np.tile([0, 1, 1, 1, 1, 1, 1], 30)
    is_q = cams == 0
    args = (x[is_q], x[~is_q], pids[is_q], pids[~is_q], cams[is_q], cams[~is_q])
    base = evaluate_features(*args, metric="euclidean")
    rr = evaluate_features(*args, metric="euclidean", rerank=dict(k1=6, k2=3, lambda_value=0.3))
    qe = evaluate_features(*args, metric="cosine", aqe=dict(qe_times=1, qe_k=3, alpha=3.0))
    assert rr["mAP"] > base["mAP"] + 3.0
    assert qe["mAP"] > evaluate_features(*args, metric="cosine")["mAP"] + 1.0


def test_aqe_matches_reference_loop():
    rng = np.random.RandomState(7)
    q, g = rng.randn(9, 6).astype(np.float32), rng.randn(20, 6).astype(np.float32)
    feats = np.concatenate([q, g]).astype(np.float64)
    for _ in range(2):
        normed = feats / np.linalg.norm(feats, axis=1, keepdims=True)
        sims = normed @ normed.T
        new = []
        for s in sims:
            top = np.argsort(-s, kind="stable")[:4]
            new.append((feats[top] * (s[top] ** 3.0)[:, None]).mean(0))
        feats = np.stack(new)
    got_q, got_g = aqe(q, g, qe_times=2, qe_k=4, alpha=3.0, chunk_size=5)
    np.testing.assert_allclose(np.concatenate([got_q, got_g]), feats, rtol=1e-4, atol=1e-5)
    same_q, _ = aqe(q, g, qe_k=1)          # only itself, weight 1: unchanged
    np.testing.assert_allclose(same_q, q, atol=1e-6)
    with pytest.raises(UserError, match="QE_K"):
        aqe(q, g, qe_k=0)


# ----------------------------------------------------------------------------- evaluator glue, table, images
def test_evaluate_features_paths_agree():
    rng = np.random.RandomState(8)
    x, pids = clustered(rng, 12, 5, 8, 1.2)
    cams = np.tile(np.arange(5), 12)
    is_q = cams == 0
    qf, gf, qp, gp, qc, gc = x[is_q], x[~is_q], pids[is_q], pids[~is_q], cams[is_q], cams[~is_q]
    for metric in ("cosine", "euclidean"):
        blockwise = evaluate_features(qf, gf, qp, gp, qc, gc, metric=metric, chunk_size=3)
        full, dist = evaluate_features(qf, gf, qp, gp, qc, gc, metric=metric, return_distmat=True)
        cmc, mAP, mINP = evaluate_rank(compute_distance(qf, gf, metric), qp, gp, qc, gc)
        assert blockwise == full
        assert full["mAP"] == pytest.approx(mAP * 100) and full["mINP"] == pytest.approx(mINP * 100)
        assert [full["Rank-%d" % r] for r in (1, 5, 10)] == pytest.approx([cmc[0] * 100, cmc[4] * 100, cmc[9] * 100])
        np.testing.assert_array_equal(dist, compute_distance(qf, gf, metric))
    rr = evaluate_features(qf, gf, qp, gp, qc, gc, rerank=dict(k1=20, k2=6, lambda_value=0.3))
    rd = re_ranking(compute_distance(qf, gf), compute_distance(qf, qf), compute_distance(gf, gf))
    assert rr["mAP"] == pytest.approx(evaluate_rank(rd, qp, gp, qc, gc)[1] * 100)


def test_options_from_cfg():
    from reid.config.config import get_cfg
    cfg = get_cfg()
    opts = options_from_cfg(cfg)
    assert opts == dict(metric="cosine", flip=False, max_rank=50, use_metric_cuhk03=False, rerank=None, aqe=None)
    cfg.TEST.RERANK.ENABLED = True
    cfg.TEST.AQE.ENABLED = True
    opts = options_from_cfg(cfg)
    assert opts["rerank"] == dict(k1=20, k2=6, lambda_value=0.3)
    assert opts["aqe"] == dict(qe_times=1, qe_k=5, alpha=3.0)


def test_format_results_table():
    res = {"CUHK03": {"Rank-1": 41.84, "Rank-5": 60.0, "Rank-10": 70.0, "mAP": 41.25, "mINP": 30.0},
           "Market1501": {"Rank-1": 89.3, "Rank-5": 95.0, "Rank-10": 97.0, "mAP": 74.3, "mINP": 40.0}}
    table = format_results_table(res)
    lines = table.splitlines()
    assert len(lines) == 5 and "Rank-1" in lines[0] and "mINP" in lines[0]
    assert "CUHK03" in lines[2] and "41.8" in lines[2] and "41.2" in lines[2]
    assert lines[4].startswith("| Average") and "65.6" in lines[4]  # (41.84 + 89.3) / 2 = 65.57


def test_save_rank_lists_borders(tmp_path):
    import cv2
    from reid.evaluation import visualize as vis
    paths = []
    for i in range(5):
        p = str(tmp_path / ("img%d.png" % i))
        cv2.imwrite(p, np.full((40, 20, 3), 60 * i, np.uint8))
        paths.append(p)
    q = [(paths[0], 1, 0, 0)]
    g = [(paths[1], 2, 1, 0), (paths[2], 1, 0, 0), (paths[3], 1, 1, 0), (paths[4], 3, 1, 0)]
    d = np.array([[0.1, 0.05, 0.3, 0.2]])  # g[1] is same pid + same camera: left out
    out = save_rank_lists(str(tmp_path / "vis"), d, q, g, topk=3, num_queries=5)
    assert len(out) == 1 and os.path.isfile(out[0])
    img = cv2.cvtColor(cv2.imread(out[0]), cv2.COLOR_BGR2RGB)
    cell_w = vis.CELL_W + 2 * vis.BORDER
    assert img.shape[1] == cell_w * 4 + vis.GAP
    y = vis.TITLE_H + 1  # inside the top border of each cell
    colors = [tuple(img[y, cell_w + vis.GAP + i * cell_w + cell_w // 2]) for i in range(3)]
    expected = [vis.RED, vis.RED, vis.GREEN]  # ranked: g0 (pid 2), g3 (pid 3), g2 (pid 1)
    for got, exp in zip(colors, expected):
        assert np.abs(np.array(got, int) - exp).max() <= 2, (colors, expected)
    with pytest.raises(UserError, match="does not match"):
        save_rank_lists(str(tmp_path / "vis"), d[:, :3], q, g)
