"""A gallery index: the features of every image under a folder, with what is needed to search, update and trust
them. Written by tools/index.py, read by tools/search.py.

The file is an uncompressed `.npz` (a zip of `.npy` arrays) that numpy loads with `allow_pickle=False`, so
reading it runs no code from the file:

  features   (N, D) float32, or float16 on request; L2-normalised rows
  pids       (N,) int64   person id from the file name (Market-1501 style) or a CSV; UNKNOWN where neither says
  camids     (N,) int64   0-based camera id, likewise
  sizes      (N,) int64   file size in bytes      } what an update compares to tell a changed image
  mtimes     (N,) int64   modification time, ns   }
  paths      JSON list of the image paths, relative to the gallery folder ("/" separated)
  meta       JSON object: format and version, the folder, the model that made the features (its identity
             hashes, engine, feature size, sidecar), the labels' source, the images skipped and why

Every array is checked against the others and against `meta` when the file is loaded; the zip's CRC-32 of each
array is checked as it is read, so a damaged or edited file is an error, never wrong results.
"""
import json
import os
import zipfile

import numpy as np

from reid.errors import UserError

INDEX_FORMAT = "acl-reid gallery index"
INDEX_VERSION = 1
UNKNOWN = -(2 ** 62)      # pid / camid not known (-1 is Market-1501's junk pid, a real label)
DTYPES = ("float32", "float16")
ARRAYS = ("features", "pids", "camids", "sizes", "mtimes", "paths", "meta")


class GalleryIndex:
    """The content of an index file (see the module docstring); `root` is the gallery folder (absolute)."""

    def __init__(self, root, paths, features, pids, camids, sizes, mtimes, meta):
        self.root, self.paths = root, list(paths)
        self.features = features
        self.pids, self.camids = np.asarray(pids, np.int64), np.asarray(camids, np.int64)
        self.sizes, self.mtimes = np.asarray(sizes, np.int64), np.asarray(mtimes, np.int64)
        self.meta = meta

    def __len__(self):
        return len(self.paths)

    @property
    def model(self):
        return self.meta["model"]

    def image_path(self, i, root=None):
        return os.path.join(root or self.root, *self.paths[i].split("/"))

    def record(self, i, root=None):
        """(path, pid, camid) of image i, ids None where unknown (a record reid.evaluation.visualize draws)."""
        return self.image_path(i, root), _known(self.pids[i]), _known(self.camids[i])


def _known(value):
    return None if int(value) == UNKNOWN else int(value)


# ------------------------------------------------------------------------------------------------ labels
def ids_from_name(rel_path):
    """(pid, camid) from a Market-1501-style file name (PID_cCAM...), else (UNKNOWN, UNKNOWN)."""
    from reid.data.datasets.bases import market_ids
    ids = market_ids(os.path.basename(rel_path))
    return ids if ids is not None else (UNKNOWN, UNKNOWN)


def read_labels(path, folder=None):
    """{image: (pid, camid)} from a CSV in the custom datasets' format (header `path,pid,camid[,split]`, paths
    relative to the CSV's folder or absolute; docs/datasets.md#a-csv-list); the split column, where there is
    one, is not used. Images are keyed by their path relative to `folder` ("/" separated), or by their
    absolute path without one."""
    from reid.data.datasets.custom import read_csv_list
    if not os.path.isfile(path):
        raise UserError("labels file %s does not exist; give a CSV whose header is path,pid,camid" % path)
    root = os.path.abspath(folder) if folder else None
    labels = {}
    for line, image, pid, camid, _ in read_csv_list(path):
        key = image
        if root is not None:
            key = os.path.relpath(image, root)
            if key == os.curdir or key.split(os.sep)[0] == os.pardir:
                raise UserError("%s line %d: %s is not under %s; list the images of that folder (paths relative "
                                "to the CSV's folder)" % (path, line, image, folder))
            key = key.replace(os.sep, "/")
        labels[key] = (pid, camid)
    return labels


def _clean_rel(rel, where):
    rel = rel.replace("\\", "/")
    while rel.startswith("./"):
        rel = rel[2:]
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise UserError("%s: path %r must be relative to the image folder, without '..'" % (where, rel))
    return rel


