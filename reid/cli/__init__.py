"""The command-line tools as console commands (pyproject.toml's [project.scripts]; `pip install -e .`).

    acl-reid-train    train.py            acl-reid-index    tools/index.py
    acl-reid-test     test.py             acl-reid-search   tools/search.py
    acl-reid-export   tools/export.py     acl-reid-convert  tools/convert.py
    acl-reid-sweep    tools/sweep.py

train and test live here (reid.cli.train, reid.cli.test; the checkout's train.py and test.py call them); the
others are the tools/ scripts themselves, which the package installs as `acl_reid_tools` (pyproject.toml's
package-dir), so that `python tools/index.py` in a checkout and `acl-reid-index` run the same code.
"""
