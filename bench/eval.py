"""Speed of evaluate_rank (its counting ranker, and the cut-out ranker it replaced) against fast-reid's Cython
evaluator (built from its PyPI wheel), the fast-reid / torchreid numpy loop and, optionally, an earlier
revision of ours, all on the same inputs in one run, with checks that all give the same numbers.

    python bench/eval.py [--cases poor,medium,good] [--no-msmt] [--queries 3368 --gallery 15913 --dim 256]
                         [--msmt-queries 11659] [--seed 0] [--baseline-rev REV] [--no-cython]

Three cases of synthetic identity-cluster features, the noise set for a model of mAP ~1% ("poor": the correct
matches sit deep in every row), ~30% ("medium", where domain-generalisation targets are) and ~99% ("good"),
each at two scales:
* Market (3,368 x 15,913 float32 distances): ``evaluate_rank`` with each ranker, the Cython evaluator and the
  numpy loop on the same matrix;
* MSMT17 (11,659 x 82,161; the float32 matrix would be 3.8 GB, so it is never held): the ranking alone, block
  by block on the same distance blocks for each (the Cython evaluator gets each block as a matrix of its own;
  its per-query results do not depend on the blocks); for the first case also ``evaluate_features`` end to end
  (distances and ranking) with its peak traced memory. ``--no-msmt`` leaves this scale out (minutes: most of
  it the Cython evaluator's argsort).
The columns:
* fast-reid's Cython evaluator ``evaluate_cy``: ``rank_cy.pyx`` is taken from the ``fastreid`` wheel on PyPI
  (``pip download --no-deps``) and compiled with Cython in a temporary directory that is deleted afterwards
  (Cython is installed there with ``pip install --target`` when it is not importable); nothing is kept. When
  that fails (no network, no compiler) the column is skipped with the reason;
* the per-query numpy loop of fast-reid / torchreid (``eval_market1501`` of their ``rank.py``, re-implemented
  here: full ``np.argsort`` of the matrix, then one Python iteration per query), and the argsort alone
  (Market scale);
* ``--baseline-rev REV``: ``reid/evaluation/rank.py`` as of git revision REV, loaded from ``git show``.
Numbers must agree to 1e-6 (CMC, mAP, mINP) with the exact reference, the numpy loop on a stable argsort (equal
distances in gallery order, as ours), and with every other column; the Cython evaluator sorts with numpy's
default argsort, which orders exactly equal float32 distances arbitrarily, so where it differs it must equal the
loop on that argsort (said on its line). The exit status is 1 if any comparison does not hold. The summary
ends with the counting ranker's speed-up over the Cython evaluator per case, against the target of 10x.
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


def reference_loop(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50, indices=None, parts=False):
    """fast-reid / torchreid numpy evaluation: argsort everything (``indices``, if not given), then a Python
    loop over queries. ``parts``: (CMC summed over the valid queries, their APs, their INPs) instead of means."""
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
    if parts:
        return np.asarray(all_cmc, np.float64).sum(0), all_ap, all_inp
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


# noise of the features around their identity's centre per case and scale: mAP ~1%, ~30%, ~99%
CASES = {"poor": {"market": 4.0, "msmt": 2.6}, "medium": {"market": 2.2, "msmt": 1.6},
         "good": {"market": 1.35, "msmt": 1.0}}
TARGET = 10.0   # the counting ranker's speed-up over the Cython evaluator aimed at, every case


def market_like(rng, num_q, num_g, dim, num_ids=750, num_cams=6, noise=2.0):
    """Features of identity clusters: queries one per (id, camera) drawn, gallery of the same ids + distractors;
    `noise` (the features' spread around their identity's centre) sets how good the "model" is."""
    centers = rng.randn(num_ids + 1, dim).astype(np.float32)
    q_pids = rng.randint(1, num_ids + 1, num_q)
    g_pids = np.concatenate([rng.randint(1, num_ids + 1, num_g - num_g // 15), np.zeros(num_g // 15, int)])
    q_cams, g_cams = rng.randint(0, num_cams, num_q), rng.randint(0, num_cams, num_g)
    qf = centers[q_pids] + noise * rng.randn(num_q, dim).astype(np.float32)
    gf = centers[g_pids] + noise * rng.randn(num_g, dim).astype(np.float32)
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


def _diffs(a, b):
    n = min(len(a[0]), len(b[0]))
    return (float(np.abs(np.asarray(a[0][:n], np.float64) - np.asarray(b[0][:n], np.float64)).max()),
            abs(a[1] - b[1]), abs(a[2] - b[2]))


def compare(name, ours, other, default_order=None):
    """Prints and returns whether (cmc, mAP, mINP) agree to TOLERANCE. ``default_order``: the loop's numbers
    on numpy's default argsort, for an evaluator built on it (the Cython one): where it differs from ours but
    equals those, the difference is only how that argsort orders exactly equal distances (ours orders them by
    gallery index, as the loop on a stable argsort, the exact reference, does), and it counts as agreeing."""
    diffs = _diffs(ours, other)
    same = max(diffs) <= TOLERANCE
    why = ""
    if not same and default_order is not None and max(_diffs(other, default_order)) <= TOLERANCE:
        same, why = True, "; ties: it equals the loop on numpy's default argsort, which orders equal distances " \
                          "arbitrarily"
    print("  same numbers as %-34s: %s (max |CMC diff| %.1e, |mAP diff| %.1e, |mINP diff| %.1e%s)"
          % (name, "yes" if max(diffs) <= TOLERANCE else "NO", *diffs, why))
    return same


def line(name, seconds, ours_seconds):
    print("  %-40s: %8.2f s   ours is %5.1fx faster" % (name, seconds, seconds / ours_seconds))


def market_case(args, case, evaluate_cy, baseline):
    """(numbers agree, {column: seconds}) of one case at Market scale."""
    rng = np.random.RandomState(args.seed)
    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, args.queries, args.gallery, args.dim,
                                                         noise=CASES[case]["market"])
    distmat = compute_distance(qf, gf, "cosine")
    del qf, gf
    inputs = (distmat, q_pids, g_pids, q_cams, g_cams)
    ours, t_ours = timed(evaluate_rank, *inputs)
    print("Market scale, %s case: %d x %d float32 distance matrix, Rank-1 %.2f%% mAP %.2f%% mINP %.2f%%"
          % ((case,) + distmat.shape + (ours[0][0] * 100, ours[1] * 100, ours[2] * 100)))
    print("  %-40s: %8.2f s   peak traced memory %.0f MB (the matrix itself: %.0f MB)"
          % ("ours (evaluate_rank, counting)", t_ours, traced_peak(evaluate_rank, *inputs) / 2 ** 20,
             distmat.nbytes / 2 ** 20))
    seconds = {"ours": t_ours}
    checks = []
    cut_out, seconds["cut-out"] = timed(evaluate_rank, *inputs, ranker="cut-out")
    line("ours, the cut-out ranker", seconds["cut-out"], t_ours)
    checks.append(("the cut-out ranker", cut_out))
    if evaluate_cy is not None:
        cy, seconds["cython"] = timed(evaluate_cy, *inputs, 50, False)
        line("fast-reid Cython evaluate_cy", seconds["cython"], t_ours)
        checks.append(("the Cython evaluator", cython_means(*cy)))
    if baseline is not None:
        old, seconds["baseline"] = timed(baseline.evaluate_rank, *inputs)
        line("ours at %s" % args.baseline_rev, seconds["baseline"], t_ours)
        checks.append(("ours at %s" % args.baseline_rev, old))
    # the loop = its full argsort (numpy's default kind) + the per-query loop, timed in two parts
    indices, t_sort = timed(np.argsort, distmat, axis=1)
    default_order, t_body = timed(reference_loop, *inputs, indices=indices)
    line("fast-reid/torchreid numpy loop", t_sort + t_body, t_ours)
    line("  of which np.argsort of the matrix", t_sort, t_ours)
    del indices
    # Exact float32 ties exist at this size; numpy's default argsort (the loop's and the Cython evaluator's)
    # orders them arbitrarily, ours by gallery index: the exact reference is the loop on a stable argsort.
    stable = np.argsort(distmat, axis=1, kind="stable")
    checks.insert(0, ("the loop on a stable argsort", reference_loop(*inputs, indices=stable)))
    del stable
    return all([compare(name, ours, other, default_order if name == "the Cython evaluator" else None)
                for name, other in checks]), seconds


def msmt_case(args, case, evaluate_cy, baseline, end_to_end):
    """(numbers agree, {column: seconds}) of one case at MSMT17 scale, ranking only, block by block."""
    rng = np.random.RandomState(args.seed + 1)
    nq, ng = args.msmt_queries, 82161
    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(rng, nq, ng, 128, num_ids=3060, num_cams=15,
                                                         noise=CASES[case]["msmt"])
    print("MSMT17 scale, %s case: %d x %d (float32 matrix: %.0f MB, never held)" % (case, nq, ng,
                                                                                   nq * ng * 4 / 2 ** 20))
    if end_to_end:
        tracemalloc.start()
        res, t_all = timed(evaluate_features, qf, gf, q_pids, g_pids, q_cams, g_cams, metric="cosine")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print("  evaluate_features end to end (distances + ranking, block by block): %.1f s, peak traced memory "
              "%.0f MB" % (t_all, peak / 2 ** 20))
    rankers = {"ours": RankAccumulator(g_pids, g_cams), "cut-out": RankAccumulator(g_pids, g_cams, ranker="cut-out")}
    if baseline is not None:
        rankers["baseline"] = baseline.RankAccumulator(g_pids, g_cams)
    seconds = dict.fromkeys(list(rankers) + (["cython"] if evaluate_cy is not None else []), 0.0)
    cy_cmc, cy_ap, cy_inp = 0.0, [], []
    # the loop on each argsort, summed: the stable one is the exact reference, the default one (quicksort) the
    # Cython evaluator's order of ties, needed only beside it
    loops = {kind: [0.0, [], []] for kind in ("stable", "quicksort")[:1 if evaluate_cy is None else 2]}
    rows = rankers["ours"].chunk_size()
    for start, stop, block in distance_blocks(qf, gf, "cosine", rows):
        args_block = (block, q_pids[start:stop], q_cams[start:stop])
        for name, acc in rankers.items():
            seconds[name] += timed(acc.add, *args_block)[1]
        for kind, total in loops.items():
            cmc, aps, inps = reference_loop(block, args_block[1], g_pids, args_block[2], g_cams,
                                            indices=np.argsort(block, axis=1, kind=kind), parts=True)
            total[0] = total[0] + cmc
            total[1] += aps
            total[2] += inps
        if evaluate_cy is not None:
            try:
                (cmc, aps, inps), t = timed(evaluate_cy, *args_block[:2], g_pids, args_block[2], g_cams, 50, False)
            except AssertionError:  # its message for a block without any valid query
                continue
            seconds["cython"] += t
            cy_cmc = cy_cmc + np.asarray(cmc, np.float64) * len(aps)
            cy_ap.append(aps)
            cy_inp.append(inps)
    result = rankers["ours"].result()
    print("  ranking only, the same %d-query blocks for each; Rank-1 %.2f%% mAP %.2f%% mINP %.2f%%"
          % (rows, result[0][0] * 100, result[1] * 100, result[2] * 100))
    print("  %-40s: %8.2f s" % ("ours (RankAccumulator, counting)", seconds["ours"]))
    line("ours, the cut-out ranker", seconds["cut-out"], seconds["ours"])
    stable, default_order = ((total[0] / len(total[1]), float(np.mean(total[1])), float(np.mean(total[2])))
                             if total else None for total in (loops["stable"], loops.get("quicksort")))
    checks = [("the loop on a stable argsort", stable), ("the cut-out ranker", rankers["cut-out"].result())]
    if evaluate_cy is not None:
        line("fast-reid Cython evaluate_cy", seconds["cython"], seconds["ours"])
        aps, inps = np.concatenate(cy_ap), np.concatenate(cy_inp)
        checks.append(("the Cython evaluator", (cy_cmc / len(aps), float(np.mean(aps.astype(np.float64))),
                                                float(np.mean(inps.astype(np.float64))))))
    if baseline is not None:
        line("ours at %s" % args.baseline_rev, seconds["baseline"], seconds["ours"])
        checks.append(("ours at %s" % args.baseline_rev, rankers["baseline"].result()))
    return all([compare(name, result, other, default_order if name == "the Cython evaluator" else None)
                for name, other in checks]), seconds


def cpu_description():
    """The CPU model and its vector extensions, from /proc/cpuinfo (Linux)."""
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
    except OSError:
        return "unknown CPU"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    vector = [name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag in flags]
    return "%s (%s)" % (model, ", ".join(vector) or "no AVX2")


def summary(times):
    """The counting ranker's speed-up over the Cython evaluator (and over the cut-out ranker) per case."""
    print("Summary: seconds, and the speed-up of the counting ranker (target: at least %.0fx the Cython "
          "evaluator in every case)" % TARGET)
    met = True
    for (scale, case), sec in times:
        cy = sec.get("cython")
        ratio = cy / sec["ours"] if cy else float("nan")
        met = met and bool(cy) and ratio >= TARGET
        print("  %-6s %-6s  counting %7.2f s   cut-out %7.2f s (%5.1fx)   Cython %s" % (
            scale, case, sec["ours"], sec["cut-out"], sec["cut-out"] / sec["ours"],
            "%7.2f s (%5.1fx)" % (cy, ratio) if cy else "skipped"))
    print("  target %s" % ("met in every case" if met else "NOT met in every case (or the Cython column skipped)"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: %s" % ", ".join(CASES))
    parser.add_argument("--queries", type=int, default=3368)
    parser.add_argument("--gallery", type=int, default=15913)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-rev", help="also time reid/evaluation/rank.py of this git revision")
    parser.add_argument("--no-msmt", action="store_true", help="leave out the MSMT17 scale (minutes)")
    parser.add_argument("--msmt-queries", type=int, default=11659)
    parser.add_argument("--no-cython", action="store_true", help="skip building fast-reid's Cython evaluator")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error("unknown case(s) %s; use: %s" % (", ".join(unknown), ", ".join(CASES)))
    print("numpy %s, Python %d.%d, %d CPUs: %s; load average %s" % (
        np.__version__, *sys.version_info[:2], os.cpu_count() or 1, cpu_description(),
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
        same, times = True, []
        for case in cases:
            ok, sec = market_case(args, case, evaluate_cy, baseline)
            same, times = same and ok, times + [(("Market", case), sec)]
        if not args.no_msmt:
            for i, case in enumerate(cases):
                ok, sec = msmt_case(args, case, evaluate_cy, baseline, end_to_end=i == 0)
                same, times = same and ok, times + [(("MSMT17", case), sec)]
        summary(times)
    print("load average at the end %s" % " ".join("%.1f" % x for x in os.getloadavg()))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
