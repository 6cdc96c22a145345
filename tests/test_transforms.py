"""numpy/OpenCV transforms (backend-neutral): pipeline contract, each step's semantics, AutoAugment ops."""
import cv2
import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from compat.errors import UserError
from reid.config import get_cfg
from reid.data import autoaugment as A
from reid.data.transforms import (CastJitter, ColorJitter, RandomErasing, adjust_brightness, adjust_contrast,
                                  adjust_hue, adjust_saturation, build_transforms, make_rng, pad, random_crop, resize)


def photo(h=150, w=60, seed=0):
    """Smooth gradients plus mild noise: a stand-in for a pedestrian crop."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    noise = np.random.RandomState(seed).randint(-12, 13, size=(h, w, 3))
    base = np.stack([xx / w * 200 + 20, yy / h * 180 + 30, (xx + yy) / (h + w) * 150 + 60], -1)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def plain_cfg(**changes):
    """Config with every augmentation off; `changes` maps 'CJ.PROB' style keys to values."""
    cfg = get_cfg()
    for key in ("AUTOAUG", "FLIP", "PADDING", "CJ", "CAST", "REA"):
        cfg.INPUT[key].ENABLED = False
    for key, value in changes.items():
        node, name = key.split(".")
        cfg.INPUT[node][name] = value
    return cfg


def test_default_pipelines_shapes_dtypes_ranges():
    cfg = get_cfg()
    train, test = build_transforms(cfg, True), build_transforms(cfg, False)
    img = photo()
    for i in range(20):
        out = train(img, make_rng(0, 0, i))
        assert out.shape == (3, 256, 128) and out.dtype == np.float32 and out.flags.c_contiguous
        assert out.min() >= 0 and out.max() <= 255 and np.all(out == np.round(out))
    out = test(img)
    assert out.shape == (3, 256, 128) and out.dtype == np.float32
    cfg.INPUT.SIZE_TEST = [128, 64]
    assert build_transforms(cfg, False)(img).shape == (3, 128, 64)


def test_deterministic_given_generator_seed():
    train = build_transforms(get_cfg(), True)
    img = photo()
    a = [train(img, make_rng(3, 1, i)) for i in range(8)]
    b = [train(img, make_rng(3, 1, i)) for i in range(8)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, a[0]) for x in a[1:])
    assert any(not np.array_equal(train(img, make_rng(4, 1, i)), a[i]) for i in range(8))  # another seed


def pil_bicubic_reference(img, out_h, out_w):
    """Pillow's bicubic resampling written out from its definition: separable, horizontal pass first, each
    rounded and clipped to uint8; kernel a = -0.5 stretched by the scale factor when downscaling."""
    def cubic(x):
        x = np.abs(x)
        return np.where(x < 1, (1.5 * x - 2.5) * x * x + 1, np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0))

    def weights(n_in, n_out):
        scale = n_in / n_out
        stretch = max(scale, 1.0)
        mat = np.zeros((n_out, n_in))
        for i in range(n_out):
            center = (i + 0.5) * scale
            lo, hi = max(int(center - 2 * stretch + 0.5), 0), min(int(center + 2 * stretch + 0.5), n_in)
            w = cubic((np.arange(lo, hi) - center + 0.5) / stretch)
            mat[i, lo:hi] = w / w.sum()
        return mat

    def to_uint8(x):
        return np.clip(np.rint(x), 0, 255)

    rows = to_uint8(np.einsum("ox,hxc->hoc", weights(img.shape[1], out_w), img.astype(np.float64)))
    return to_uint8(np.einsum("oy,ywc->owc", weights(img.shape[0], out_h), rows)).astype(np.uint8)


@pytest.mark.parametrize("in_hw, out_hw", [((400, 170), (256, 128)), ((131, 57), (64, 32)),   # downscaling
                                           ((128, 64), (256, 128)), ((100, 47), (256, 128)),   # upscaling
                                           ((300, 60), (256, 128))])                           # mixed
def test_resize_matches_pillow_bicubic_within_one_grey_level(in_hw, out_hw):
    rs = np.random.RandomState(in_hw[0])
    img = np.clip(photo(*in_hw).astype(int) + rs.randint(-60, 61, in_hw + (3,)), 0, 255).astype(np.uint8)
    ours = resize(img, out_hw)
    assert ours.shape == out_hw + (3,) and ours.dtype == np.uint8
    reference = pil_bicubic_reference(img, *out_hw)
    assert np.abs(ours.astype(int) - reference).max() <= 1
    pil = np.asarray(Image.fromarray(img).resize(out_hw[::-1], Image.BICUBIC))
    assert np.abs(ours.astype(int) - pil).max() <= 1
    # OpenCV's bicubic (no antialiasing, a = -0.75) is measurably different: the test can tell them apart
    cv = cv2.resize(img, out_hw[::-1], interpolation=cv2.INTER_CUBIC)
    assert np.abs(cv.astype(int) - reference).max() > 1


def test_all_augmentations_off_is_deterministic_bicubic_resize():
    train = build_transforms(plain_cfg(), True)
    assert not train.is_random
    img = photo()
    expected = resize(img, (256, 128)).transpose(2, 0, 1).astype(np.float32)
    assert np.abs(expected - pil_bicubic_reference(img, 256, 128).transpose(2, 0, 1)).max() <= 1
    np.testing.assert_array_equal(train(img), expected)
    np.testing.assert_array_equal(train(img, make_rng(1)), expected)
    np.testing.assert_array_equal(build_transforms(get_cfg(), False)(img), expected)
    assert resize(img, img.shape[:2]) is img


def test_flip_with_probability_one_mirrors_width():
    img = photo(256, 128)
    flipped = build_transforms(plain_cfg(**{"FLIP.ENABLED": True, "FLIP.PROB": 1.0}), True)(img, make_rng(0))
    np.testing.assert_array_equal(flipped, img[:, ::-1].transpose(2, 0, 1).astype(np.float32))


def test_pad_and_crop_keep_content_aligned_at_the_offset():
    # pixel (r, c) holds (r, c + 100, 255): any content pixel of a crop tells where the crop was taken
    rows, cols = np.mgrid[0:256, 0:128]
    img = np.stack([rows, cols + 100, np.full_like(rows, 255)], -1).astype(np.uint8)
    padded = pad(img, 10)
    assert padded.shape == (276, 148, 3) and not padded[:10].any() and not padded[:, -10:].any()
    train = build_transforms(plain_cfg(**{"PADDING.ENABLED": True}), True)
    offsets = set()
    for i in range(60):
        out = train(img, make_rng(7, i)).transpose(1, 2, 0).astype(np.uint8)
        pi, pj = [int(v[0]) for v in np.nonzero(out[..., 2] == 255)]
        top, left = 10 + int(out[pi, pj, 0]) - pi, 10 + int(out[pi, pj, 1]) - 100 - pj
        np.testing.assert_array_equal(out, padded[top:top + 256, left:left + 128])
        offsets.add((top, left))
    tops, lefts = zip(*offsets)
    assert min(tops) <= 2 and max(tops) >= 18 and min(lefts) <= 2 and max(lefts) >= 18  # uniform over 0..20
    with pytest.raises(UserError, match="crop"):
        random_crop(img, (300, 128), make_rng(0))


def test_color_jitter_zero_strength_is_identity_and_factors_follow_torchvision():
    img = photo()
    assert ColorJitter(0, 0, 0, 0)(img, make_rng(0)) is img
    cfg = plain_cfg(**{"CJ.ENABLED": True, "CJ.PROB": 1.0, "CJ.BRIGHTNESS": 0.0, "CJ.CONTRAST": 0.0,
                       "CJ.SATURATION": 0.0, "CJ.HUE": 0.0})
    no_jitter = build_transforms(plain_cfg(), True)(img)
    np.testing.assert_array_equal(build_transforms(cfg, True)(img, make_rng(0)), no_jitter)
    jitter = ColorJitter(0.15, 0.15, 0.1, 0.1)
    orders = set()
    for seed in range(30):
        order, (b, c, s, h) = jitter.params(make_rng(seed))
        assert sorted(order) == [0, 1, 2, 3]
        orders.add(tuple(order))
        assert 0.85 <= b <= 1.15 and 0.85 <= c <= 1.15 and 0.9 <= s <= 1.1 and -0.1 <= h <= 0.1
    assert len(orders) > 5  # the order of the four adjustments is random
    f = img.astype(np.float32)
    np.testing.assert_allclose(adjust_brightness(f, 0.5), f * 0.5)
    for fn in (adjust_brightness, adjust_contrast, adjust_saturation):
        np.testing.assert_allclose(fn(f, 1.0), f, atol=1e-4)
    assert np.abs(adjust_hue(f, 0.0) - f).max() < 0.01
    gray = adjust_saturation(f, 0.0)
    assert np.allclose(gray[..., 0], gray[..., 1], atol=1e-3) and np.allclose(gray[..., 1], gray[..., 2], atol=1e-3)
    # a half turn of hue maps pure red to cyan
    red = np.zeros((2, 2, 3), np.float32)
    red[..., 0] = 255
    np.testing.assert_allclose(adjust_hue(red, 0.5), np.broadcast_to([0, 255, 255], (2, 2, 3)), atol=1e-2)


def test_cast_jitter_scales_channels_by_gains_of_geometric_mean_one():
    img = photo()
    assert CastJitter(0.0)(img, make_rng(0)) is img
    jitter = CastJitter(0.2)
    logs = np.array([np.log(jitter.gains(make_rng(seed))) for seed in range(400)])
    np.testing.assert_allclose(logs.sum(axis=1), 0.0, atol=1e-5)          # only the cast changes, not the level
    assert 0.15 < logs.std(axis=0).mean() < 0.2                            # std * sqrt(2/3) after centring
    assert np.all(np.abs(logs[:, 0] - logs[:, 1]) > 0) and len(set(np.round(logs[:, 0], 6))) > 300
    gains = jitter.gains(make_rng(7))
    out = jitter(img, make_rng(7))
    np.testing.assert_array_equal(out, np.clip(np.rint(img.astype(np.float32) * gains), 0, 255).astype(np.uint8))
    cfg = plain_cfg(**{"CAST.ENABLED": True, "CAST.PROB": 1.0, "CAST.STD": 0.2})
    pipeline = build_transforms(cfg, True)
    assert "cast_jitter" in repr(pipeline)
    np.testing.assert_array_equal(pipeline(img, make_rng(3)), pipeline(img, make_rng(3)))
    assert not np.array_equal(pipeline(img, make_rng(3)), build_transforms(plain_cfg(), True)(img))
    assert "cast_jitter" not in repr(build_transforms(plain_cfg(**{"CAST.PROB": 1.0}), True))   # off by default
    with pytest.raises(UserError, match="CAST.STD"):
        CastJitter(-0.1)


def test_random_erasing_fills_one_rectangle_within_the_configured_area():
    scale, ratio, value = (0.1, 0.2), (0.5, 2.0), (1.0, 2.0, 3.0)
    erase = RandomErasing(p=1.0, value=value, scale=scale, ratio=ratio)
    for seed in range(40):
        out = erase(np.zeros((3, 64, 32), np.float32), make_rng(seed))
        rows, cols = np.nonzero(out[0])
        top, left, h, w = rows.min(), cols.min(), rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
        assert len(rows) == h * w  # a filled rectangle
        for c in range(3):
            assert np.all(out[c, top:top + h, left:left + w] == value[c])
        area = 64 * 32
        assert scale[0] * area - (h + w) <= h * w <= scale[1] * area + (h + w)   # up to rounding of h and w
        assert ratio[0] * (w - 1) / (w + 1) <= h / w <= ratio[1] * (w + 1) / (w - 1)
    untouched = np.zeros((3, 64, 32), np.float32)
    assert RandomErasing(p=0.0)(untouched, make_rng(0)) is untouched
    cfg = plain_cfg(**{"REA.ENABLED": True, "REA.PROB": 1.0})
    out = build_transforms(cfg, True)(photo(256, 128), make_rng(5))
    filled = np.all(out == np.array(cfg.INPUT.REA.VALUE, np.float32).reshape(3, 1, 1), axis=0)
    assert 0.02 * 256 * 128 * 0.8 <= filled.sum() <= 0.33 * 256 * 128 * 1.2


# ------------------------------------------------------------------------------------------- AutoAugment
def test_autoaugment_ops_on_a_known_tiny_image():
    tiny = np.array([[[0, 64, 127], [128, 200, 255]]], np.uint8)                 # 1 x 2 x 3
    np.testing.assert_array_equal(A.invert(tiny), [[[255, 191, 128], [127, 55, 0]]])
    np.testing.assert_array_equal(A.solarize(tiny, 128), [[[0, 64, 127], [127, 55, 0]]])   # >= 128 inverted
    np.testing.assert_array_equal(A.solarize(tiny, 256), tiny)                               # level 0: no-op
    np.testing.assert_array_equal(A.posterize(tiny, 4), [[[0, 64, 112], [128, 192, 240]]])  # keep 4 MSBs
    np.testing.assert_array_equal(A.posterize(tiny, 8), tiny)
    rng = make_rng(0)
    np.testing.assert_array_equal(A.apply_op("Posterize", tiny, 8, rng), A.posterize(tiny, 7))  # 4 + int(3.2)
    np.testing.assert_array_equal(A.apply_op("Solarize", tiny, 5, rng), A.solarize(tiny, 128))
    # a single-sub-policy AutoAugment applies both ops in order
    aug = A.AutoAugment(((("Invert", 1.0, 0), ("Solarize", 1.0, 5)),))
    np.testing.assert_array_equal(aug(tiny, rng), A.solarize(A.invert(tiny), 128))
    assert len(A.IMAGENET_POLICY) == 25 and all(len(sp) == 2 for sp in A.IMAGENET_POLICY)


@pytest.mark.parametrize("name", ["equalize", "auto_contrast", "invert", "color", "contrast", "brightness",
                                  "sharpness", "solarize", "posterize"])
def test_autoaugment_pixel_ops_match_pil_exactly(name):
    pil_ops = {"equalize": ImageOps.equalize, "auto_contrast": ImageOps.autocontrast, "invert": ImageOps.invert,
               "color": lambda p, f: ImageEnhance.Color(p).enhance(f),
               "contrast": lambda p, f: ImageEnhance.Contrast(p).enhance(f),
               "brightness": lambda p, f: ImageEnhance.Brightness(p).enhance(f),
               "sharpness": lambda p, f: ImageEnhance.Sharpness(p).enhance(f),
               "solarize": ImageOps.solarize, "posterize": ImageOps.posterize}
    args = {"color": [0.1, 1.4, 1.9], "contrast": [0.1, 1.4, 1.9], "brightness": [0.1, 1.4, 1.9],
            "sharpness": [0.1, 1.4, 1.9], "solarize": [0, 77, 128, 256], "posterize": [4, 6, 7]}.get(name, [None])
    images = [photo(31, 17, seed=1), np.random.RandomState(2).randint(0, 256, (20, 9, 3)).astype(np.uint8),
              (photo(12, 30) // 3 + 70).astype(np.uint8)]
    for img in images:
        for arg in args:
            ours = getattr(A, name)(img) if arg is None else getattr(A, name)(img, arg)
            pil = pil_ops[name](Image.fromarray(img)) if arg is None else pil_ops[name](Image.fromarray(img), arg)
            np.testing.assert_array_equal(ours, np.asarray(pil), err_msg="%s(%s)" % (name, arg))


def test_autoaugment_geometric_ops_follow_pil_conventions():
    img = photo(64, 48, seed=3)
    pil = Image.fromarray(img)
    kw = dict(resample=Image.BILINEAR, fillcolor=A.FILL)
    cases = [(A.rotate(img, 25.0), pil.rotate(25.0, **kw)),
             (A.rotate(img, -12.0), pil.rotate(-12.0, **kw)),
             (A.shear_x(img, 0.3), pil.transform(pil.size, Image.AFFINE, (1, 0.3, 0, 0, 1, 0), **kw)),
             (A.shear_y(img, -0.2), pil.transform(pil.size, Image.AFFINE, (1, 0, 0, -0.2, 1, 0), **kw)),
             (A.translate_x(img, -9.5), pil.transform(pil.size, Image.AFFINE, (1, 0, -9.5, 0, 1, 0), **kw))]
    for ours, theirs in cases:
        diff = np.abs(ours.astype(int) - np.asarray(theirs).astype(int))
        assert diff.mean() < 1.5, diff.mean()  # same geometry; only OpenCV's fixed-point interpolation differs
    # integer translation is exact: content moves, the border gets the fill colour
    moved = A.translate_y(img, 5)
    np.testing.assert_array_equal(moved[:-5], img[5:])
    assert np.all(moved[-5:] == A.FILL)


def test_autoaugment_is_reproducible_and_changes_images():
    aug = A.AutoAugment()
    img = photo(40, 20)
    outs = [aug(img, make_rng(9, i)) for i in range(40)]
    assert all(np.array_equal(o, aug(img, make_rng(9, i))) for i, o in enumerate(outs))
    assert all(o.shape == img.shape and o.dtype == np.uint8 for o in outs)
    assert sum(not np.array_equal(o, img) for o in outs) > 20


def test_bad_input_raises_user_error():
    train, test = build_transforms(get_cfg(), True), build_transforms(get_cfg(), False)
    with pytest.raises(UserError, match="uint8"):
        test(photo().astype(np.float32))
    with pytest.raises(UserError, match="HxWx3"):
        test(photo()[..., 0])
    with pytest.raises(UserError, match="Generator"):
        train(photo())
    cfg = get_cfg()
    cfg.INPUT.SIZE_TRAIN = [256]
    with pytest.raises(UserError, match="SIZE_TRAIN"):
        build_transforms(cfg, True)
