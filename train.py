#!/usr/bin/env python
"""Train ACL (or the baseline): reid/cli/train.py, which `acl-reid-train` also runs (its --help)."""
from reid.cli.train import main

if __name__ == "__main__":
    main(script=__file__)   # ranks and the supervised child run this file again, as before
