"""Pieces shared by every dataset: image reading with clear errors, a pre-scan for bad images, and the
multi-domain relabelling of training records (fast-reid's ``CommDataset`` convention, docs/method.md#datasets).

Record: ``(img_path, pid, camid, domain)``.

Relabelling (``MultiDomainTrainSet``)
-------------------------------------
Each source dataset gives training records whose pid and camid are strings namespaced by the dataset
(``"Market1501_2"``, ``"Market1501_0"``; with ``combineall`` also ``"Market1501_test_7"``), so ids of two
datasets never collide. Given the source datasets in ``DATASETS.NAMES`` order:

* pids become global contiguous ints, domain by domain: domain 0 gets ``0 .. n0-1``, domain 1 gets
  ``n0 .. n0+n1-1`` and so on; ``offsets[d]`` is the first global id of domain d and ``num_classes[d]`` its
  count, so ``global_pid - offsets[d]`` is the row of domain d's classifier;
* within a domain ids are ordered by their namespaced name, numbers numerically (fast-reid sorts the
  strings, which only permutes classifier rows);
* camids become global contiguous ints the same way (domain by domain, sorted within a domain);
* ``domain`` is the index of the source in the list.
"""
import logging
import os
import re

import numpy as np

from reid.errors import UserError

logger = logging.getLogger(__name__)

ON_BAD_CHOICES = ("stop", "skip")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_BMP_MAGIC = b"BM"
# A JPEG ends with the end-of-image marker; some writers pad after it, so look near the end, not at it.
_JPEG_TAIL_WINDOW = 4096


def _check_on_bad(on_bad):
    if on_bad not in ON_BAD_CHOICES:
        raise UserError("DATASETS.ON_BAD_IMAGE must be one of %s, got %r" % ("/".join(ON_BAD_CHOICES), on_bad))


def _bad_image_error(path, reason, listed=""):
    return UserError("cannot read image %s%s: %s; fix or remove it, or set DATASETS.ON_BAD_IMAGE skip"
                     % (path, " (listed in %s)" % listed if listed else "", reason))


