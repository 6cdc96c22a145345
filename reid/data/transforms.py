"""Image transforms on numpy/OpenCV/Pillow: HxWx3 RGB uint8 in, float32 3xHxW in 0..255 out (the model normalises).

Training pipeline (docs/method.md#transforms, driven by cfg.INPUT):
  RandomApply(AutoAugment ImageNet policy, AUTOAUG.PROB) at the original size -> bicubic resize to SIZE_TRAIN
  -> pad PADDING.SIZE (constant 0) + random crop back to SIZE_TRAIN -> horizontal flip (FLIP.PROB)
  -> RandomApply(ColorJitter(CJ.*), CJ.PROB) -> RandomApply(CastJitter(CAST.STD), CAST.PROB) (off by default)
  -> HWC->CHW float32 -> random erasing (REA.*, off by default).
The original applies the colour jitter even with CJ disabled (its transform[1]); here CJ.ENABLED (on by
default) decides. Test pipeline: bicubic resize to SIZE_TEST -> CHW float32.

Every random draw comes from the `np.random.Generator` passed to the call; `make_rng(seed, epoch, index)`
gives the per-sample generator a dataset should use, so results do not depend on worker count or order.
"""
import math

import cv2
import numpy as np
from PIL import Image

from reid.errors import UserError
from reid.data.autoaugment import AutoAugment

REA_SCALE = (0.02, 0.33)   # torchvision RandomErasing defaults
REA_RATIO = (0.3, 3.3)


def make_rng(*keys):
    """np.random.Generator seeded by a tuple of non-negative ints, e.g. (seed, epoch, dataset index)."""
    return np.random.default_rng([int(k) for k in keys])


def check_image(img):
    if not isinstance(img, np.ndarray) or img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        desc = "%s %s" % (getattr(img, "shape", None), getattr(img, "dtype", type(img).__name__))
        raise UserError("transforms expect an HxWx3 RGB uint8 image, got %s; decode images with "
                        "reid.data.common's reader (RGB, uint8)" % desc)
    return img


# ------------------------------------------------------------------------------------------- steps
_PIL_BICUBIC = getattr(Image, "Resampling", Image).BICUBIC   # Pillow >= 9.1 names it Image.Resampling


def resize(img, size_hw):
    """Bicubic resize to (H, W) by Pillow itself, as the original's Resize on PIL images. Pillow's bicubic
    (a = -0.5) widens its kernel by the scale factor when downscaling, i.e. it antialiases; cv2.INTER_CUBIC
    (a = -0.75, fixed 4x4 support) does not, and differs by several grey levels on downscaled crops."""
    h, w = int(size_hw[0]), int(size_hw[1])
    if img.shape[:2] == (h, w):
        return img
    return np.array(Image.fromarray(img).resize((w, h), _PIL_BICUBIC))


def pad(img, padding, fill=0):
    p = int(padding)
    return np.pad(img, ((p, p), (p, p), (0, 0)), mode="constant", constant_values=fill)


def random_crop(img, size_hw, rng):
    """Crop (H, W) at a uniform offset (torchvision RandomCrop.get_params)."""
    th, tw = int(size_hw[0]), int(size_hw[1])
    h, w = img.shape[:2]
    if h < th or w < tw:
        raise UserError("random crop of %dx%d from a %dx%d image; check INPUT.SIZE_TRAIN and INPUT.PADDING"
                        % (th, tw, h, w))
    i, j = int(rng.integers(0, h - th + 1)), int(rng.integers(0, w - tw + 1))
    return img[i:i + th, j:j + tw]


def hflip(img):
    return np.ascontiguousarray(img[:, ::-1])


def to_chw_float(img):
    return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)


