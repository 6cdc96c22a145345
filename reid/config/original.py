"""Configs of the original ACL-DGReID code (fast-reid yacs files) read into this project's config keys.

`overrides_from_original(path)` -> (nested dict of our keys, [original keys not read]). It reads the keys that
build the network and say how it is evaluated (ORIGINAL_KEYS), each with the original's default, since a
fast-reid config lists only what it changes from its defaults (`_BASE_` files included). A value this project
cannot honour (another backbone, SE or non-local blocks, an embedding layer, a margin classifier ...) is a
ConfigError naming the key. The training recipe (losses, solver, sampler, augmentation) is not read: the
original's ACL recipe is this project's default (docs/method.md#recipe).
"""
import ast
import os

import yaml

from reid.config.config import ConfigError, yaml_chain

# the original's dataset names (fast-reid's registry) -> ours
DATASET_NAMES = {"cuhkSYSU": "CUHKSYSU", "Market1501": "Market1501", "MSMT17": "MSMT17", "CUHK03": "CUHK03"}


def _choice(table, why):
    """A translation allowing only the values in `table` (original value -> ours)."""
    def translate(value):
        for original, ours in table.items():
            if value == original and type(value) is type(original):
                return ours
        raise ValueError("%r is not supported (%s); supported: %s" % (value, why, ", ".join(map(repr, table))))
    return translate


def _number(kind):
    def translate(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("%r is not a number" % (value,))
        return kind(value)
    return translate


def _flag(value):
    if not isinstance(value, bool):
        raise ValueError("%r is not True or False" % (value,))
    return value


def _numbers(count):
    def translate(value):
        if not isinstance(value, (list, tuple)) or len(value) != count:
            raise ValueError("%r is not a list of %d numbers" % (value, count))
        return [round(_number(float)(v), 6) for v in value]   # 0.224 * 255 -> 57.12
    return translate


def _sizes(value):
    return [int(v) for v in _numbers(2)(value)]


def _datasets(value):
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not names:
        raise ValueError("%r is not a list of dataset names" % (value,))
    unknown = [n for n in names if n not in DATASET_NAMES]
    if unknown:
        raise ValueError("%s %s no loader in acl-reid (it reads %s)" % (
            ", ".join(unknown), "has" if len(unknown) == 1 else "have", ", ".join(DATASET_NAMES)))
    return [DATASET_NAMES[n] for n in names]


def _text(value):
    if not isinstance(value, str):
        raise ValueError("%r is not a string" % (value,))
    return value


_NO = "not built by acl-reid's ACL network"
# original key: (its default in fast-reid's config/defaults.py, our key or None (checked only), translation)
ORIGINAL_KEYS = {
    "MODEL.META_ARCHITECTURE": ("Baseline", "MODEL.META_ARCHITECTURE",
                                _choice({"Baseline": "ACL"}, "the original's ACL model is its 'Baseline'")),
    "MODEL.BACKBONE.NAME": ("build_resnet_backbone", "MODEL.BACKBONE.NAME",
                            _choice({"build_meta_dynamic_router_resnet_backbone": "acl_resnet50_ibn_a"},
                                    "the ACL backbone is the only one the original's ACL model runs")),
    "MODEL.BACKBONE.DEPTH": ("50x", "MODEL.BACKBONE.DEPTH",
                             _choice({"50x": "50x", "101x": "101x"}, "the 18x/34x basic-block ResNets are " + _NO)),
    "MODEL.BACKBONE.LAST_STRIDE": (1, "MODEL.BACKBONE.LAST_STRIDE", _choice({1: 1, 2: 2}, "a ResNet stride")),
    "MODEL.BACKBONE.FEAT_DIM": (2048, "MODEL.BACKBONE.BASE_WIDTH",
                                _choice({2048: 64}, "the original's ACL backbone always gives 2048 channels")),
    "MODEL.BACKBONE.NORM": ("BN", None, _choice({"BN": None}, "other norm layers are " + _NO)),
    "MODEL.BACKBONE.WITH_IBN": (False, "MODEL.BACKBONE.WITH_IBN", _flag),
    "MODEL.BACKBONE.WITH_SE": (False, None, _choice({False: None}, "SE inside the bottlenecks is " + _NO)),
    "MODEL.BACKBONE.WITH_NL": (False, None, _choice({False: None}, "non-local blocks are " + _NO)),
    "MODEL.BACKBONE.PRETRAIN": (False, "MODEL.BACKBONE.PRETRAIN", _flag),
    "MODEL.BACKBONE.PRETRAIN_PATH": ("", "MODEL.BACKBONE.PRETRAIN_PATH", _text),
    "MODEL.HEADS.NAME": ("EmbeddingHead", None,
                         _choice({"MetaEmbeddingHead": None}, "the original's ACL model runs MetaEmbeddingHead")),
    "MODEL.HEADS.NORM": ("BN", None, _choice({"BN": None}, "other norm layers are " + _NO)),
    "MODEL.HEADS.EMBEDDING_DIM": (0, None, _choice({0: None}, "an embedding layer after pooling is " + _NO)),
    "MODEL.HEADS.WITH_BNNECK": (False, None, _choice({True: None}, "acl-reid's head always has the BNNeck")),
    "MODEL.HEADS.NECK_FEAT": ("before", "MODEL.HEADS.NECK_FEAT",
                              _choice({"before": "before", "after": "after"}, "before or after the BNNeck")),
    "MODEL.HEADS.POOL_LAYER": ("GlobalAvgPool", "MODEL.HEADS.POOL_LAYER",
                               _choice({"GeneralizedMeanPooling": "gem", "GlobalAvgPool": "avg",
                                        "FastGlobalAvgPool": "avg"}, "GeM with p = 3, or average pooling")),
    "MODEL.HEADS.CLS_LAYER": ("Linear", None, _choice({"Linear": None}, "margin classifiers are " + _NO)),
    "MODEL.HEADS.SCALE": (1, "MODEL.HEADS.SCALE", _number(float)),
    "MODEL.PIXEL_MEAN": ([0.485 * 255, 0.456 * 255, 0.406 * 255], "MODEL.PIXEL_MEAN", _numbers(3)),
    "MODEL.PIXEL_STD": ([0.229 * 255, 0.224 * 255, 0.225 * 255], "MODEL.PIXEL_STD", _numbers(3)),
    "MODEL.WEIGHTS": ("", "MODEL.WEIGHTS", _text),
    "INPUT.SIZE_TRAIN": ([256, 128], "INPUT.SIZE_TRAIN", _sizes),
    "INPUT.SIZE_TEST": ([256, 128], "INPUT.SIZE_TEST", _sizes),
    "DATASETS.NAMES": (("Market1501",), "DATASETS.NAMES", _datasets),
    "DATASETS.TESTS": (("Market1501",), "DATASETS.TESTS", _datasets),
    "DATASETS.COMBINEALL": (False, "DATASETS.COMBINEALL", _flag),
    "TEST.IMS_PER_BATCH": (64, "TEST.IMS_PER_BATCH", _number(int)),
    "TEST.METRIC": ("cosine", "TEST.METRIC", _choice({"cosine": "cosine", "euclidean": "euclidean"}, "a distance")),
    "TEST.FLIP.ENABLED": (False, "TEST.FLIP", _flag),
    "TEST.RERANK.ENABLED": (False, "TEST.RERANK.ENABLED", _flag),
    "TEST.RERANK.K1": (20, "TEST.RERANK.K1", _number(int)),
    "TEST.RERANK.K2": (6, "TEST.RERANK.K2", _number(int)),
    "TEST.RERANK.LAMBDA": (0.3, "TEST.RERANK.LAMBDA", _number(float)),
    "TEST.AQE.ENABLED": (False, "TEST.AQE.ENABLED", _flag),
    "TEST.AQE.QE_TIME": (1, "TEST.AQE.QE_TIME", _number(int)),
    "TEST.AQE.QE_K": (5, "TEST.AQE.QE_K", _number(int)),
    "TEST.AQE.ALPHA": (3.0, "TEST.AQE.ALPHA", _number(float)),
}
# identities per source domain: set by the original from the data when 0 (its default)
NUM_CLASSES_KEYS = ("MODEL.HEADS.NUM_CLASSES1", "MODEL.HEADS.NUM_CLASSES2", "MODEL.HEADS.NUM_CLASSES3")


def _decode(value):
    """A yacs value as fast-reid reads it: strings that spell a Python literal become that literal."""
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _read(path):
    """The original config file as a flat {KEY.SUB: value} dict, its _BASE_ files merged under it."""
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, prefix + str(key) + ".")
            else:
                flat[prefix + str(key)] = _decode(value)
    for _, data in yaml_chain(path, "original config"):
        walk(data, "")
    return flat


