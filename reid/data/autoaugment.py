"""AutoAugment with the ImageNet policy of the AutoAugment paper (Cubuk et al. 2019), on numpy/OpenCV.

docs/method.md#transforms: the original applies fast-reid's timm-derived `AutoAugment` ('original' ImageNet policy)
with probability 0.1 at the original image size. Ops take and return HxWx3 RGB uint8 arrays and follow the
PIL operations that timm calls (same lookup tables for the histogram ops, PIL's blend/affine conventions);
magnitudes map a level 0..10 to an argument as timm does:
  Rotate +-30 deg * level/10, ShearX/Y +-0.3 * level/10, TranslateX/Y +-0.45 * size * level/10 (timm's
  relative variant), Color/Contrast/Brightness/Sharpness factor 0.1 + 1.8 * level/10, Solarize threshold
  int(256 * level/10), Posterize ('original' variant) int(4 * level/10) + 4 bits; signed ops are negated with
  probability 1/2. Geometric ops fill with (128, 128, 128) and pick bilinear or bicubic at random.
Randomness comes only from the `np.random.Generator` passed to each call.
"""
import math

import cv2
import numpy as np

FILL = (128, 128, 128)
MAX_LEVEL = 10.0

# (op, probability, level) pairs of the 25 ImageNet sub-policies, in the paper's order
IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 8), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)),
    (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)


# ------------------------------------------------------------------------------------------ pixel ops
def _apply_lut(img, lut):
    """Per-channel lookup: `lut` is (256,) for all channels or (3, 256)."""
    lut = np.asarray(lut, np.uint8)
    if lut.ndim == 1:
        return cv2.LUT(img, lut)
    return np.stack([lut[c][img[..., c]] for c in range(3)], axis=-1)


def invert(img):
    return 255 - img


def solarize(img, threshold):
    """Pixels >= threshold are inverted (PIL ImageOps.solarize)."""
    i = np.arange(256)
    return _apply_lut(img, np.where(i < threshold, i, 255 - i))


def posterize(img, bits):
    """Keep the `bits` most significant bits of every channel."""
    if bits >= 8:
        return img
    return img & np.uint8((0xFF << (8 - int(bits))) & 0xFF)


def auto_contrast(img):
    """Stretch each channel to 0..255 linearly (PIL ImageOps.autocontrast, cutoff 0)."""
    luts = []
    i = np.arange(256, dtype=np.float64)
    for c in range(3):
        channel = img[..., c]
        lo, hi = int(channel.min()), int(channel.max())
        if hi <= lo:
            luts.append(np.arange(256))
            continue
        scale = 255.0 / (hi - lo)
        luts.append(np.clip(np.trunc(i * scale - lo * scale), 0, 255))
    return _apply_lut(img, np.stack(luts))


