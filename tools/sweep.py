#!/usr/bin/env python
"""Train variants of a recipe on several seeds, runs side by side, and print mean ± std per variant.

    python tools/sweep.py --config-file configs/synthetic/acl.yml --out output/sweep --seeds 0-2 --jobs 2 \\
        --variant demo= --variant lr02="SOLVER.BASE_LR 0.2" \\
        --variant baseline@configs/synthetic/baseline.yml= [--backend torch] [--device gpu] [KEY VALUE ...]

Each run is `train.py` with the variant's config and overrides, SEED and OUTPUT_DIR=OUT/runs/NAME_sSEED; the
trailing KEY VALUE pairs go to every run. Finished runs are lines of OUT/sweep.jsonl (a sweep started again
skips them); the table (also OUT/summary.md, OUT/summary.json) gives each variant's mean ± std over its seeds
and its per-seed difference from the first variant. Synthetic data is written once before the runs start.
`--stop-after S` starts no run after S seconds (a lease on a borrowed machine). `--summary-only` prints the table
of OUT/sweep.jsonl.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default="", metavar="FILE", help="config of variants that name none")
    p.add_argument("--variant", action="append", default=[], metavar="NAME[@CONFIG]=KEY VALUE ...",
                   help="repeatable; default: one variant 'base' of --config-file as it is")
    p.add_argument("--seeds", default="0,1,2", help="e.g. 0,1,2 or 0-5 (default 0,1,2)")
    p.add_argument("--out", required=True, metavar="DIR", help="receives runs/, sweep.jsonl, summary.md/json")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per run (default: cores // jobs)")
    p.add_argument("--backend", choices=("mindspore", "torch"), default=None, help="passed to train.py")
    p.add_argument("--device", default=None, help="passed to train.py (cpu, gpu, ascend)")
    p.add_argument("--stop-after", type=float, default=None, metavar="S", help="start no run after S seconds")
    p.add_argument("--target", default=None, help="test set the table reports (default: the first)")
    p.add_argument("--summary-only", action="store_true", help="print the table of OUT/sweep.jsonl and exit")
    p.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides for every run")
    args = p.parse_args(argv)

    from compat.errors import UserError
    from reid.engine import sweep
    if args.summary_only:
        rows = sweep.load_rows(os.path.join(args.out, "sweep.jsonl"))
        if not rows:
            raise UserError("no %s: run the sweep first (without --summary-only)" % os.path.join(args.out,
                                                                                             "sweep.jsonl"))
        print(sweep.format_table(sweep.summarise(rows, target=args.target)))
        return 0
    if args.jobs < 1 or args.threads < 0:
        raise UserError("--jobs must be at least 1 and --threads at least 0 (0: cores // jobs)")
    if len(args.opts) % 2:
        raise UserError("the trailing overrides come in KEY VALUE pairs, got %d words" % len(args.opts))
    variants = [sweep.parse_variant(v, args.config_file) for v in (args.variant or ["base="])]
    names = [v[0] for v in variants]
    if len(set(names)) != len(names):
        raise UserError("variant names repeat (%s): give each its own name" % ", ".join(names))
    seeds = sweep.parse_seeds(args.seeds)

    # every variant's config is loaded here first, so that a wrong key or file fails now, not after hours of runs
    from reid.config import load_cfg
    cfgs = []
    for name, config, opts in variants:
        if not os.path.isfile(config):
            raise UserError("variant %r: config file %s does not exist" % (name, config))
        cfgs.append(load_cfg(config, list(args.opts) + list(opts)))
    sweep.prepare_data(cfgs)

    train_args = (["--backend", args.backend] if args.backend else []) + \
        (["--device", args.device] if args.device else [])
    print("sweep: %d variants x %d seeds into %s, %d at a time" % (len(variants), len(seeds), args.out, args.jobs))
    table = sweep.run_sweep(variants, seeds, args.out, jobs=args.jobs, threads=args.threads or None,
                            common_opts=args.opts, train_args=train_args, stop_after=args.stop_after,
                            target=args.target)
    text = sweep.format_table(table)
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(table, fh, indent=1)
    failed = sweep.unfinished(sweep.load_rows(os.path.join(args.out, "sweep.jsonl")))
    if failed:
        print("sweep: %d runs failed (%s); their logs are OUT/runs/NAME_sSEED/sweep_run.log, and running the "
              "sweep again retries them" % (len(failed), ", ".join("%s seed %d" % f for f in failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