class ColorJitter:
    """torchvision ColorJitter(brightness, contrast, saturation, hue): factors drawn uniformly from
    [max(0, 1-b), 1+b], [max(0, 1-c), 1+c], [max(0, 1-s), 1+s], [-h, h]; the four adjustments run in a random
    order; a strength of 0 skips that adjustment. Works in float, returns uint8 (the original's PIL ops
    returned 8-bit images)."""

    def __init__(self, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0):
        for name, v in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if v < 0:
                raise UserError("INPUT.CJ.%s must be >= 0, got %r" % (name.upper(), v))
        if not 0 <= hue <= 0.5:
            raise UserError("INPUT.CJ.HUE must be in [0, 0.5], got %r" % (hue,))
        self.strengths = (float(brightness), float(contrast), float(saturation), float(hue))

    def params(self, rng):
        order = rng.permutation(4)
        b, c, s, h = self.strengths
        factors = [rng.uniform(max(0.0, 1 - b), 1 + b) if b > 0 else None,
                   rng.uniform(max(0.0, 1 - c), 1 + c) if c > 0 else None,
                   rng.uniform(max(0.0, 1 - s), 1 + s) if s > 0 else None,
                   rng.uniform(-h, h) if h > 0 else None]
        return order, factors

    def __call__(self, img, rng):
        order, factors = self.params(rng)
        if all(f is None for f in factors):
            return img
        out = img.astype(np.float32)
        for k in order:
            if factors[k] is not None:
                out = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)[k](out, factors[k])
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _luma(img):
    return img[..., 0] * 0.299 + img[..., 1] * 0.587 + img[..., 2] * 0.114


def adjust_brightness(img, factor):
    return np.clip(img * np.float32(factor), 0, 255)


def adjust_contrast(img, factor):
    mean = np.float32(_luma(img).mean())
    return np.clip(mean + np.float32(factor) * (img - mean), 0, 255)


def adjust_saturation(img, factor):
    gray = _luma(img)[..., None]
    return np.clip(gray + np.float32(factor) * (img - gray), 0, 255)


def adjust_hue(img, factor):
    """Rotate the hue by factor * 360 degrees (HSV round trip in float: no 8-bit hue quantisation)."""
    hsv = cv2.cvtColor(np.ascontiguousarray(img / np.float32(255)), cv2.COLOR_RGB2HSV)
    hsv[..., 0] = np.mod(hsv[..., 0] + np.float32(factor * 360.0), np.float32(360.0))
    return np.clip(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB) * np.float32(255), 0, 255)


class CastJitter:
    """A random white balance: each RGB channel multiplied by its own gain exp(N(0, std)), the three gains divided
    by their geometric mean so that only the colour cast changes, not the overall level. Why: cameras differ
    most in their white balance (a sodium-lit night camera is orange, an overcast one bluish), and a global
    cast keeps what tells people apart here, the colours of their clothes relative to each other, where a hue
    rotation (ColorJitter's hue) moves every colour to another one. Not in the original (an addition for data
    without ImageNet-pretrained weights). Returns uint8."""

    def __init__(self, std):
        if not std >= 0:
            raise UserError("INPUT.CAST.STD must be >= 0 (log-std of the per-channel gains), got %r" % (std,))
        self.std = float(std)

    def gains(self, rng):
        log_gains = rng.normal(0.0, self.std, 3)
        return np.exp(log_gains - log_gains.mean()).astype(np.float32)

    def __call__(self, img, rng):
        if self.std == 0:
            return img
        out = img.astype(np.float32) * self.gains(rng)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)


class RandomErasing:
    """torchvision RandomErasing on a CHW float image: with probability p, up to 10 tries to place a rectangle
    of area fraction U(scale) and log-uniform aspect ratio inside the image, filled with `value` per channel."""

    def __init__(self, p=0.5, value=(0.0, 0.0, 0.0), scale=REA_SCALE, ratio=REA_RATIO):
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise UserError("INPUT.REA.SCALE must satisfy 0 < lo <= hi <= 1 and RATIO 0 < lo <= hi, got %r, %r"
                            % (scale, ratio))
        self.p, self.scale, self.ratio = float(p), tuple(scale), tuple(ratio)
        self.value = np.asarray(value, np.float32).reshape(-1, 1, 1)

    def region(self, shape_hw, rng):
        """(top, left, height, width) of the rectangle to erase, or None (no valid draw in 10 tries)."""
        h_img, w_img = shape_hw
        area = h_img * w_img
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            h = int(round(math.sqrt(erase_area * aspect)))
            w = int(round(math.sqrt(erase_area / aspect)))
            if h < h_img and w < w_img:
                return int(rng.integers(0, h_img - h + 1)), int(rng.integers(0, w_img - w + 1)), h, w
        return None

    def __call__(self, chw, rng):
        if not rng.random() < self.p:
            return chw
        box = self.region(chw.shape[1:], rng)
        if box is None:
            return chw
        i, j, h, w = box
        out = chw.copy()
        out[:, i:i + h, j:j + w] = self.value
        return out


