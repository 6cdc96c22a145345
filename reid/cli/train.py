"""Train ACL (or the baseline) on the configured source domains and evaluate on the targets.

    acl-reid-train --config-file configs/synthetic/acl.yml [--backend torch] [--resume] [--max-restarts N]
        [--nproc N [--nnodes M --node-rank R --master-addr HOST --master-port PORT]] [KEY VALUE ...]
    (in a checkout, also: python train.py ...)
"""
import sys

from reid.engine.distributed import launched_rank
from reid.engine.launch import launch_distributed, parse_args, setup_cfg, supervise_training, train


def main(argv=None, script="reid.cli.train"):
    """`script`: what the ranks and the supervised child run again (a .py file, or this module)."""
    args = parse_args(__doc__, training=True, argv=argv)
    cfg = setup_cfg(args)
    if args.nproc * args.nnodes > 1 and not launched_rank():
        sys.exit(launch_distributed(script, argv, cfg, args))
    if args.max_restarts > 0:
        sys.exit(supervise_training(script, argv, cfg, args))
    train(cfg, resume=args.resume)


if __name__ == "__main__":
    main()
