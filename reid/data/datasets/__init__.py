"""Dataset loaders (file lists only; images are read by the data pipeline) and their registry.

``build_dataset(name, root=None, cfg=None, **kwargs)`` returns an object with ``.train``, ``.query`` and
``.gallery`` lists of ``(img_path, pid, camid, domain)`` records; see ``bases.py`` for the id conventions and
``reid.data.common`` for relabelling several sources into one training set.

Registered names: Market1501, MSMT17, CUHK03 (CUHK03-NP labeled/detected), CUHKSYSU, SynthA..SynthD; and the
names of the config's own datasets, DATASETS.CUSTOM (``custom.py``).
"""
from reid.errors import UserError
from reid.data.common import (MultiDomainTrainSet, combine_train_sets, read_image, verify_images)  # noqa: F401
from reid.data.datasets.registry import DATASET_REGISTRY, resolve_root
from reid.data.datasets.bases import ReidDataset, parse_market_dir  # noqa: F401
from reid.data.datasets.market1501 import Market1501  # noqa: F401
from reid.data.datasets.msmt17 import MSMT17  # noqa: F401
from reid.data.datasets.cuhk03 import CUHK03  # noqa: F401
from reid.data.datasets.cuhksysu import CUHKSYSU  # noqa: F401
from reid.data.datasets.synthetic import SYNTHETIC_DOMAINS, SynthA, SynthB, SynthC, SynthD  # noqa: F401
from reid.data.datasets.custom import (CustomCsv, CustomFolder, custom_entries, read_csv_list,  # noqa: F401
                                      resolve_custom_path)


def dataset_options(name, cfg):
    """Loader options a config implies for dataset `name`."""
    opts = {}
    if cfg is None:
        return opts
    d = cfg.DATASETS
    if name == "CUHK03":
        opts["labeled"] = bool(d.CUHK03_LABELED)
        opts["split"] = d.CUHK03_SPLIT
    if name in SYNTHETIC_DOMAINS:
        opts["seed"] = int(d.SYNTHETIC.SEED)
        opts["num_ids"] = int(d.SYNTHETIC.NUM_IDS)
    return opts


def build_dataset(name, root=None, cfg=None, **kwargs):
    """Instantiate dataset `name` under the resolved root (explicit > REID_DATA > cfg > 'datasets'): one of the
    config's own (DATASETS.CUSTOM.<name>, its relative path under that root) or a registered one. Options come from
    `cfg` (CUHK03_LABELED, CUHK03_SPLIT, SYNTHETIC.*) and are overridden by `kwargs` (``combineall``, ``domain``,
    ``labeled``, ...)."""
    custom = custom_entries(cfg)
    if name in custom:
        cls, path = custom[name]
        return cls(resolve_custom_path(path, resolve_root(root, cfg)), name=name, **kwargs)
    if name not in DATASET_REGISTRY:
        raise UserError("unknown dataset %r (DATASETS.NAMES / DATASETS.TESTS); built-in: %s; yours (DATASETS.CUSTOM): "
                        "%s" % (name, ", ".join(DATASET_REGISTRY.names()), ", ".join(sorted(custom)) or "none"))
    cls = DATASET_REGISTRY.get(name)
    opts = dataset_options(name, cfg)
    opts.update(kwargs)
    return cls(resolve_root(root, cfg), **opts)


def empty_split_error(ds, split, message):
    """UserError `message` with ``{where}`` replaced by where the dataset's `split` images would come from."""
    where = ds.where(split)
    return UserError(message.format(where=" (%s)" % where if where else ""))


def build_train_set(cfg, root=None, names=None, verify=True):
    """The relabelled multi-domain training set of `names` (default ``cfg.DATASETS.NAMES``), with
    ``COMBINEALL`` applied and bad images handled per ``DATASETS.ON_BAD_IMAGE`` before any loader starts."""
    names = list(names if names is not None else cfg.DATASETS.NAMES)
    sources, num_bad = [], 0
    for d, n in enumerate(names):
        ds = build_dataset(n, root, cfg, combineall=bool(cfg.DATASETS.COMBINEALL), domain=d)
        train = ds.train
        if not train:
            raise empty_split_error(ds, "train", "source dataset %s has no training images{where}; check its folder "
                                    "or remove it from DATASETS.NAMES" % n)
        if verify:  # before relabelling, so an identity whose images are all bad gets no class
            train, bad = verify_images(train, cfg.DATASETS.ON_BAD_IMAGE, listed_in=ds.listed_in)
            num_bad += bad
        sources.append(train)
    train_set = MultiDomainTrainSet(sources, names)
    train_set.num_bad = num_bad
    return train_set


def build_test_set(name, cfg=None, root=None, verify=True):
    """(query, gallery) records of test dataset `name`, bad images handled per ``DATASETS.ON_BAD_IMAGE``."""
    ds = build_dataset(name, root, cfg)
    query, gallery = ds.query, ds.gallery
    for split, records in (("query", query), ("gallery", gallery)):
        if not records:
            raise empty_split_error(ds, split, "%s has no %s images{where}, so it cannot be a test set; remove it "
                                    "from DATASETS.TESTS" % (name, split))
    if verify:
        on_bad = cfg.DATASETS.ON_BAD_IMAGE if cfg is not None else "stop"
        query, _ = verify_images(query, on_bad, listed_in=ds.listed_in)
        gallery, _ = verify_images(gallery, on_bad, listed_in=ds.listed_in)
    return query, gallery


__all__ = ["DATASET_REGISTRY", "build_dataset", "build_train_set", "build_test_set", "resolve_root",
           "dataset_options", "ReidDataset", "MultiDomainTrainSet", "combine_train_sets", "read_image",
           "verify_images", "Market1501", "MSMT17", "CUHK03", "CUHKSYSU", "SynthA", "SynthB", "SynthC", "SynthD",
           "SYNTHETIC_DOMAINS", "CustomFolder", "CustomCsv", "custom_entries", "read_csv_list"]