# ---------------------------------------------------------------------------------------- pipeline
class Pipeline:
    """A list of (name, step, random) applied in order; call as `pipeline(img, rng)`."""

    def __init__(self, steps):
        self.steps = steps
        self.is_random = any(random for _, _, random in steps)

    def __call__(self, img, rng=None):
        check_image(img)
        if self.is_random and rng is None:
            raise UserError("these transforms are random: pass a np.random.Generator, e.g. "
                            "reid.data.transforms.make_rng(seed, epoch, index)")
        for _, step, random in self.steps:
            img = step(img, rng) if random else step(img)
        return img

    def __repr__(self):
        return "Pipeline(%s)" % " -> ".join(name for name, _, _ in self.steps)


def _random_apply(fn, p):
    def step(img, rng):
        return fn(img, rng) if rng.random() < p else img
    return step


def _size(value, key):
    if len(value) != 2 or min(value) <= 0:
        raise UserError("INPUT.%s must be [height, width] with positive values, got %r" % (key, list(value)))
    return int(value[0]), int(value[1])


def build_transforms(cfg, is_train=True):
    """The training or test pipeline of cfg.INPUT (see the module docstring)."""
    inp = cfg.INPUT
    if not is_train:
        size = _size(inp.SIZE_TEST, "SIZE_TEST")
        return Pipeline([("resize%dx%d" % size, lambda img: resize(img, size), False),
                         ("to_chw_float", to_chw_float, False)])
    size = _size(inp.SIZE_TRAIN, "SIZE_TRAIN")
    steps = []
    if inp.AUTOAUG.ENABLED and inp.AUTOAUG.PROB > 0:
        steps.append(("autoaugment(p=%g)" % inp.AUTOAUG.PROB, _random_apply(AutoAugment(), inp.AUTOAUG.PROB), True))
    steps.append(("resize%dx%d" % size, lambda img: resize(img, size), False))
    if inp.PADDING.ENABLED and inp.PADDING.SIZE > 0:
        padding = int(inp.PADDING.SIZE)
        steps.append(("pad%d" % padding, lambda img: pad(img, padding), False))
        steps.append(("random_crop", lambda img, rng: random_crop(img, size, rng), True))
    if inp.FLIP.ENABLED and inp.FLIP.PROB > 0:
        steps.append(("flip(p=%g)" % inp.FLIP.PROB, _random_apply(lambda img, rng: hflip(img), inp.FLIP.PROB), True))
    cj = inp.CJ
    if cj.ENABLED and cj.PROB > 0 and max(cj.BRIGHTNESS, cj.CONTRAST, cj.SATURATION, cj.HUE) > 0:
        jitter = ColorJitter(cj.BRIGHTNESS, cj.CONTRAST, cj.SATURATION, cj.HUE)
        steps.append(("color_jitter(p=%g)" % cj.PROB, _random_apply(jitter, cj.PROB), True))
    cast = inp.CAST
    if cast.ENABLED and cast.PROB > 0 and cast.STD > 0:
        jitter = CastJitter(cast.STD)
        steps.append(("cast_jitter(std=%g, p=%g)" % (cast.STD, cast.PROB), _random_apply(jitter, cast.PROB), True))
    steps.append(("to_chw_float", to_chw_float, False))
    rea = inp.REA
    if rea.ENABLED and rea.PROB > 0:
        erasing = RandomErasing(rea.PROB, rea.VALUE, tuple(rea.SCALE), tuple(rea.RATIO))
        steps.append(("random_erasing(p=%g)" % rea.PROB, erasing, True))
    return Pipeline(steps)
