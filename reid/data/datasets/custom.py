"""Your own labelled data, named in the config: ``DATASETS.CUSTOM.<Name>.ROOT`` (a folder in Market-1501 layout and
naming) or ``DATASETS.CUSTOM.<Name>.CSV`` (a list of ``path,pid,camid[,split]`` rows); ``<Name>`` then goes in
``DATASETS.NAMES`` / ``DATASETS.TESTS`` like a built-in name (docs/datasets.md#your-own-data).

The entries are the config's, not the registry's: a name resolves to ``CustomFolder`` or ``CustomCsv`` with the
entry's path, so several of them can be used at once and none is registered globally. Records follow
``bases.py``: training ids namespaced by the dataset's name, query/gallery ids raw.

Folder: ``<ROOT>/{bounding_box_train,query,bounding_box_test}/PID_cCAMsS_FRAME.jpg``, read exactly as Market-1501
(pid -1 junk dropped, pid 0 distractors kept for testing only). A subfolder may be absent when its split is not
used: a dataset used only as a source needs ``bounding_box_train``, one used only as a target the other two.

CSV: a header line naming the columns ``path``, ``pid``, ``camid`` and optionally ``split`` (in any order; other
columns are ignored), then one row per image. Paths are relative to the CSV's folder (or absolute); pid and camid
are integers; pid -1 marks a junk image (dropped, as in Market-1501), every other pid >= 0 is an identity (0
included: a CSV has no distractor convention). ``split`` is ``train``, ``query`` or ``gallery``; without the
column every row is training data (the dataset is then a source only).
"""
import csv
import os

from reid.errors import UserError
from reid.config import check_custom_datasets
from reid.data.datasets.bases import JUNK_PID, ReidDataset, missing_layout_error, parse_market_dir
from reid.data.datasets.market1501 import SUBDIRS, MarketLayoutDataset
from reid.data.datasets.registry import DATASET_REGISTRY

SPLITS = ("train", "query", "gallery")
CSV_COLUMNS = ("path", "pid", "camid")
CSV_HEADER = "path,pid,camid[,split]"


def _entry_hint(name, key):
    return ("set DATASETS.CUSTOM.%s.%s (absolute, or relative to the data root: DATASETS.ROOT or the REID_DATA "
            "environment variable)" % (name, key))


class CustomFolder(MarketLayoutDataset):
    """A user's dataset in Market-1501 layout and naming directly under its folder."""
    layout = "<ROOT>/{bounding_box_train,query,bounding_box_test}/PID_cCAMsS_FRAME.jpg (e.g. 0002_c1s1_000451_03.jpg)"

    def __init__(self, root, name, **kwargs):
        self.name = name
        super(CustomFolder, self).__init__(root, **kwargs)

    def load(self):   # the folder is given, and a split it does not use may be absent: no candidate_dirs search
        present = [s for s in SUBDIRS if os.path.isdir(os.path.join(self.root, s))]
        if not present:
            where, missing = ((self.root, os.path.join(self.root, SUBDIRS[0])) if os.path.isdir(self.root)
                              else (os.path.dirname(self.root), self.root))
            raise missing_layout_error(self.name, where, self.layout, missing, _entry_hint(self.name, "ROOT"))
        self.data_dir = self.root
        self._train, self._query, self._gallery = (
            parse_market_dir(os.path.join(self.root, sub), self.name, sub == SUBDIRS[0], self.domain)
            if sub in present else [] for sub in SUBDIRS)

    def where(self, split):
        return "%s is missing or holds no PID_cCAM... images" % os.path.join(self.root, SUBDIRS[SPLITS.index(split)])


def _int_field(row, column, path, lineno):
    value = row[column].strip()
    try:
        return int(value)
    except ValueError:
        raise UserError("%s line %d: %s %r is not an integer; fix the row (columns %s)"
                        % (path, lineno, column, value, CSV_HEADER)) from None


