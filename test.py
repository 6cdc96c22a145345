#!/usr/bin/env python
"""Evaluate trained weights: reid/cli/test.py, which `acl-reid-test` also runs (its --help)."""
from reid.cli.test import main

if __name__ == "__main__":
    main()
