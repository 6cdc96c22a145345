#!/usr/bin/env python
"""Train ACL (or the baseline) on the configured source domains and evaluate on the targets.

    python train.py --config-file configs/synthetic/acl.yml [--backend torch] [--resume] [--max-restarts N]
        [--nproc N [--nnodes M --node-rank R --master-addr HOST --master-port PORT]] [KEY VALUE ...]
"""
import sys

from reid.engine.distributed import launched_rank
from reid.engine.launch import launch_distributed, parse_args, setup_cfg, supervise_training, train


def main(argv=None):
    args = parse_args(__doc__, training=True, argv=argv)
    cfg = setup_cfg(args)
    if args.nproc * args.nnodes > 1 and not launched_rank():
        sys.exit(launch_distributed(__file__, argv, cfg, args))
    if args.max_restarts > 0:
        sys.exit(supervise_training(__file__, argv, cfg, args))
    train(cfg, resume=args.resume)


if __name__ == "__main__":
    main()
