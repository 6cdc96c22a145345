#!/usr/bin/env python
"""Train ACL (or the baseline) on the configured source domains and evaluate on the targets.

    python train.py --config-file configs/synthetic/acl.yml [--backend torch] [--resume] [KEY VALUE ...]
"""
from reid.engine.launch import parse_args, setup_cfg, train


def main(argv=None):
    args = parse_args(__doc__, training=True, argv=argv)
    cfg = setup_cfg(args)
    train(cfg, resume=args.resume)


if __name__ == "__main__":
    main()
