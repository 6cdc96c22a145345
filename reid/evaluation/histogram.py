"""A hand-crafted reference: HSV colour histograms over horizontal stripes, no learning.

Why: on data where identity is mostly clothing colour, a colour histogram is the natural floor a learned
feature has to beat; printing it next to the network tells a reader whether training achieved anything
beyond what pixels give for free. It sees exactly what the network sees at test time (the same test
transform, so the same resolution) and is ranked by the same evaluator.

Feature of one image (RGB uint8, H x W): optionally grey-world white balance (each channel scaled to the
image's mean grey level; off by default), the central ``center`` fraction of the columns (a detector box
centres the person: the side columns are mostly background, which changes from camera to camera), HSV
(OpenCV, hue on 0..255), cut into ``stripes`` horizontal bands (head / torso / legs land in different bands);
per band a joint H x S x V histogram with ``bins`` cells, L1-normalised, then square-rooted. With that square
root the cosine similarity of two band histograms is their Bhattacharyya coefficient, so ``metric="cosine"``
ranks by Hellinger distance, the usual choice for histograms. Bands are weighted equally.
"""
import cv2
import numpy as np

from reid.errors import UserError

DEFAULT_STRIPES = 6
DEFAULT_BINS = (8, 4, 4)   # hue, saturation, value: hue carries most of the identity, value the lighting
DEFAULT_CENTER = 0.5       # fraction of the width kept, centred
HSV_RANGES = [0, 256, 0, 256, 0, 256]
REFERENCES = ("histogram",)


def _check(stripes, bins, center):
    if not 0.0 < float(center) <= 1.0:
        raise UserError("histogram center must be the fraction of the width kept, in (0, 1], got %r" % (center,))
    if int(stripes) < 1:
        raise UserError("histogram stripes must be >= 1, got %r" % (stripes,))
    if len(bins) != 3 or min(int(b) for b in bins) < 1:
        raise UserError("histogram bins must be three positive counts (hue, saturation, value), got %r" % (bins,))


def grey_world(image):
    """Each channel scaled so that its mean equals the mean grey level (a global colour-cast correction)."""
    img = image.astype(np.float32)
    means = img.reshape(-1, 3).mean(axis=0)
    return np.clip(img * (means.mean() / np.maximum(means, 1.0)), 0, 255).astype(np.uint8)


def hsv_histogram(image, stripes=DEFAULT_STRIPES, bins=DEFAULT_BINS, center=DEFAULT_CENTER, white_balance=False):
    """Feature vector (stripes * prod(bins),) float32 of one HxWx3 RGB uint8 image."""
    _check(stripes, bins, center)
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise UserError("hsv_histogram expects an HxWx3 RGB uint8 image, got %s %s" % (image.shape, image.dtype))
    if image.shape[0] < stripes:
        raise UserError("an image %d pixels high cannot be cut into %d stripes" % (image.shape[0], stripes))
    if white_balance:
        image = grey_world(image)
    width = image.shape[1]
    keep = max(1, int(round(width * float(center))))
    left = (width - keep) // 2
    hsv = cv2.cvtColor(np.ascontiguousarray(image[:, left:left + keep]), cv2.COLOR_RGB2HSV_FULL)
    edges = np.linspace(0, hsv.shape[0], int(stripes) + 1).round().astype(int)
    out = []
    for top, bottom in zip(edges[:-1], edges[1:]):
        band = np.ascontiguousarray(hsv[top:bottom])
        hist = cv2.calcHist([band], [0, 1, 2], None, [int(b) for b in bins], HSV_RANGES).reshape(-1)
        hist = hist / max(float(hist.sum()), 1.0)
        out.append(np.sqrt(hist))
    return np.concatenate(out).astype(np.float32)


def _as_uint8_hwc(sample):
    """Test-transform output (3,H,W float 0..255) back to the HxWx3 uint8 image it was made from."""
    arr = np.asarray(sample)
    if arr.ndim == 3 and arr.shape[0] == 3 and arr.shape[2] != 3:
        arr = arr.transpose(1, 2, 0)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def histogram_features(records, transform=None, **feature_options):
    """(features, pids, camids) of records ``(path, pid, camid, ...)``; ``transform`` (the test transform:
    RGB uint8 -> 3xHxW float) is applied first when given, so the histogram sees the network's input."""
    from reid.data.common import read_image
    feats, pids, camids = [], [], []
    for rec in records:
        image = read_image(rec[0], "stop")
        if transform is not None:
            image = _as_uint8_hwc(transform(image, None))
        feats.append(hsv_histogram(image, **feature_options))
        pids.append(int(rec[1]))
        camids.append(int(rec[2]))
    if not feats:
        raise UserError("no images to describe with the colour histogram; check the test dataset")
    return np.stack(feats), np.asarray(pids, np.int64), np.asarray(camids, np.int64)


def evaluate_histogram(query, gallery, transform=None, feature_options=None, **options):
    """Metrics dict (``Rank-1``, ..., ``mAP``, ``mINP`` in %) of the colour-histogram feature on query/gallery
    records, ranked by the evaluator the networks use. ``feature_options``: ``hsv_histogram`` keywords;
    ``options``: ``evaluate_features`` keywords except the metric, which is the Hellinger distance (cosine of
    the square-rooted histograms)."""
    feature_options = feature_options or {}
    from reid.evaluation.evaluator import evaluate_features
    options = dict(options)
    options["metric"] = "cosine"
    options.pop("return_distmat", None)
    qf, qp, qc = histogram_features(query, transform, **feature_options)
    gf, gp, gc = histogram_features(gallery, transform, **feature_options)
    return evaluate_features(qf, gf, qp, gp, qc, gc, **options)