def equalize(img):
    """Histogram equalisation per channel with PIL's lookup table (ImageOps.equalize)."""
    luts = []
    for c in range(3):
        hist = np.bincount(img[..., c].reshape(-1), minlength=256)
        nonzero = hist[hist > 0]
        step = (int(nonzero.sum()) - int(nonzero[-1])) // 255 if nonzero.size > 1 else 0
        if not step:
            luts.append(np.arange(256))
            continue
        before = np.concatenate([[0], np.cumsum(hist)[:-1]])  # pixels strictly below each value
        luts.append(np.minimum((step // 2 + before) // step, 255))
    return _apply_lut(img, np.stack(luts))


def _gray(img):
    """PIL's RGB -> L conversion (ITU-R 601-2 luma, fixed point, rounded)."""
    rgb = img.astype(np.int64)
    return ((rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16).astype(np.uint8)


def _blend(degenerate, img, factor):
    """PIL Image.blend(degenerate, img, factor): degenerate + factor * (img - degenerate), clipped, truncated."""
    out = degenerate.astype(np.float32) + np.float32(factor) * (img.astype(np.float32) - degenerate)
    return np.clip(out, 0, 255).astype(np.uint8)


def color(img, factor):
    return _blend(np.repeat(_gray(img)[..., None], 3, axis=-1), img, factor)


def contrast(img, factor):
    mean = int(_gray(img).mean() + 0.5)
    return _blend(np.full_like(img, mean), img, factor)


def brightness(img, factor):
    return _blend(np.zeros_like(img), img, factor)


def sharpness(img, factor):
    """Blend with PIL's SMOOTH-filtered image (3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13, borders unfiltered)."""
    kernel = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13.0
    smooth = np.clip(np.floor(cv2.filter2D(img.astype(np.float32), -1, kernel) + 0.5), 0, 255).astype(np.uint8)
    smooth[0], smooth[-1], smooth[:, 0], smooth[:, -1] = img[0], img[-1], img[:, 0], img[:, -1]
    return _blend(smooth, img, factor)


# ------------------------------------------------------------------------------------- geometric ops
def affine(img, coeffs, interpolation=cv2.INTER_LINEAR, fill=FILL):
    """PIL `img.transform(size, AFFINE, (a, b, c, d, e, f))`: output pixel (x, y) samples the input at
    (a x + b y + c, d x + e y + f) in PIL's continuous coordinates (pixel centres at +0.5)."""
    a, b, c, d, e, f = coeffs
    # continuous -> index coordinates: src_idx = A (dst_idx + 0.5) + t - 0.5
    m = np.array([[a, b, c + 0.5 * (a + b) - 0.5], [d, e, f + 0.5 * (d + e) - 0.5]], np.float64)
    h, w = img.shape[:2]
    return cv2.warpAffine(img, m, (w, h), flags=interpolation | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(float(v) for v in fill))


def shear_x(img, factor, **kw):
    return affine(img, (1, factor, 0, 0, 1, 0), **kw)


def shear_y(img, factor, **kw):
    return affine(img, (1, 0, 0, factor, 1, 0), **kw)


def translate_x(img, pixels, **kw):
    return affine(img, (1, 0, pixels, 0, 1, 0), **kw)


def translate_y(img, pixels, **kw):
    return affine(img, (1, 0, 0, 0, 1, pixels), **kw)


def rotate(img, degrees, **kw):
    """Counter-clockwise rotation about the image centre, same size (PIL Image.rotate)."""
    h, w = img.shape[:2]
    angle = -math.radians(degrees)
    a, b, d, e = math.cos(angle), math.sin(angle), -math.sin(angle), math.cos(angle)
    cx, cy = w / 2.0, h / 2.0
    c = a * -cx + b * -cy + cx
    f = d * -cx + e * -cy + cy
    return affine(img, (a, b, c, d, e, f), **kw)


# ------------------------------------------------------------------------------- levels and the policy
def _signed(value, rng):
    return -value if rng.random() > 0.5 else value


def _enhance_factor(level):
    return level / MAX_LEVEL * 1.8 + 0.1


def apply_op(name, img, level, rng):
    """Apply op `name` at `level` (0..10), drawing its sign and interpolation from `rng`."""
    if name in ("AutoContrast", "Equalize", "Invert"):
        return {"AutoContrast": auto_contrast, "Equalize": equalize, "Invert": invert}[name](img)
    if name == "Posterize":
        return posterize(img, int(level / MAX_LEVEL * 4) + 4)
    if name == "Solarize":
        return solarize(img, int(level / MAX_LEVEL * 256))
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        fn = {"Color": color, "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness}[name]
        return fn(img, _enhance_factor(level))
    interpolation = (cv2.INTER_LINEAR, cv2.INTER_CUBIC)[int(rng.integers(2))]
    h, w = img.shape[:2]
    if name == "Rotate":
        return rotate(img, _signed(level / MAX_LEVEL * 30.0, rng), interpolation=interpolation)
    if name in ("ShearX", "ShearY"):
        fn = shear_x if name == "ShearX" else shear_y
        return fn(img, _signed(level / MAX_LEVEL * 0.3, rng), interpolation=interpolation)
    if name in ("TranslateX", "TranslateY"):
        size = w if name == "TranslateX" else h
        fn = translate_x if name == "TranslateX" else translate_y
        return fn(img, _signed(level / MAX_LEVEL * 0.45 * size, rng), interpolation=interpolation)
    raise ValueError("unknown AutoAugment op %r" % name)


class AutoAugment:
    """Pick one sub-policy uniformly; apply each of its two ops with that op's probability."""

    def __init__(self, policy=IMAGENET_POLICY):
        self.policy = policy

    def __call__(self, img, rng):
        for name, prob, level in self.policy[int(rng.integers(len(self.policy)))]:
            if rng.random() < prob:
                img = apply_op(name, img, level, rng)
        return img

    def __repr__(self):
        return "AutoAugment(ImageNet policy, %d sub-policies)" % len(self.policy)
