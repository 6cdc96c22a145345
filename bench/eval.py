"""Speed of evaluate_rank against fast-reid's Cython evaluator (built from its PyPI wheel), the fast-reid /
torchreid numpy loop and, optionally, an earlier revision of ours, all on the same inputs in one run, with
checks that all give the same numbers.

    python bench/eval.py [--queries 3368 --gallery 15913 --dim 256 --seed 0] [--baseline-rev REV]
                         [--msmt [--msmt-queries 11659]] [--no-cython]

Compared on a Market-scale distance matrix (3,368 x 15,913 float32):
* fast-reid's Cython evaluator ``evaluate_cy``: ``rank_cy.pyx`` is taken from the ``fastreid`` wheel on PyPI
  (``pip download --no-deps``) and compiled with Cython in a temporary directory that is deleted afterwards
  (Cython is installed there with ``pip install --target`` when it is not importable); nothing is kept. When
  that fails (no network, no compiler) the column is skipped with the reason;
* the per-query numpy loop of fast-reid / torchreid (``eval_market1501`` of their ``rank.py``, re-implemented
  here: full ``np.argsort`` of the matrix, then one Python iteration per query), and the argsort alone;
* ``--baseline-rev REV``: ``reid/evaluation/rank.py`` as of git revision REV (e.g. the row-sorting version
  before the current one), loaded from ``git show``.
``--msmt`` adds the MSMT17 scale (11,659 x 82,161, the float32 matrix would be 3.8 GB): evaluate_features end to
end (distances and ranking block by block) with its peak traced memory, then the ranking alone, block by block on
the same distance blocks, for ours, the baseline revision and the Cython evaluator (whose per-query results do
not depend on the blocks; it gets each block as a matrix of its own).
Numbers must agree to 1e-6 (CMC, mAP, mINP); the exit status is 1 if any comparison does not.
"""
import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.evaluation.distance import compute_distance, distance_blocks  # noqa: E402
from reid.evaluation.evaluator import evaluate_features  # noqa: E402
from reid.evaluation.rank import RankAccumulator, evaluate_rank  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASTREID_WHEEL = "fastreid==1.4.0"   # the release whose rank_cy.pyx is compiled
CYTHON = "Cython==3.0.12"            # only installed (into the temporary directory) when Cython is not importable
TOLERANCE = 1e-6
BUILD_SCRIPT = """
import numpy as np
from setuptools import Extension, setup
from Cython.Build import cythonize
setup(name="rank_cy", script_args=["build_ext", "--inplace"],
      ext_modules=cythonize([Extension("rank_cy", ["rank_cy.pyx"], include_dirs=[np.get_include()])], quiet=True))
"""


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


def build_cython_evaluator(workdir):
    """fast-reid's ``evaluate_cy`` compiled from the PyPI wheel inside ``workdir``: (function, None) or
    (None, why not)."""
    def run(cmd, **kwargs):
        done = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, **kwargs)
        if done.returncode != 0:
            raise RuntimeError("%s failed: %s" % (" ".join(cmd[2:5]), done.stdout.strip().splitlines()[-1:]))

    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        run(pip + ["download", "--no-deps", "-d", "wheel", FASTREID_WHEEL], timeout=300)
        with zipfile.ZipFile(glob.glob(os.path.join(workdir, "wheel", "fastreid-*.whl"))[0]) as wheel:
            pyx = wheel.read("fastreid/evaluation/rank_cylib/rank_cy.pyx")
        with open(os.path.join(workdir, "rank_cy.pyx"), "wb") as f:
            f.write(pyx)
        env = dict(os.environ)
        if importlib.util.find_spec("Cython") is None:
            run(pip + ["install", "--target", "cython", CYTHON], timeout=300)
            env["PYTHONPATH"] = os.pathsep.join([os.path.join(workdir, "cython")] + sys.path)
        run([sys.executable, "-c", BUILD_SCRIPT], env=env, timeout=900)
        spec = importlib.util.spec_from_file_location("rank_cy", glob.glob(os.path.join(workdir, "rank_cy*.so"))[0])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.evaluate_cy, None
    except Exception as e:  # no network, no compiler, no headers, ...: skip the column, say why
        return None, "%s: %s" % (type(e).__name__, str(e).strip()[:300])


