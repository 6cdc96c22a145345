"""Name -> constructor registries (fast-reid / timm style)."""
from compat.errors import UserError


class Registry(object):
    def __init__(self, kind, config_key):
        self.kind, self.config_key, self._entries = kind, config_key, {}

    def register(self, name=None):
        def deco(fn):
            key = name or fn.__name__
            if key in self._entries:
                raise ValueError("%s %r registered twice" % (self.kind, key))
            self._entries[key] = fn
            return fn
        return deco

    def get(self, name):
        if name not in self._entries:
            raise UserError("unknown %s %r (%s); available: %s" % (self.kind, name, self.config_key,
                                                                  ", ".join(sorted(self._entries))))
        return self._entries[name]

    def names(self):
        return sorted(self._entries)

    def __contains__(self, name):
        return name in self._entries


META_ARCH_REGISTRY = Registry("meta-architecture", "MODEL.META_ARCHITECTURE")
BACKBONE_REGISTRY = Registry("backbone", "MODEL.BACKBONE.NAME")
HEAD_REGISTRY = Registry("head", "MODEL.HEADS.NAME")