def _header_problem(path):
    """Cheap integrity check (no decode): None if the file looks like a whole image, else the reason."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "empty file"
        with open(path, "rb") as fh:
            head = fh.read(16)
            fh.seek(max(0, size - _JPEG_TAIL_WINDOW))
            tail = fh.read()
    except OSError as exc:
        return exc.strerror or str(exc)
    return _ends_problem(head, tail)


def _ends_problem(head, tail):
    """The reason an image whose first 16 bytes are `head` and last few kB `tail` is not whole, or None."""
    if head.startswith(_JPEG_MAGIC):
        if b"\xff\xd9" not in tail:
            return "truncated JPEG (no end-of-image marker)"
        return None
    if head.startswith(_PNG_MAGIC):
        if b"IEND" not in tail[-16:]:
            return "truncated PNG (no IEND chunk)"
        return None
    if head.startswith(_BMP_MAGIC):
        return None
    return "not a JPEG/PNG/BMP file (unknown header %s)" % head[:4].hex()


def _decode(path):
    """(RGB uint8 image, None) or (None, reason)."""
    try:
        buf = np.fromfile(path, dtype=np.uint8)  # also handles non-ASCII paths, unlike cv2.imread
    except OSError as exc:
        return None, exc.strerror or str(exc)
    return _decode_buffer(buf)


def _decode_buffer(buf):
    import cv2
    if buf.size == 0:
        return None, "empty file"
    try:
        img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    except cv2.error as exc:
        return None, "decoder error: %s" % str(exc).strip().splitlines()[-1]
    if img is None:
        return None, "the decoder does not recognise it as an image"
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB), None


def image_or_problem(path):
    """(RGB uint8 image (H, W, 3), None), or (None, the reason it cannot be read): missing, empty, truncated,
    not an image. Grayscale, RGBA and 16-bit files come back as 8-bit RGB (the decoder converts them)."""
    reason = _header_problem(path)
    if reason is not None:
        return None, reason
    return _decode(path)


def image_bytes_or_problem(data):
    """image_or_problem for the bytes of an image file (an upload): the same checks and the same decoder, so
    that the same file gives the same array either way."""
    if not data:
        return None, "empty file"
    reason = _ends_problem(bytes(data[:16]), bytes(data[-_JPEG_TAIL_WINDOW:]))
    if reason is not None:
        return None, reason
    return _decode_buffer(np.frombuffer(data, np.uint8))


def read_image(path, on_bad="stop"):
    """Decode an image file to an RGB uint8 array (H, W, 3).

    A missing, empty, truncated or undecodable file raises ``UserError`` naming the path (``on_bad="stop"``)
    or is logged and returns ``None`` (``on_bad="skip"``; the caller drops the sample).
    """
    _check_on_bad(on_bad)
    img, reason = image_or_problem(path)
    if reason is None:
        return img
    if on_bad == "stop":
        raise _bad_image_error(path, reason)
    logger.warning("skipping unreadable image %s: %s", path, reason)
    return None


def verify_images(records, on_bad="stop", full_decode=False, progress=False, listed_in=None):
    """Check every record's image before training/testing starts, so a bad file never reaches a loader worker.

    ``full_decode=False`` checks existence, size, format header and the end marker (fast: two small reads per
    file); ``True`` decodes every image. Returns ``(kept_records, num_bad)``. With ``on_bad="stop"`` the first
    bad image raises ``UserError`` naming it; with ``"skip"`` bad records are dropped, each is logged, and
    their count is returned. ``listed_in(path)``: where the image is listed ("labels.csv line 12", or ""),
    named with it.
    """
    _check_on_bad(on_bad)
    records = list(records)
    iterator = records
    if progress:
        from tqdm import tqdm
        iterator = tqdm(records, desc="verifying images", unit="img")
    kept, num_bad = [], 0
    for rec in iterator:
        path = rec[0]
        reason = _header_problem(path)
        if reason is None and full_decode:
            reason = _decode(path)[1]
        if reason is None:
            kept.append(rec)
            continue
        listed = listed_in(path) if listed_in is not None else ""
        if on_bad == "stop":
            raise _bad_image_error(path, reason, listed)
        logger.warning("skipping unreadable image %s%s: %s", path, " (listed in %s)" % listed if listed else "", reason)
        num_bad += 1
    if num_bad:
        logger.warning("%d of %d images were unreadable and skipped", num_bad, len(records))
    return kept, num_bad


# ----------------------------------------------------------------------------- multi-domain relabelling
_NUM_RE = re.compile(r"(-?\d+)")


def natural_key(name):
    """Sort key that orders the digit runs of a string numerically: 'M_2' < 'M_10' < 'M_test_1'."""
    parts = _NUM_RE.split(str(name))
    return tuple((0, int(p), "") if i % 2 else (1, 0, p) for i, p in enumerate(parts))


class MultiDomainTrainSet(object):
    """Training records of several source domains with global contiguous pids and camids.

    ``sources``: list of datasets (objects with ``.train``) or of train-record lists, in domain order.
    Attributes: ``records`` [(img_path, pid, camid, domain)], ``num_classes`` (per domain), ``offsets``
    (first global pid per domain), ``num_cameras``, ``names``, ``pid_maps`` / ``cam_maps`` (per domain,
    original id -> global id).
    """

    def __init__(self, sources, names=None):
        if not sources:
            raise UserError("no source datasets given; set DATASETS.NAMES to at least one training dataset")
        self.names = list(names) if names is not None else [
            getattr(s, "name", type(s).__name__) if not isinstance(s, (list, tuple)) else "domain%d" % i
            for i, s in enumerate(sources)]
        self.records, self.num_classes, self.offsets, self.pid_maps, self.cam_maps = [], [], [], [], []
        pid_offset = cam_offset = 0
        for domain, src in enumerate(sources):
            train = src if isinstance(src, (list, tuple)) else src.train
            if not train:
                raise UserError("source dataset %s has no training images; check its folder or remove it from "
                                "DATASETS.NAMES" % self.names[domain])
            pids = sorted({r[1] for r in train}, key=natural_key)
            cams = sorted({r[2] for r in train}, key=natural_key)
            pid_map = {p: pid_offset + i for i, p in enumerate(pids)}
            cam_map = {c: cam_offset + i for i, c in enumerate(cams)}
            self.records.extend((r[0], pid_map[r[1]], cam_map[r[2]], domain) for r in train)
            self.offsets.append(pid_offset)
            self.num_classes.append(len(pids))
            self.pid_maps.append(pid_map)
            self.cam_maps.append(cam_map)
            pid_offset += len(pids)
            cam_offset += len(cams)
        self.num_cameras = cam_offset
        self.num_bad = 0  # images dropped by verify_images before relabelling (set by build_train_set)

    @property
    def total_classes(self):
        return sum(self.num_classes)

    @property
    def num_domains(self):
        return len(self.num_classes)

    def __len__(self):
        return len(self.records)

    def summary(self):
        lines = ["%-12s %8s %8s %8s" % ("domain", "ids", "images", "offset")]
        counts = np.bincount([r[3] for r in self.records], minlength=self.num_domains)
        for d, name in enumerate(self.names):
            lines.append("%-12s %8d %8d %8d" % (name, self.num_classes[d], counts[d], self.offsets[d]))
        return "\n".join(lines)


def combine_train_sets(sources, names=None):
    """``MultiDomainTrainSet`` of the given sources (see the module docstring)."""
    return MultiDomainTrainSet(sources, names)