def cython_means(cmc, aps, inps):
    """evaluate_cy returns the CMC averaged over its valid queries and their per-query AP and INP (float32)."""
    return np.asarray(cmc, np.float64), float(np.mean(np.asarray(aps, np.float64))), \
        float(np.mean(np.asarray(inps, np.float64)))


def load_revision(rev, workdir):
    """reid/evaluation/rank.py as of git revision ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "show", "%s:reid/evaluation/rank.py" % rev], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    if source.returncode != 0:
        raise SystemExit("--baseline-rev %s: %s" % (rev, source.stderr.strip()))
    path = os.path.join(workdir, "rank_at_%s.py" % rev.replace("/", "_")[:40])
    with open(path, "w") as f:
        f.write(source.stdout)
    spec = importlib.util.spec_from_file_location("rank_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def traced_peak(fn, *args, **kwargs):
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def compare(name, ours, other):
    """Prints and returns whether (cmc, mAP, mINP) agree to TOLERANCE."""
    n = min(len(ours[0]), len(other[0]))
    diffs = (float(np.abs(np.asarray(ours[0][:n], np.float64) - np.asarray(other[0][:n], np.float64)).max()),
             abs(ours[1] - other[1]), abs(ours[2] - other[2]))
    same = max(diffs) <= TOLERANCE
    print("  same numbers as %-34s: %s (max |CMC diff| %.1e, |mAP diff| %.1e, |mINP diff| %.1e)"
          % (name, "yes" if same else "NO", *diffs))
    return same


def line(name, seconds, ours_seconds):
    print("  %-40s: %8.2f s   ours is %5.1fx faster" % (name, seconds, seconds / ours_seconds))


def market_case(args, evaluate_cy, baseline):
    rng = np.random.RandomState(args.seed)
    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, args.queries, args.gallery, args.dim)
    distmat = compute_distance(qf, gf, "cosine")
    print("Market scale: %d x %d float32 distance matrix" % distmat.shape)
    ours, t_ours = timed(evaluate_rank, distmat, q_pids, g_pids, q_cams, g_cams)
    print("  %-40s: %8.2f s   peak traced memory %.0f MB (the matrix itself: %.0f MB)"
          % ("ours (evaluate_rank)", t_ours,
             traced_peak(evaluate_rank, distmat, q_pids, g_pids, q_cams, g_cams) / 2 ** 20, distmat.nbytes / 2 ** 20))
    checks = []
    if evaluate_cy is not None:
        cy, t_cy = timed(evaluate_cy, distmat, q_pids, g_pids, q_cams, g_cams, 50, False)
        line("fast-reid Cython evaluate_cy", t_cy, t_ours)
        checks.append(("the Cython evaluator", cython_means(*cy)))
    if baseline is not None:
        old, t_old = timed(baseline.evaluate_rank, distmat, q_pids, g_pids, q_cams, g_cams)
        line("ours at %s" % args.baseline_rev, t_old, t_ours)
        checks.append(("ours at %s" % args.baseline_rev, old))
    # the loop = its full argsort (numpy's default kind) + the per-query loop, timed in two parts
    indices, t_sort = timed(np.argsort, distmat, axis=1)
    _, t_body = timed(reference_loop, distmat, q_pids, g_pids, q_cams, g_cams, indices=indices)
    line("fast-reid/torchreid numpy loop", t_sort + t_body, t_ours)
    line("  of which np.argsort of the matrix", t_sort, t_ours)
    del indices
    # Exact float32 ties exist at this size; numpy's default argsort (the loop's and the Cython evaluator's)
    # orders them arbitrarily, ours by gallery index: the exact reference is the loop on a stable argsort.
    stable = np.argsort(distmat, axis=1, kind="stable")
    checks.insert(0, ("the loop on a stable argsort", reference_loop(distmat, q_pids, g_pids, q_cams, g_cams,
                                                                      indices=stable)))
    del stable
    print("  Rank-1 %.2f%%  mAP %.2f%%  mINP %.2f%%" % (ours[0][0] * 100, ours[1] * 100, ours[2] * 100))
    return all([compare(name, ours, other) for name, other in checks])


def msmt_case(args, evaluate_cy, baseline):
    rng = np.random.RandomState(args.seed + 1)
    nq, ng = args.msmt_queries, 82161
    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, nq, ng, 128, num_ids=3060, num_cams=15)
    print("MSMT17 scale: %d x %d (float32 matrix: %.0f MB, never held)" % (nq, ng, nq * ng * 4 / 2 ** 20))
    tracemalloc.start()
    res, t_all = timed(evaluate_features, qf, gf, q_pids, g_pids, q_cams, g_cams, metric="cosine")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print("  evaluate_features end to end (distances + ranking, block by block): %.1f s, peak traced memory %.0f MB; "
          "Rank-1 %.2f%% mAP %.2f%% mINP %.2f%%" % (t_all, peak / 2 ** 20, res["Rank-1"], res["mAP"], res["mINP"]))

    ours = RankAccumulator(g_pids, g_cams)
    old = baseline.RankAccumulator(g_pids, g_cams) if baseline is not None else None
    t = dict(ours=0.0, old=0.0, cy=0.0)
    cy_cmc, cy_ap, cy_inp = 0.0, [], []
    rows = ours.chunk_size()
    for start, stop, block in distance_blocks(qf, gf, "cosine", rows):
        args_block = (block, q_pids[start:stop], q_cams[start:stop])
        t["ours"] += timed(ours.add, *args_block)[1]
        if old is not None:
            t["old"] += timed(old.add, *args_block)[1]
        if evaluate_cy is not None:
            try:
                (cmc, aps, inps), seconds = timed(evaluate_cy, *args_block[:2], g_pids, args_block[2], g_cams, 50,
                                                  False)
            except AssertionError:  # its message for a block without any valid query
                continue
            t["cy"] += seconds
            cy_cmc = cy_cmc + np.asarray(cmc, np.float64) * len(aps)
            cy_ap.append(aps)
            cy_inp.append(inps)
    result = ours.result()
    print("  ranking only, the same %d-query blocks for each:" % rows)
    print("  %-40s: %8.2f s" % ("ours (RankAccumulator)", t["ours"]))
    checks = []
    if evaluate_cy is not None:
        line("fast-reid Cython evaluate_cy", t["cy"], t["ours"])
        aps, inps = np.concatenate(cy_ap), np.concatenate(cy_inp)
        checks.append(("the Cython evaluator", (cy_cmc / len(aps), float(np.mean(aps.astype(np.float64))),
                                                float(np.mean(inps.astype(np.float64))))))
    if old is not None:
        line("ours at %s" % args.baseline_rev, t["old"], t["ours"])
        checks.append(("ours at %s" % args.baseline_rev, old.result()))
    return all([compare(name, result, other) for name, other in checks])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3368)
    parser.add_argument("--gallery", type=int, default=15913)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-rev", help="also time reid/evaluation/rank.py of this git revision")
    parser.add_argument("--msmt", action="store_true", help="also run the MSMT17 scale (minutes)")
    parser.add_argument("--msmt-queries", type=int, default=11659)
    parser.add_argument("--no-cython", action="store_true", help="skip building fast-reid's Cython evaluator")
    args = parser.parse_args()
    print("numpy %s, Python %d.%d, %d CPUs, load average %s" % (np.__version__, *sys.version_info[:2],
                                                                os.cpu_count() or 1,
                                                                " ".join("%.1f" % x for x in os.getloadavg())))
    with tempfile.TemporaryDirectory(prefix="reid-bench-eval-") as workdir:
        evaluate_cy = None
        if args.no_cython:
            print("fast-reid Cython evaluator: skipped (--no-cython)")
        else:
            (evaluate_cy, why_not), seconds = timed(build_cython_evaluator, workdir)
            print("fast-reid Cython evaluator: " + ("built from the %s wheel in %.0f s" % (FASTREID_WHEEL, seconds)
                                                    if evaluate_cy else "SKIPPED, could not be built (%s)" % why_not))
        baseline = load_revision(args.baseline_rev, workdir) if args.baseline_rev else None
        same = market_case(args, evaluate_cy, baseline)
        if args.msmt:
            same = msmt_case(args, evaluate_cy, baseline) and same
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
