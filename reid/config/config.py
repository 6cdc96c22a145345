"""yacs configuration: defaults -> config file (with _BASE_) -> command-line KEY VALUE pairs -> frozen."""
import os

import yaml
from yacs.config import CfgNode

from compat.errors import UserError


class ConfigError(UserError):
    """A config file or override that does not fit the schema."""


# Keys with a closed set of values the code implements: anything else would be accepted and silently not
# honoured, so it is rejected when the config is loaded (and again by the Trainer, for configs built in code).
SUPPORTED_VALUES = {
    "MODEL.HEADS.NECK_FEAT": (("after", "before"), "it picks the metric-loss feature, after or before the BNNeck"),
    "DATASETS.CUHK03_SPLIT": ((0,), "CUHK03-NP, the 767/700 protocol, has a single split"),
    "DATALOADER.SAMPLER_TRAIN": (("NaiveIdentitySampler",), "only the original's identity sampler is implemented"),
    "SOLVER.OPT": (("SGD",), "only SGD, the original's optimizer, is implemented"),
}


def check_supported_values(cfg):
    """ConfigError naming the key and its supported values if `cfg` sets a value the code does not implement."""
    for key, (supported, why) in SUPPORTED_VALUES.items():
        node = cfg
        for part in key.split("."):
            node = node[part]
        if isinstance(node, bool) or node not in supported:
            raise ConfigError("%s %r is not supported (%s); use %s" % (
                key, node, why, " or ".join("%s %s" % (key, v) for v in supported)))


def augmentation_off_opts():
    """KEY VALUE overrides that turn every train-time augmentation off: each INPUT section with an ENABLED
    switch, read from the defaults, so a new augmentation is covered without a list to update (tests and
    benchmarks that compare or time steps on fixed images use it)."""
    inputs = get_cfg().INPUT
    opts = []
    for name in sorted(inputs):
        if isinstance(inputs[name], CfgNode) and "ENABLED" in inputs[name]:
            opts += ["INPUT.%s.ENABLED" % name, "False"]
    return opts


def get_cfg():
    """A mutable copy of the defaults (the full-size ACL setup)."""
    from reid.config.defaults import _C
    return _C.clone()


def yaml_chain(path, what="config file", seen=()):
    """[(path, mapping)] of a yacs file and the `_BASE_` files under it, base first (`_BASE_` removed)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise ConfigError("%s %s does not exist" % (what, path))
    if path in seen:
        raise ConfigError("%s %s includes itself through _BASE_" % (what, path))
    with open(path) as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("%s %s is not valid YAML: %s" % (what, path, str(exc).splitlines()[0])) from None
    if not isinstance(data, dict):
        raise ConfigError("%s %s is not a mapping of config keys" % (what, path))
    base = data.pop("_BASE_", None)
    chain = yaml_chain(os.path.join(os.path.dirname(path), base), what, seen + (path,)) if base else []
    return chain + [(path, data)]


def _merge_file(cfg, path):
    for name, data in yaml_chain(path):
        try:
            cfg.merge_from_other_cfg(CfgNode(data))
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError("%s: %s" % (name, _explain(exc))) from None


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
    check_supported_values(cfg)
    cfg.freeze()
    return cfg
