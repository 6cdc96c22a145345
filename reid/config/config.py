"""yacs configuration: defaults -> config file (with _BASE_) -> command-line KEY VALUE pairs -> frozen."""
import os
import re

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


CUSTOM_PREFIX = "DATASETS.CUSTOM."
_CUSTOM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def add_custom_dataset(cfg, name, where):
    """Give ``cfg`` an entry DATASETS.CUSTOM.<name> with the keys of every entry (defaults.CUSTOM_DATASET), unless it
    has one: yacs only merges into keys that exist, and a user's dataset names are not known in advance."""
    from reid.config.defaults import CUSTOM_DATASET
    if not isinstance(name, str) or not _CUSTOM_NAME.match(name):
        raise ConfigError("%s: DATASETS.CUSTOM entry %r is not a usable dataset name; use letters, digits, _ and -, "
                          "starting with a letter" % (where, name))
    if name not in cfg.DATASETS.CUSTOM:
        cfg.DATASETS.CUSTOM[name] = CUSTOM_DATASET.clone()


def _add_custom_entries_of_file(cfg, data, path):
    datasets = data.get("DATASETS")
    custom = datasets.get("CUSTOM") if isinstance(datasets, dict) else None
    if custom is None:
        return
    if not isinstance(custom, dict):
        raise ConfigError("%s: DATASETS.CUSTOM must map dataset names to {ROOT: folder} or {CSV: file}, got %r"
                          % (path, custom))
    for name, entry in custom.items():
        if not isinstance(entry, dict):
            raise ConfigError("%s: DATASETS.CUSTOM.%s must be {ROOT: folder} or {CSV: file}, got %r"
                              % (path, name, entry))
        add_custom_dataset(cfg, name, path)


def _add_custom_entries_of_opts(cfg, opts):
    for key in opts[0::2]:
        if isinstance(key, str) and key.startswith(CUSTOM_PREFIX) and key.count(".") == 3:
            add_custom_dataset(cfg, key.split(".")[2], "command line")


def check_custom_datasets(cfg):
    """ConfigError unless every DATASETS.CUSTOM entry names exactly one of ROOT (a Market-1501-style folder) or CSV."""
    for name, entry in cfg.DATASETS.CUSTOM.items():
        given = [k for k in ("ROOT", "CSV") if str(entry.get(k, "")).strip()]
        if len(given) != 1:
            raise ConfigError("DATASETS.CUSTOM.%s needs exactly one of ROOT (a folder in Market-1501 layout) or CSV (a "
                              "path,pid,camid[,split] list), got %s" % (name, " and ".join(given) or "neither"))


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


def shipped_configs():
    """The configs/ folder that comes with this code: inside the installed package (reid/configs), or beside
    reid/ in a checkout (an editable install is one); None if there is neither."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in (os.path.join(package, "configs"), os.path.join(os.path.dirname(package), "configs")):
        if os.path.isdir(folder):
            return folder
    return None


def find_config_file(path):
    """`path` when it exists; else, if it names one of the shipped configs relative to configs/
    (configs/synthetic/acl.yml or synthetic/acl.yml), that one: the commands of an installed package take
    the configs of the README from any folder. A missing path is returned as it is (loading reports it)."""
    if os.path.isfile(os.path.expanduser(path)) or os.path.isabs(os.path.expanduser(path)):
        return path
    rel = os.path.normpath(path).replace(os.sep, "/")
    rel = rel[len("configs/"):] if rel.startswith("configs/") else rel
    folder = shipped_configs()
    if folder and not rel.startswith("../") and os.path.isfile(os.path.join(folder, *rel.split("/"))):
        return os.path.join(folder, *rel.split("/"))
    return path


def _merge_file(cfg, path):
    for name, data in yaml_chain(path):
        _add_custom_entries_of_file(cfg, data, name)
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
        _merge_file(cfg, find_config_file(config_file))
    opts = list(opts or [])
    if len(opts) % 2:
        raise ConfigError("command-line overrides must be KEY VALUE pairs; got an odd count: %s" % " ".join(opts))
    _add_custom_entries_of_opts(cfg, opts)
    try:
        cfg.merge_from_list(opts)
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        raise ConfigError("command line: %s" % _explain(exc)) from None
    check_supported_values(cfg)
    check_custom_datasets(cfg)
    cfg.freeze()
    return cfg
