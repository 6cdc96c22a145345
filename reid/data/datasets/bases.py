"""Base class of the dataset loaders and the Market-1501 file-name parser they share.

A loader only lists files: ``.train``, ``.query`` and ``.gallery`` are lists of records
``(img_path, pid, camid, domain)``. Training records carry pids and camids namespaced by the dataset
(``"Market1501_2"``, ``"Market1501_0"``) so that ``reid.data.common.MultiDomainTrainSet`` can relabel several
sources without collisions; query and gallery records carry the raw integer pid and a 0-based camid.
Junk (pid -1) is dropped everywhere; distractors (pid 0) are kept in query/gallery and left out of training.
"""
import logging
import os
import re

from reid.errors import UserError
from reid.data.common import IMAGE_EXTENSIONS

logger = logging.getLogger(__name__)

JUNK_PID = -1
DISTRACTOR_PID = 0

_MARKET_NAME = re.compile(r"^(-?\d+)_c(\d+)")


def market_ids(name):
    """(pid, 0-based camid) of a Market-1501-style file name ``PPPP_cC...``, or None when it is not one."""
    match = _MARKET_NAME.match(name)
    if match is None or int(match.group(2)) < 1 or int(match.group(1)) < JUNK_PID:
        return None
    return int(match.group(1)), int(match.group(2)) - 1


def data_root_hint():
    return ("set DATASETS.ROOT in the config (or on the command line: DATASETS.ROOT /path) or the REID_DATA "
            "environment variable to the folder that holds the datasets")


def missing_layout_error(dataset, root, layout, missing, hint=None):
    return UserError("%s not found under %s (missing %s); expected layout: %s; %s"
                     % (dataset, root, missing, layout, hint or data_root_hint()))


def list_images(folder):
    """Image files of a folder (sorted names); other files (Thumbs.db, readme, ...) are ignored."""
    names = sorted(os.listdir(folder))
    return [n for n in names if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS
            and not n.startswith(".") and os.path.isfile(os.path.join(folder, n))]


def parse_market_dir(folder, dataset_name, is_train, domain=0):
    """Records of a folder of Market-1501-style names ``PPPP_cC...`` (pid, 1-based camera).

    Images whose name does not follow the pattern are skipped with a warning; pid -1 (junk) is dropped;
    pid 0 (distractor) is kept for testing and dropped for training.
    """
    records, unparsed = [], []
    for name in list_images(folder):
        ids = market_ids(name)
        if ids is None:
            unparsed.append(name)
            continue
        pid, cam = ids
        if pid == JUNK_PID or (is_train and pid == DISTRACTOR_PID):
            continue
        path = os.path.join(folder, name)
        if is_train:
            records.append((path, "%s_%d" % (dataset_name, pid), "%s_%d" % (dataset_name, cam), domain))
        else:
            records.append((path, pid, cam, domain))
    if unparsed:
        logger.warning("%s: skipped %d image(s) in %s whose names are not PID_cCAM...: %s", dataset_name,
                       len(unparsed), folder, ", ".join(unparsed[:5]) + (" ..." if len(unparsed) > 5 else ""))
    return records


class ReidDataset(object):
    """Lists of records for one dataset. Subclasses fill ``_train``, ``_query``, ``_gallery``.

    ``combineall=True`` (Protocol-3) appends the test identities (query + gallery, ``junk_pids`` excluded) to
    ``train`` as new identities ``"<name>_test_<pid>"`` with cameras ``"<name>_test_<cam>"``.
    """
    name = "Dataset"
    layout = ""
    junk_pids = ()  # test pids that are not identities (Market-style layouts: -1 junk, 0 distractor)

    def __init__(self, root, combineall=False, domain=0, **kwargs):
        if kwargs:
            raise UserError("%s does not take option(s) %s" % (self.name, ", ".join(sorted(kwargs))))
        self.root = os.path.abspath(os.path.expanduser(str(root)))
        self.combineall = bool(combineall)
        self.domain = int(domain)
        self._train, self._query, self._gallery = [], [], []
        self.load()
        if self.combineall:
            self._train = self._train + self._test_as_train()

    def load(self):
        raise NotImplementedError

    @property
    def train(self):
        return self._train

    @property
    def query(self):
        return self._query

    @property
    def gallery(self):
        return self._gallery

    def _test_as_train(self):
        out = []
        for path, pid, cam, _ in self._query + self._gallery:
            if pid in self.junk_pids:
                continue
            out.append((path, "%s_test_%d" % (self.name, pid), "%s_test_%d" % (self.name, cam), self.domain))
        return out

    def where(self, split):
        """Where the images of `split` ("train", "query", "gallery") would come from, for an error that finds none;
        "" where the layout (in the missing-folder error) says it."""
        return ""

    def listed_in(self, path):
        """Where image `path` is listed, for an error about it ("labels.csv line 12"); "" when it was found in a
        folder."""
        return ""

    def require(self, paths, root=None):
        """Raise the missing-layout error for the first path that does not exist."""
        for p in paths:
            if not os.path.exists(p):
                raise missing_layout_error(self.name, root or self.root, self.layout, p)

    @staticmethod
    def _stats(records):
        return len({r[1] for r in records}), len(records), len({r[2] for r in records})

    def summary(self):
        lines = ["%s (%s)" % (self.name, self.root), "  %-8s %7s %8s %8s" % ("subset", "ids", "images", "cameras")]
        for subset in ("train", "query", "gallery"):
            ids, imgs, cams = self._stats(getattr(self, subset))
            lines.append("  %-8s %7d %8d %8d" % (subset, ids, imgs, cams))
        return "\n".join(lines)

    def __repr__(self):
        return "<%s train=%d query=%d gallery=%d>" % (self.name, len(self.train), len(self.query), len(self.gallery))