def labels_for(paths, labels=None):
    """(pids, camids) arrays for relative `paths`: from `labels` ({path: (pid, camid)}) where given (paths it
    does not list are UNKNOWN), else from the file names."""
    if labels is None:
        ids = [ids_from_name(p) for p in paths]
    else:
        ids = [labels.get(p, (UNKNOWN, UNKNOWN)) for p in paths]
    ids = np.asarray(ids, np.int64).reshape(-1, 2)
    return ids[:, 0], ids[:, 1]


# ------------------------------------------------------------------------------------------------ update
def _stat(path):
    """(size, mtime_ns), or None when the file is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return int(st.st_size), int(st.st_mtime_ns)


def same_model(a, b):
    """Whether two model descriptions (FeatureExtractor.describe()) make the same features."""
    keys = ("kind", "weights_sha256", "model_sha256", "config_sha256", "normalized")
    return all(a.get(k) == b.get(k) for k in keys) and (
        a.get("feature_size") is None or b.get("feature_size") is None or a["feature_size"] == b["feature_size"])


def describe_model(desc):
    """One phrase naming a model description, for errors."""
    if desc.get("kind") == "exported":
        what = "model %s (sha256 %s" % (desc.get("model"), str(desc.get("model_sha256"))[:12])
    else:
        what = "weights %s (sha256 %s" % (desc.get("weights"), str(desc.get("weights_sha256"))[:12])
    return "%s, config hash %s, feature size %s)" % (what, str(desc.get("config_sha256"))[:12],
                                                      desc.get("feature_size"))


def check_same_model(index_path, index_model, model, fix):
    if not same_model(index_model, model):
        raise UserError("%s was made by %s, not by %s; %s" % (index_path, describe_model(index_model),
                                                                 describe_model(model), fix))


def scan_gallery(root, strict=False):
    """(image paths relative to `root` ("/" separated), other files) of a gallery folder; no images, or with
    `strict` any file that is not an image, is an error."""
    from reid.data.common import IMAGE_EXTENSIONS
    from reid.deploy.extractor import list_image_files
    root = os.path.abspath(root)
    images, others = list_image_files(root)
    if strict and others:
        raise UserError("%s holds %d file(s) that are not images (%s%s); remove them or leave out --strict to skip "
                        "them" % (root, len(others), ", ".join(others[:3]), " ..." if len(others) > 3 else ""))
    if not images:
        raise UserError("no images (%s) under %s%s; give the folder that holds the gallery images" % (
            "/".join(IMAGE_EXTENSIONS), root, " (only %d other file(s))" % len(others) if others else ""))
    return [p.replace(os.sep, "/") for p in images], others


class UpdatePlan:
    """What an index update does (plan_update): `paths` (every image under `root`, sorted), `stats`
    {path: (size, mtime_ns)} of those still there, `kept` {path: row of the previous index} whose features stay,
    `todo` (paths to extract, sorted), `problems` [(path, reason)] so far, `others` (non-image files), `model`
    (the extractor's description), `previous` and `reusable`."""

    def __init__(self, root, paths, others, stats, kept, todo, problems, model, previous, reusable):
        self.root, self.paths, self.others, self.stats = root, paths, others, stats
        self.kept, self.todo, self.problems, self.model, self.previous = kept, todo, problems, model, previous
        self.reusable = reusable     # the previous index's paths whose features could be kept

    def final_paths(self, extracted):
        """The paths of the updated index, sorted: kept ones and those extracted."""
        return [rel for rel in self.paths if rel in self.kept or rel in extracted]

    def report(self, extracted, problems):
        previous = self.previous
        removed = len(previous.paths) - sum(1 for p in previous.paths if p in self.stats) if previous is not None else 0
        return {"images": len(self.final_paths(extracted)), "extracted": len(extracted), "reused": len(self.kept),
                "removed": removed, "skipped": list(problems), "non_images": self.others,
                "changed": sum(1 for r in self.todo if r in self.reusable)}


def plan_update(extractor, root, previous=None, strict=False, reuse=True, index_path="the index", scan=None):
    """The UpdatePlan of indexing the images under `root` with `extractor`, given the `previous` index (anything
    with `paths`, `sizes`, `mtimes` and `model`), or None. Only new and changed images (another size or
    modification time) are to be extracted; `reuse` False extracts every image (the previous features are of
    another dtype). A previous index of another model is an error."""
    if not extractor.normalize:
        raise UserError("an index holds L2-normalised features: build it with a FeatureExtractor(normalize=True)")
    root = os.path.abspath(root)
    rel_paths, others = scan or scan_gallery(root, strict)
    model = extractor.describe()
    rows = {}
    if previous is not None:
        check_same_model(index_path, previous.model, model, "add --rebuild to index the folder afresh with this "
                         "model (or use the model the index was made with)")
        if reuse:
            rows = {p: i for i, p in enumerate(previous.paths)}
    stats, problems = {}, []
    for rel in rel_paths:
        st = _stat(os.path.join(root, rel))
        if st is None:
            if strict:
                raise UserError("%s disappeared while indexing; run again once the folder is stable" % rel)
            problems.append((rel, "disappeared while indexing"))
        else:
            stats[rel] = st
    kept, todo = {}, []
    for rel in rel_paths:
        if rel not in stats:
            continue
        i = rows.get(rel)
        if i is not None and (int(previous.sizes[i]), int(previous.mtimes[i])) == stats[rel]:
            kept[rel] = i
        else:
            todo.append(rel)
    return UpdatePlan(root, rel_paths, others, stats, kept, todo, problems, model, previous, set(rows))


def extract_planned(extractor, root, paths, strict=False, progress=False):
    """({path: feature}, [(path, reason)]) of the images `paths` (relative to `root`) that could be read;
    `strict`: an image that cannot be read is an error instead."""
    features, read, bad = extractor.extract_files([os.path.join(root, rel) for rel in paths],
                                                  on_bad="stop" if strict else "skip", progress=progress)
    extracted = {paths[j]: features[k] for k, j in enumerate(read)}
    return extracted, [(os.path.relpath(path, root).replace(os.sep, "/"), reason) for path, reason in bad]


def assemble_index(plan, extracted, problems, labels=None, dtype="float32"):
    """(GalleryIndex, report dict) of a plan once its images are extracted: `extracted` {path: feature},
    `problems` the images that could not be read (after the plan's own)."""
    root, previous = plan.root, plan.previous
    problems = list(plan.problems) + list(problems)
    final = plan.final_paths(extracted)
    if not final:
        raise UserError("none of the %d images under %s could be read (first: %s: %s); check the files"
                        % (len(plan.paths), root, problems[0][0], problems[0][1]))
    size = int(len(next(iter(extracted.values())))) if extracted else int(previous.features.shape[1])
    features = np.empty((len(final), size), dtype)
    for row, rel in enumerate(final):
        features[row] = previous.features[plan.kept[rel]] if rel in plan.kept else extracted[rel]
    pids, camids = labels_for(final, labels)
    model = dict(plan.model, feature_size=size)
    meta = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "root": root, "count": len(final),
            "feature_size": size, "dtype": dtype, "model": model,
            "labels": "csv" if labels is not None else "file names",
            "skipped": [[rel, reason] for rel, reason in problems], "non_images": len(plan.others)}
    index = GalleryIndex(root, final, features, pids, camids, [plan.stats[r][0] for r in final],
                         [plan.stats[r][1] for r in final], meta)
    return index, plan.report(extracted, problems)


