"""Name -> dataset class registry, and where the datasets live (root resolution)."""
import os

from compat.errors import UserError

DEFAULT_ROOT = "datasets"


class Registry(object):
    """A dict of named classes filled by the ``register`` decorator."""

    def __init__(self, kind):
        self.kind = kind
        self._items = {}

    def register(self, obj=None, name=None):
        def add(o):
            key = name or o.__name__
            if key in self._items and self._items[key] is not o:
                raise KeyError("%s %r is registered twice" % (self.kind, key))
            self._items[key] = o
            return o
        return add(obj) if obj is not None else add

    def get(self, name):
        if name not in self._items:
            raise UserError("unknown %s %r; known: %s" % (self.kind, name, ", ".join(sorted(self._items))))
        return self._items[name]

    def __contains__(self, name):
        return name in self._items

    def names(self):
        return sorted(self._items)


DATASET_REGISTRY = Registry("dataset")


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