def _set(tree, key, value):
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def overrides_from_original(path):
    """(our config overrides as a nested dict, sorted original keys that were not read) from an original
    ACL-DGReID config file; a value acl-reid cannot honour is a ConfigError naming the key."""
    given = _read(path)
    tree = {}
    for key, (default, ours, translate) in ORIGINAL_KEYS.items():
        value = given.get(key, default)
        try:
            translated = translate(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError("%s: %s %s" % (path, key, exc)) from None
        if ours is not None:
            _set(tree, ours, translated)
    counts = [given.get(k, 0) for k in NUM_CLASSES_KEYS]
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts) or (0 in counts and any(counts)):
        raise ConfigError("%s: %s must be three identity counts (or all 0: taken from the data), got %s"
                          % (path, "/".join(NUM_CLASSES_KEYS), counts))
    if all(counts):
        _set(tree, "MODEL.HEADS.NUM_CLASSES", counts)
    skipped = sorted(k for k in given if k not in ORIGINAL_KEYS and k not in NUM_CLASSES_KEYS)
    return tree, skipped


def write_config_from_original(path, output):
    """Write our config file `output` from the original config `path`; returns (overrides, skipped keys)."""
    tree, skipped = overrides_from_original(path)
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise ConfigError("cannot write %s: directory %s does not exist; create it first" % (output, directory))
    header = ("# acl-reid config read from the original ACL-DGReID config %s by tools/convert.py --from-original:\n"
              "# the keys that build and evaluate the network; the training recipe is acl-reid's default\n"
              "# (docs/model.md, 'Models trained with the original code')\n" % os.path.basename(path))
    with open(output + ".tmp", "w") as fh:
        fh.write(header + yaml.safe_dump(tree, default_flow_style=None, sort_keys=True))
    os.replace(output + ".tmp", output)
    return tree, skipped
