"""Recipe sweeps: several variants of a config, each trained on several seeds by `train.py` processes run side
by side, one JSON line per finished run and a table of mean ± std per variant (tools/sweep.py is the CLI).

A variant is ``NAME[@CONFIG]=KEY VALUE ...``: a name, optionally its own config file, and the overrides it adds
(shell-style quoting for values with spaces, e.g. ``SOLVER.STEPS "[26, 27]"``). Seeds are paired across
variants (the same SEED gives every variant the same data order and initial draws), so the table also gives
each variant's mean difference from the first one on the seeds both have, which is far less noisy than the
difference of the means when seeds move all variants together.

This module imports no framework: the sweeping process stays small, and each run is a child process.
"""
import json
import math
import os
import shlex
import statistics
import subprocess
import time

from reid.errors import UserError
from reid.engine.distributed import python_command

RESULT_KEYS = ("mAP", "Rank-1", "mINP")
# each run: the checkout's train.py, else (an installed package) the module behind acl-reid-train
_CHECKOUT_TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "train.py")
TRAIN = _CHECKOUT_TRAIN if os.path.isfile(_CHECKOUT_TRAIN) else "reid.cli.train"


def parse_variant(text, default_config):
    """``NAME[@CONFIG]=KEY VALUE ...`` -> (name, config, [opts]). Raises UserError naming what is wrong."""
    head, sep, tail = text.partition("=")
    if not sep:
        raise UserError("variant %r has no '=': write NAME=KEY VALUE ... (NAME= for the config as it is)" % text)
    name, _, config = head.partition("@")
    name, config = name.strip(), config.strip() or default_config
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise UserError("variant name %r: use letters, digits, '-', '_' or '.' (it names the run's folder)" % name)
    try:
        opts = shlex.split(tail)
    except ValueError as exc:
        raise UserError("variant %r: cannot split its overrides (%s); quote values with spaces" % (name, exc)) from None
    if len(opts) % 2:
        raise UserError("variant %r: overrides come in KEY VALUE pairs, got %d words" % (name, len(opts)))
    if not config:
        raise UserError("variant %r has no config: pass --config-file or write NAME@CONFIG=..." % name)
    return name, config, opts


def parse_seeds(text):
    """'0,1,2' or '0-5' (or a mix: '0-2,7') -> sorted list of ints."""
    seeds = set()
    for part in str(text).replace(" ", "").split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise UserError("--seeds %r: write seeds as 0,1,2 or 0-5 (non-negative integers)" % text)
        seeds.update(range(int(lo), int(hi or lo) + 1))
    if not seeds:
        raise UserError("--seeds %r names no seed" % text)
    return sorted(seeds)


def run_dir(out_dir, name, seed):
    return os.path.join(out_dir, "runs", "%s_s%d" % (name, seed))


def load_rows(path):
    """The rows of a sweep.jsonl written earlier ([] when there is none)."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise UserError("%s line %d is not JSON (a run stopped while writing it?): delete that line and "
                                "run the sweep again" % (path, number)) from None
    return rows


def unfinished(rows):
    """(variant, seed) pairs whose latest row is a failure."""
    latest = {}
    for r in rows:
        latest[(r["variant"], r["seed"])] = r
    return sorted(k for k, r in latest.items() if r.get("rc") != 0)


def _mean_std(values):
    """(mean, std with n-1); the std is NaN for one value."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def summarise(rows, target=None, order=None):
    """Per variant, over its successful runs on `target` (default: the alphabetically first target of the first
    successful run): n, seeds, mean and std (n-1) of each RESULT_KEYS metric, and, against the first variant with
    runs in `order` (then in the rows), the mean and std of the per-seed differences on the seeds both have.
    Returns a list of dicts in that order."""
    ok = [r for r in rows if r.get("rc") == 0 and r.get("results")]
    if not ok:
        return []
    target = target or sorted(ok[0]["results"])[0]
    names = list(order or [])
    for r in ok:
        if r["variant"] not in names:
            names.append(r["variant"])
    by_variant = {}
    for r in ok:
        if target in r["results"]:
            by_variant.setdefault(r["variant"], {})[r["seed"]] = r["results"][target]
    names = [name for name in names if name in by_variant]
    if not names:
        return []
    reference = by_variant[names[0]]
    table = []
    for name in names:
        runs = by_variant[name]
        seeds = sorted(runs)
        row = {"variant": name, "target": target, "n": len(seeds), "seeds": seeds}
        for key in RESULT_KEYS:
            row[key] = _mean_std([runs[s][key] for s in seeds])
        shared = [s for s in seeds if s in reference]
        if name != names[0] and shared:
            row["paired"] = {key: _mean_std([runs[s][key] - reference[s][key] for s in shared]) for key in RESULT_KEYS}
            row["paired_n"] = len(shared)
        table.append(row)
    return table


def format_table(table):
    """Markdown table of summarise()'s rows."""
    if not table:
        return "no finished runs"
    first = table[0]["variant"]
    lines = ["target: %s; mean ± std (n-1) over seeds; 'vs %s': the mean ± std of the per-seed differences"
             % (table[0]["target"], first), "",
             "| variant | seeds | mAP | Rank-1 | mINP | mAP vs %s | Rank-1 vs %s |" % (first, first),
             "|---|---|---|---|---|---|---|"]

    def fmt(ms, sign=""):
        mean = ("%" + sign + ".1f") % ms[0]
        return mean if math.isnan(ms[1]) else "%s ± %.1f" % (mean, ms[1])

    for row in table:
        paired = row.get("paired")
        diff = ["%s (n=%d)" % (fmt(paired[k], "+"), row["paired_n"]) if paired else "" for k in ("mAP", "Rank-1")]
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            row["variant"], ",".join(str(s) for s in row["seeds"]), fmt(row["mAP"]), fmt(row["Rank-1"]),
            fmt(row["mINP"]), diff[0], diff[1]))
    return "\n".join(lines)


