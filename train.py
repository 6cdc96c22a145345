#!/usr/bin/env python
"""Train ACL (or the baseline) on the configured source domains and evaluate on the targets.

    python train.py --config-file configs/synthetic/acl.yml [--backend torch] [--resume] [--max-restarts N]
        [KEY VALUE ...]
"""
import sys

from reid.engine.launch import parse_args, setup_cfg, supervise_training, train


def main(argv=None):
    args = parse_args(__doc__, training=True, argv=argv)
    cfg = setup_cfg(args)
    if args.max_restarts > 0:
        sys.exit(supervise_training(__file__, argv, cfg, args))
    train(cfg, resume=args.resume)


if __name__ == "__main__":
    main()
