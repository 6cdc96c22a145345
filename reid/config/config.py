"""yacs configuration: defaults -> config file (with _BASE_) -> command-line KEY VALUE pairs -> frozen."""
import os

import yaml
from yacs.config import CfgNode

from compat.errors import UserError


class ConfigError(UserError):
    """A config file or override that does not fit the schema."""


def get_cfg():
    """A mutable copy of the defaults (the full-size ACL setup)."""
    from reid.config.defaults import _C
    return _C.clone()


def _merge_file(cfg, path, seen=()):
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise ConfigError("config file %s does not exist" % path)
    if path in seen:
        raise ConfigError("config file %s includes itself through _BASE_" % path)
    with open(path) as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("config file %s is not valid YAML: %s" % (path, str(exc).splitlines()[0])) from None
    base = data.pop("_BASE_", None)
    if base:
        _merge_file(cfg, os.path.join(os.path.dirname(path), base), seen + (path,))
    try:
        cfg.merge_from_other_cfg(CfgNode(data))
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError("%s: %s" % (path, _explain(exc))) from None


def _explain(exc):
    msg = str(exc.args[0]) if exc.args else str(exc)
    if "Non-existent" in msg and ":" in msg:
        key = msg.split(":", 1)[1].strip()
        return "unknown config key %s (check the spelling; 'python train.py --help-config' lists every key)" % key
    return msg


def load_cfg(config_file=None, opts=()):
    """Defaults, then `config_file`, then `opts` ([KEY, VALUE, ...]); returns the frozen config."""
    cfg = get_cfg()
    if config_file:
        _merge_file(cfg, config_file)
    opts = list(opts or [])
    if len(opts) % 2:
        raise ConfigError("command-line overrides must be KEY VALUE pairs; got an odd count: %s" % " ".join(opts))
    try:
        cfg.merge_from_list(opts)
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        raise ConfigError("command line: %s" % _explain(exc)) from None
    cfg.freeze()
    return cfg
