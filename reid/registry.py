"""Name -> constructor registries (fast-reid / timm style), shared by models and datasets."""
from reid.errors import UserError


class Registry(object):
    """Named constructors filled by ``@REG.register()`` / ``@REG.register("name")`` or ``REG.register(cls)``.
    ``config_key`` names the config entry that selects from it, for the error message."""

    def __init__(self, kind, config_key=None):
        self.kind, self.config_key, self._entries = kind, config_key, {}

    def register(self, name_or_obj=None):
        def add(obj, key=None):
            key = key or obj.__name__
            if self._entries.get(key, obj) is not obj:
                raise ValueError("%s %r registered twice" % (self.kind, key))
            self._entries[key] = obj
            return obj
        if name_or_obj is not None and not isinstance(name_or_obj, str):
            return add(name_or_obj)
        return lambda obj: add(obj, name_or_obj)

    def get(self, name):
        if name not in self._entries:
            where = " (%s)" % self.config_key if self.config_key else ""
            raise UserError("unknown %s %r%s; known: %s" % (self.kind, name, where, ", ".join(self.names())))
        return self._entries[name]

    def names(self):
        return sorted(self._entries)

    def __contains__(self, name):
        return name in self._entries