def build_index(extractor, root, previous=None, labels=None, strict=False, dtype="float32", progress=False,
                index_path="the index", scan=None):
    """(GalleryIndex of the images under `root`, report dict). With `previous` (the index of an earlier run)
    only new and changed images are extracted (changed: another size or modification time), removed ones are
    dropped, and the rest keep their features. `labels`: {relative path: (pid, camid)} instead of the names.
    `strict`: a file that is not an image, or an image that cannot be read, is an error instead of a counted
    skip. `scan`: scan_gallery(root, strict) when the caller has it already. The three steps, plan_update,
    extract_planned and assemble_index, are also run apart: by the ranks of a sharded extraction
    (reid.deploy.sharded) and for a Milvus collection (reid.deploy.milvus)."""
    if dtype not in DTYPES:
        raise UserError("features are stored as %s, not %r" % (" or ".join(DTYPES), dtype))
    reuse = previous is not None and str(previous.features.dtype) == dtype
    plan = plan_update(extractor, root, previous, strict, reuse, index_path, scan)
    extracted, problems = extract_planned(extractor, plan.root, plan.todo, strict, progress)
    return assemble_index(plan, extracted, problems, labels, dtype)


# ------------------------------------------------------------------------------------------------ file I/O
def save_index(index, path):
    """Write `index` to `path` atomically: a temporary file beside it, flushed to disk, then renamed over
    `path`. An interrupted write leaves the previous file as it was (and removes its temporary file unless the
    process is killed outright)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    arrays = {"features": np.ascontiguousarray(index.features), "pids": index.pids, "camids": index.camids,
              "sizes": index.sizes, "mtimes": index.mtimes, "paths": np.array(json.dumps(index.paths)),
              "meta": np.array(json.dumps(index.meta, sort_keys=True))}
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _damaged(path, why):
    return UserError("%s is not an acl-reid gallery index or is damaged (%s); build it again with tools/index.py "
                     "(--rebuild)" % (path, why))


def load_index(path):
    """The GalleryIndex in `path`, every array checked (see the module docstring); executes nothing."""
    if not os.path.isfile(path):
        raise UserError("index file %s does not exist; write it with tools/index.py --gallery DIR --output %s"
                        % (path, path))
    with open(path, "rb") as fh:
        if fh.read(4) != b"PK\x03\x04":        # what np.load would read as an .npy array or as a pickle
            raise _damaged(path, "not an .npz file, a zip of numpy arrays")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ARRAYS if k not in npz.files]
            if missing:
                raise _damaged(path, "no %s array" % ", ".join(missing))
            data = {k: npz[k] for k in ARRAYS}
    except UserError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, RuntimeError) as exc:
        raise _damaged(path, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
    try:
        meta = json.loads(str(data["meta"][()]))
        paths = json.loads(str(data["paths"][()]))
    except (ValueError, TypeError, IndexError) as exc:
        raise _damaged(path, "its meta or paths are not JSON: %s" % exc) from None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        raise _damaged(path, "not written by tools/index.py")
    if meta.get("version") != INDEX_VERSION:
        raise _damaged(path, "index version %r, this code reads version %d" % (meta.get("version"), INDEX_VERSION))
    features = data["features"]
    n = len(paths) if isinstance(paths, list) else -1
    problems = []
    if n < 0 or not all(isinstance(p, str) for p in paths):
        problems.append("paths is not a list of strings")
    if features.ndim != 2 or str(features.dtype) not in DTYPES:
        problems.append("features are %s %s, not (N, D) %s" % (features.dtype, features.shape, " or ".join(DTYPES)))
    elif features.shape != (n, meta.get("feature_size")) or meta.get("count") != n:
        problems.append("%d paths, features %s, meta says %s x %s" % (n, features.shape, meta.get("count"),
                                                                   meta.get("feature_size")))
    for key in ("pids", "camids", "sizes", "mtimes"):
        if data[key].shape != (n,) or data[key].dtype != np.int64:
            problems.append("%s is %s %s, not (%d,) int64" % (key, data[key].dtype, data[key].shape, n))
    if not problems:
        try:
            paths = [_clean_rel(p, "entry %d" % i) for i, p in enumerate(paths)]
        except UserError as exc:
            problems.append(str(exc))
    if not problems and not all(np.isfinite(features[i:i + 65536]).all() for i in range(0, n, 65536)):
        problems.append("features hold NaN or inf")
    if not isinstance(meta.get("model"), dict) or not isinstance(meta.get("root"), str):
        problems.append("meta names no model or folder")
    if problems:
        raise _damaged(path, "; ".join(problems))
    return GalleryIndex(meta["root"], paths, features, data["pids"], data["camids"], data["sizes"], data["mtimes"],
                        meta)
