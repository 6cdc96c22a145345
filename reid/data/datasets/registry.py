"""The dataset registry, and where the datasets live (root resolution)."""
import os

from reid.registry import Registry

DEFAULT_ROOT = "datasets"
DATASET_REGISTRY = Registry("dataset", "DATASETS.NAMES / DATASETS.TESTS")


def resolve_root(root=None, cfg=None):
    """Where the datasets live: an explicit ``root`` > the ``REID_DATA`` environment variable >
    ``cfg.DATASETS.ROOT`` > ``"datasets"``."""
    if root:
        return os.path.abspath(os.path.expanduser(str(root)))
    env = os.environ.get("REID_DATA", "").strip()
    if env:
        return os.path.abspath(os.path.expanduser(env))
    if cfg is not None and getattr(getattr(cfg, "DATASETS", None), "ROOT", ""):
        return os.path.abspath(os.path.expanduser(str(cfg.DATASETS.ROOT)))
    return os.path.abspath(DEFAULT_ROOT)