def _read_run(out):
    """The finished run's results ({target: {metric: value}}) and its last logged loss_cls, from OUTPUT_DIR."""
    with open(os.path.join(out, "results.json")) as fh:
        results = json.load(fh)["results"]
    loss = None
    metrics = os.path.join(out, "metrics.json")
    if os.path.exists(metrics):
        with open(metrics) as fh:
            for line in fh:
                value = json.loads(line).get("loss_cls")
                loss = value if value is not None else loss
    return results, loss


def prepare_data(configs):
    """Write every built-in synthetic domain the configs train or test on, once, before runs start side by side
    (each run would otherwise generate the same files at the same time). `configs`: loaded cfgs."""
    from reid.data.datasets.registry import resolve_root
    from reid.data.synthetic import SYNTHETIC_DOMAINS, ensure_synthetic
    done = set()
    for cfg in configs:   # by the built-in names: a dataset of DATASETS.CUSTOM may be called SynthSomething
        names = [n for n in list(cfg.DATASETS.NAMES) + list(cfg.DATASETS.TESTS) if n in SYNTHETIC_DOMAINS]
        key = (resolve_root(cfg=cfg), cfg.DATASETS.SYNTHETIC.SEED, cfg.DATASETS.SYNTHETIC.NUM_IDS)
        if names and key not in done:
            ensure_synthetic(os.path.join(key[0], "synthetic"), seed=key[1], num_ids=key[2], domains=names)
            done.add(key)


def run_sweep(variants, seeds, out_dir, jobs=1, threads=None, common_opts=(), train_args=(), stop_after=None,
              target=None, python=None, progress=True, log=print):
    """Train every (variant, seed) not already in OUTPUT/sweep.jsonl with rc 0, `jobs` at a time, each child with
    `threads` CPU threads (OMP / MKL / REID_NUM_THREADS; default: cores // jobs). `variants`: parse_variant()
    tuples; `common_opts`: overrides for every run; `train_args`: train.py options such as --backend torch.
    No run starts after `stop_after` seconds. Returns the summary table on `target` (see summarise)."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    path = os.path.join(out_dir, "sweep.jsonl")
    settings = {name: {"config": config, "opts": list(opts), "common_opts": list(common_opts),
                       "train_args": list(train_args)} for name, config, opts in variants}
    done = set()
    for r in load_rows(path):
        if r["variant"] in settings and r.get("rc") == 0:
            earlier = {k: r.get(k) for k in settings[r["variant"]]}
            if earlier != settings[r["variant"]]:
                raise UserError("%s holds variant %r trained with other settings (%s); give the variant another "
                                "name or the sweep another --out" % (path, r["variant"], earlier))
            done.add((r["variant"], r["seed"]))
    pending = [(v, s) for s in seeds for v in variants if (v[0], s) not in done]
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, jobs))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               REID_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(pending), desc="sweep", unit="run")
    start, running = time.time(), []
    with open(path, "a") as sink:
        while pending or running:
            while pending and len(running) < jobs and (stop_after is None or time.time() - start < stop_after):
                (name, config, opts), seed = pending.pop(0)
                out = run_dir(out_dir, name, seed)
                cmd = python_command(TRAIN, python) + ["--config-file", config] + list(train_args) + \
                    list(common_opts) + list(opts) + ["SEED", str(seed), "OUTPUT_DIR", out]
                if os.path.isdir(out) and os.listdir(out):   # an earlier attempt that failed or was stopped
                    attempt = 1
                    while os.path.exists("%s.attempt-%d" % (out, attempt)):
                        attempt += 1
                    os.rename(out, "%s.attempt-%d" % (out, attempt))   # kept, not mixed into the new run
                os.makedirs(out, exist_ok=True)
                logfile = open(os.path.join(out, "sweep_run.log"), "w")
                # in the caller's folder, as a train.py typed there would run: relative paths mean the same
                proc = subprocess.Popen(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT)
                running.append((name, seed, out, proc, logfile, time.time()))
            if stop_after is not None and time.time() - start >= stop_after and pending:
                log("sweep: --stop-after %.0f s reached, %d runs not started" % (stop_after, len(pending)))
                pending = []
            for item in list(running):
                name, seed, out, proc, logfile, began = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                logfile.close()
                row = dict({"variant": name, "seed": seed, "rc": proc.returncode,
                            "seconds": round(time.time() - began, 1), "output_dir": out}, **settings[name])
                if proc.returncode == 0:
                    try:
                        row["results"], row["loss_cls_last"] = _read_run(out)
                    except (OSError, ValueError, KeyError) as exc:
                        row["rc"], row["error"] = -1, "no results.json: %s" % exc
                else:
                    row["error"] = "train.py exited with %d; see %s" % (proc.returncode,
                                                                         os.path.join(out, "sweep_run.log"))
                    log("sweep: %s seed %d failed (rc %d): %s" % (name, seed, proc.returncode, row["error"]))
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                if bar is not None:
                    bar.update(1)
            time.sleep(0.5)
    if bar is not None:
        bar.close()
    return summarise(load_rows(path), target=target, order=[v[0] for v in variants])