def read_csv_list(path):
    """Rows of a ``path,pid,camid[,split]`` list as ``(line number, absolute image path, pid, camid, split)``.

    One-line ``UserError`` (file and line number) for a missing header or column, a row of another length, a pid or
    camid that is not an integer, a pid below -1, an empty or unknown split, an empty path, or an image listed twice.
    Without a ``split`` column every row is ``train``. The images themselves are not opened here.
    """
    base = os.path.dirname(os.path.abspath(path))
    rows, first_line = [], {}
    with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's byte-order mark
        reader = csv.reader(fh)
        header = None
        for fields in reader:
            lineno = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if header is None:
                header = [f.strip().lower() for f in fields]
                missing = [c for c in CSV_COLUMNS if c not in header]
                if missing or len(set(header)) != len(header):
                    raise UserError("%s line %d: the first line must be a header naming the columns %s, got %r; "
                                    "add or fix the header line" % (path, lineno, CSV_HEADER, ",".join(fields)))
                continue
            if len(fields) != len(header):
                raise UserError("%s line %d: %d fields where the header has %d (%s); fix the row"
                                % (path, lineno, len(fields), len(header), ",".join(header)))
            row = dict(zip(header, fields))
            rel = row["path"].strip()
            if not rel:
                raise UserError("%s line %d: the path is empty; fix the row" % (path, lineno))
            pid, camid = _int_field(row, "pid", path, lineno), _int_field(row, "camid", path, lineno)
            if pid < JUNK_PID:
                raise UserError("%s line %d: pid %d is negative; identities are >= 0 (-1 marks a junk image)"
                                % (path, lineno, pid))
            split = row["split"].strip().lower() if "split" in row else "train"
            if split not in SPLITS:
                raise UserError("%s line %d: split %r is not one of %s; fix the row"
                                % (path, lineno, row["split"].strip(), ", ".join(SPLITS)))
            image = os.path.normpath(os.path.join(base, os.path.expanduser(rel)))
            if image in first_line:
                raise UserError("%s line %d: %s is listed again (first on line %d); list each image once"
                                % (path, lineno, rel, first_line[image]))
            first_line[image] = lineno
            rows.append((lineno, image, pid, camid, split))
    if header is None:
        raise UserError("%s is empty; it needs a header line %s and one row per image" % (path, CSV_HEADER))
    return rows


class CustomCsv(ReidDataset):
    """A user's dataset listed in a CSV file (``root`` is the file)."""
    layout = "a CSV file whose first line is the header %s, then one row per image" % CSV_HEADER

    def __init__(self, root, name, **kwargs):
        self.name = name
        super(CustomCsv, self).__init__(root, **kwargs)

    def load(self):
        if not os.path.isfile(self.root):
            raise missing_layout_error(self.name, os.path.dirname(self.root), self.layout, self.root,
                                       _entry_hint(self.name, "CSV"))
        self._lines = {}
        for lineno, image, pid, camid, split in read_csv_list(self.root):
            self._lines[image] = lineno
            if pid == JUNK_PID:
                continue
            if split == "train":
                self._train.append((image, "%s_%d" % (self.name, pid), "%s_%d" % (self.name, camid), self.domain))
            else:
                (self._query if split == "query" else self._gallery).append((image, pid, camid, self.domain))

    def where(self, split):
        if split != "train" and "split" not in csv_columns(self.root):
            return "%s has no split column, so every row is a training image; add a split column (train, query or " \
                "gallery) to use it as a target" % self.root
        return "no row of %s has split %s" % (self.root, split)

    def listed_in(self, path):
        line = getattr(self, "_lines", {}).get(path)
        return "%s line %d" % (self.root, line) if line else ""


def csv_columns(path):
    """The column names of a CSV list's header line (lower case), [] for an empty file."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for fields in csv.reader(fh):
            if any(f.strip() for f in fields):
                return [f.strip().lower() for f in fields]
    return []


def custom_entries(cfg):
    """{name: (dataset class, path as configured)} of the config's DATASETS.CUSTOM entries."""
    custom = getattr(getattr(cfg, "DATASETS", None), "CUSTOM", None) or {}
    entries = {}
    for name, entry in custom.items():
        root, csv_path = str(entry.get("ROOT", "")).strip(), str(entry.get("CSV", "")).strip()
        if bool(root) == bool(csv_path):
            check_custom_datasets(cfg)   # raises the config's error for this entry
        if name in DATASET_REGISTRY:
            raise UserError("DATASETS.CUSTOM.%s has the name of a built-in dataset; give your dataset another name"
                            % name)
        entries[name] = (CustomFolder, root) if root else (CustomCsv, csv_path)
    return entries


def resolve_custom_path(path, data_root):
    """An entry's path: absolute (``~`` expanded) as given, relative ones under the data root."""
    return os.path.normpath(os.path.join(data_root, os.path.expanduser(path)))
