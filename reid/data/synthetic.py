"""Built-in synthetic multi-domain person re-ID data in the Market-1501 layout (numpy + OpenCV only).

Why: ACL is a domain-generalisation method, so a demo needs several *domains* that share the task (same kind
of people, same labels structure) but differ in the ways real re-ID datasets differ, and it must run without
downloading anything. ``python -m reid.data.synthetic --out DIR`` (or ``ensure_synthetic(DIR)``) writes::

    DIR/SynthA/{bounding_box_train,query,bounding_box_test}/PPPP_cCsS_FFFFFF_00.jpg   + DIR/SynthA/meta.json
    DIR/SynthB/... DIR/SynthC/... DIR/SynthD/...

People: procedurally drawn figures (head, hair, torso, arms, legs, shoes, optional hat/bag) whose identity is
a set of attributes: upper/lower clothing colour drawn from palettes with realistic frequencies (black tops
and jeans are common, so many identities share their main colours), clothing pattern (plain / stripes /
checks / chest logo / open jacket), sleeve and leg-wear type, body proportions, skin, hair colour and length,
shoes, bag type. Some cues depend on the viewpoint like in real data: a logo or an open jacket is visible only
from the front, a backpack only from the back (straps from the front, a bump from the side).

Images: each identity appears in 2-4 cameras of its domain, as short tracks (consecutive frames: same walking
direction and distance, changing walking phase, box jitter); some images are partly occluded (pole, low
object, another pedestrian). Test identities get one query per camera; the rest plus distractors (pid 0:
other people and bad crops) form the gallery, with a few junk boxes (pid -1) as in Market-1501.

Domains differ the way real datasets do (one style per domain, plus a smaller per-camera spread inside it):

========  ==========================================  ======================================================
domain    resembles                                   differences
========  ==========================================  ======================================================
SynthA    Market-1501: summer street, sunny           fixed 128x64 boxes, warm cast, bright, sharp, light
                                                      clothes and shorts, 6 cameras, street/plaza scenes
SynthB    DukeMTMC: winter campus, overcast           tall narrow boxes, bluish cast, flat contrast, dark
                                                      coats, grass/street scenes, more occlusion, 8 cameras
SynthC    CUHK03: indoor corridors, fluorescent       green cast, low resolution (down/up-scaled), strong
                                                      JPEG artefacts, mostly front/back views, 4 cameras
SynthD    MSMT17: night and mixed scenes, sodium      dark, high gamma, orange cast, heavy sensor noise,
          lamps                                       small varied boxes, mostly side views, 5 cameras
========  ==========================================  ======================================================

Determinism: every random choice comes from ``np.random.Generator(PCG64)`` seeded by a key such as
(seed, domain, 'image', entity, image index), so the output does not depend on generation order or on the
number of worker processes; OpenCV runs single-threaded and JPEG quality is fixed per domain. The same seed
gives byte-identical files with the same numpy/OpenCV versions.
"""
import argparse
import bisect
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from reid.errors import UserError

GENERATOR_VERSION = 1
SYNTHETIC_DOMAINS = ("SynthA", "SynthB", "SynthC", "SynthD")
SPLIT_DIRS = ("bounding_box_train", "query", "bounding_box_test")
MAX_IDS = 2000   # keeps pids at 4 digits and frame numbers below 10^6 per (camera, sequence)

# stream kinds: the first keys after (seed, domain) of every random stream
_K_PLAN, _K_CAMERA, _K_ENTITY, _K_TRACK, _K_IMAGE = 1, 2, 3, 4, 5
# entity kinds: identities, distractors (pid 0), junk (pid -1)
_E_PERSON, _E_DISTRACTOR, _E_JUNK = 0, 1, 2


def _stream(*keys):
    """An independent random stream for one key tuple (order-free determinism)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in keys])))


# ------------------------------------------------------------------------------------------- domain styles
class DomainStyle(object):
    """How one domain looks; see the module docstring for the intent of each setting."""

    def __init__(self, name, cameras, size, size_jitter, scenes, season, views, gain, gamma, cast,
                 camera_spread, blur, noise, downscale, jpeg_quality, occlusion, palette):
        self.name = name
        self.cameras = cameras                # number of cameras (1..9: the name pattern has one digit)
        self.size = size                      # native (H, W) of a box
        self.size_jitter = size_jitter        # log-std of the per-image box size (0: fixed like Market)
        self.scenes = scenes                  # background kinds the cameras choose from
        self.season = season                  # clothing distribution: 'summer' | 'winter' | 'mixed'
        self.views = views                    # base probabilities of (front, back, side)
        self.gain = gain                      # illumination level
        self.gamma = gamma                    # tone curve exponent (>1 darkens mid-tones)
        self.cast = cast                      # RGB white-balance gains
        self.camera_spread = camera_spread    # log-std of per-camera gain (and half of it for the cast)
        self.blur = blur                      # Gaussian sigma in pixels at native size
        self.noise = noise                    # sensor noise std in 0..255 units
        self.downscale = downscale            # rendered box is shrunk by this factor then enlarged
        self.jpeg_quality = jpeg_quality
        self.occlusion = occlusion            # probability that a track is partly occluded
        self.palette = palette                # background colour family: 'bright' | 'campus' | 'indoor' | 'night'


STYLES = (
    DomainStyle("SynthA", 6, (128, 64), 0.0, ("street", "plaza"), "summer", (0.40, 0.35, 0.25),
                gain=1.08, gamma=0.9, cast=(1.06, 1.0, 0.90), camera_spread=0.10, blur=0.35, noise=3.0,
                downscale=1.0, jpeg_quality=92, occlusion=0.10, palette="bright"),
    DomainStyle("SynthB", 8, (144, 56), 0.18, ("grass", "street"), "winter", (0.30, 0.30, 0.40),
                gain=0.92, gamma=1.12, cast=(0.90, 0.99, 1.12), camera_spread=0.12, blur=0.8, noise=4.0,
                downscale=1.25, jpeg_quality=85, occlusion=0.22, palette="campus"),
    DomainStyle("SynthC", 4, (160, 64), 0.15, ("indoor",), "mixed", (0.50, 0.45, 0.05),
                gain=1.0, gamma=1.0, cast=(0.94, 1.08, 0.93), camera_spread=0.16, blur=1.0, noise=2.5,
                downscale=1.9, jpeg_quality=68, occlusion=0.06, palette="indoor"),
    DomainStyle("SynthD", 5, (112, 48), 0.28, ("street", "indoor", "plaza"), "mixed", (0.22, 0.23, 0.55),
                gain=0.8, gamma=1.2, cast=(1.15, 1.0, 0.78), camera_spread=0.20, blur=0.6, noise=6.0,
                downscale=1.35, jpeg_quality=80, occlusion=0.15, palette="night"),
)
_STYLE_BY_NAME = dict((s.name, s) for s in STYLES)

# ------------------------------------------------------------------------------------------- palettes
# (rgb, weight in summer, weight in winter): weights follow rough street frequencies, so common colours repeat
UPPER_COLOURS = (
    ((28, 28, 30), 14, 26), ((232, 232, 226), 16, 6), ((128, 128, 126), 9, 11), ((62, 62, 66), 5, 12),
    ((32, 42, 86), 7, 10), ((46, 92, 170), 7, 4), ((140, 182, 222), 5, 2), ((182, 32, 38), 6, 4),
    ((232, 152, 176), 4, 2), ((44, 118, 62), 4, 3), ((104, 106, 52), 2, 4), ((230, 200, 62), 4, 1),
    ((228, 118, 40), 3, 1), ((108, 58, 138), 2, 2), ((108, 72, 44), 2, 6), ((212, 192, 152), 5, 5),
)
LOWER_COLOURS = (
    ((30, 30, 32), 28, 34), ((56, 78, 124), 22, 22), ((110, 140, 180), 8, 4), ((66, 66, 70), 8, 12),
    ((128, 128, 128), 6, 8), ((176, 156, 112), 8, 6), ((214, 200, 170), 4, 2), ((230, 230, 228), 5, 1),
    ((96, 66, 44), 3, 6), ((34, 40, 76), 4, 6), ((170, 40, 44), 1, 0.5), ((90, 96, 52), 1, 1),
)
SKIN = (((234, 192, 162), 3), ((212, 162, 122), 4), ((178, 122, 86), 3), ((124, 82, 56), 1.5), ((88, 58, 40), 1))
HAIR = (((20, 18, 18), 55), ((56, 38, 28), 20), ((102, 68, 40), 10), ((204, 172, 112), 7), ((152, 150, 148), 5),
        ((142, 50, 40), 3))
SHOES = (((24, 24, 26), 40), ((236, 236, 236), 28), ((110, 70, 40), 10), ((120, 120, 124), 10), ((40, 70, 150), 4),
         ((190, 40, 40), 3), ((200, 180, 140), 5))
BAGS = (((22, 22, 24), 50), ((90, 90, 94), 12), ((104, 70, 42), 12), ((34, 44, 90), 10), ((170, 36, 40), 5),
        ((206, 186, 146), 6), ((60, 100, 60), 5))
PATTERNS = (("plain", 50), ("stripes", 15), ("checks", 9), ("logo", 16), ("jacket", 10))
BAG_TYPES = (("none", 48), ("backpack", 26), ("shoulder", 16), ("handbag", 10))

# background colour families per palette: (facade/wall colours, ground colours, accent colours)
SCENE_COLOURS = {
    "bright": (((226, 214, 190), (190, 196, 204), (200, 120, 96), (236, 236, 232), (170, 180, 150)),
               ((128, 126, 122), (160, 150, 136), (112, 112, 116)),
               ((200, 40, 40), (40, 110, 200), (240, 200, 40), (40, 150, 80))),
    "campus": (((150, 150, 156), (120, 96, 84), (176, 170, 160), (90, 100, 110)),
               ((88, 112, 70), (110, 108, 104), (70, 92, 60)),
               ((60, 80, 120), (120, 40, 40), (200, 200, 200))),
    "indoor": (((214, 210, 196), (196, 204, 210), (220, 214, 170), (180, 186, 178)),
               ((150, 146, 140), (178, 170, 156), (120, 124, 130)),
               ((130, 90, 60), (90, 120, 150), (200, 60, 50))),
    "night": (((70, 64, 60), (54, 58, 70), (96, 84, 70), (40, 40, 46)),
              ((60, 58, 56), (78, 72, 66), (44, 46, 50)),
              ((250, 200, 90), (220, 60, 60), (90, 200, 250))),
}


_CUMULATIVE = {}


def _choose(rng, weights):
    """Index drawn with the given weights (bisect on cached cumulative sums: rng.choice(p=) is slow)."""
    key = tuple(weights)
    cum = _CUMULATIVE.get(key)
    if cum is None:
        total = float(sum(weights))
        acc, cum = 0.0, []
        for wgt in weights:
            acc += wgt / total
            cum.append(acc)
        cum[-1] = 1.0
        _CUMULATIVE[key] = cum
    return min(bisect.bisect_right(cum, rng.random()), len(cum) - 1)


def _pick(rng, table):
    return table[_choose(rng, [row[1] for row in table])][0]


def _pick_season(rng, table, season):
    if season == "summer":
        weights = [row[1] for row in table]
    elif season == "winter":
        weights = [row[2] for row in table]
    else:
        s1, s2 = float(sum(row[1] for row in table)), float(sum(row[2] for row in table))
        weights = [row[1] / s1 + row[2] / s2 for row in table]
    return table[_choose(rng, weights)][0]


def _jitter_colour(rng, rgb, spread=9.0):
    """The same named colour varies a little between people (fabric, dye)."""
    k = math.exp(rng.normal(0.0, 0.07))
    e = rng.normal(0.0, spread, 3)
    return tuple(min(255.0, max(0.0, c * k + float(n))) for c, n in zip(rgb, e))


def make_person(rng, season):
    """Identity attributes: everything that stays the same for one person across cameras."""
    a = {}
    a["upper"] = _jitter_colour(rng, _pick_season(rng, UPPER_COLOURS, season))
    a["lower"] = _jitter_colour(rng, _pick_season(rng, LOWER_COLOURS, season))
    second = a["upper"]
    while np.abs(np.subtract(second, a["upper"])).sum() < 120:   # a pattern must be visible
        second = _jitter_colour(rng, _pick_season(rng, UPPER_COLOURS, "summer"))
    a["second"] = second
    a["pattern"] = _pick(rng, PATTERNS)
    a["period"] = float(rng.uniform(0.035, 0.075))
    a["logo"] = int(rng.integers(3))
    a["logo_size"] = float(rng.uniform(0.035, 0.06))
    short_p, shorts_p, skirt_p = {"summer": (0.6, 0.3, 0.1), "winter": (0.06, 0.02, 0.06)}.get(season, (0.3, 0.14, 0.08))
    a["short_sleeves"] = bool(rng.random() < short_p)
    r = rng.random()
    a["legwear"] = "shorts" if r < shorts_p else ("skirt" if r < shorts_p + skirt_p else "trousers")
    a["skin"] = _jitter_colour(rng, _pick(rng, SKIN), 5.0)
    a["hair"] = _jitter_colour(rng, _pick(rng, HAIR), 5.0)
    a["long_hair"] = bool(rng.random() < 0.35)
    a["hat"] = _jitter_colour(rng, _pick_season(rng, UPPER_COLOURS, season)) if rng.random() < 0.08 else None
    a["shoes"] = _jitter_colour(rng, _pick(rng, SHOES), 6.0)
    a["bag"] = _pick(rng, BAG_TYPES)
    a["bag_colour"] = _jitter_colour(rng, _pick(rng, BAGS), 6.0)
    a["build"] = float(rng.uniform(0.85, 1.2))
    a["leg"] = float(rng.uniform(0.44, 0.52))
    a["head"] = float(rng.uniform(0.9, 1.12))
    return a


# ------------------------------------------------------------------------------------------- drawing
def _p(x, y):
    return (int(round(x * 16)), int(round(y * 16)))   # 4-bit sub-pixel coordinates (cv2 shift=4)


def _line(img, p, q, colour, thick):
    cv2.line(img, _p(*p), _p(*q), colour, max(1, int(round(thick))), cv2.LINE_AA, 4)


def _disc(img, c, r, colour):
    cv2.circle(img, _p(*c), max(8, int(round(r * 16))), colour, -1, cv2.LINE_AA, 4)


def _poly(img, pts, colour):
    cv2.fillConvexPoly(img, np.array([_p(x, y) for x, y in pts], np.int32), colour, cv2.LINE_AA, 4)


def _ellipse(img, c, axes, start, end, colour):
    cv2.ellipse(img, _p(*c), (max(8, int(axes[0] * 16)), max(8, int(axes[1] * 16))), 0, start, end, colour, -1,
                cv2.LINE_AA, 4)


def _shade(colour, k):
    return tuple(min(255.0, c * k) for c in colour)


def _torso_pattern(img, a, view, pts, s):
    """Clothing pattern clipped to the torso polygon; the logo and open jacket show only from the front."""
    kind = a["pattern"]
    if kind == "plain" or (kind in ("logo", "jacket") and view != "front"):
        return
    h, w = img.shape[:2]
    xs, ys = [q[0] for q in pts], [q[1] for q in pts]
    x0, x1 = max(0, int(min(xs)) - 1), min(w, int(max(xs)) + 2)
    y0, y1 = max(0, int(min(ys)) - 1), min(h, int(max(ys)) + 2)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return
    sub = img[y0:y1, x0:x1]
    layer = sub.copy()
    col = a["second"]
    period = max(2.5, a["period"] * s)
    if kind in ("stripes", "checks"):
        y = period * 0.5
        while y < y1 - y0:
            _line(layer, (0, y), (x1 - x0, y), col, max(1, period * (0.5 if kind == "stripes" else 0.3)))
            y += period
        if kind == "checks":
            x = period * 0.5
            while x < x1 - x0:
                _line(layer, (x, 0), (x, y1 - y0), col, max(1, period * 0.3))
                x += period
    elif kind == "jacket":
        cx = (x1 - x0) * 0.5
        _poly(layer, [(cx - 0.03 * s, 0), (cx + 0.03 * s, 0), (cx + 0.05 * s, y1 - y0), (cx - 0.05 * s, y1 - y0)], col)
    else:
        cx, cy, r = (x1 - x0) * 0.5, (y1 - y0) * 0.32, a["logo_size"] * s
        if a["logo"] == 0:
            _disc(layer, (cx, cy), r, col)
        elif a["logo"] == 1:
            _poly(layer, [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)], col)
        else:
            _poly(layer, [(cx, cy - r * 1.2), (cx + r * 1.2, cy + r), (cx - r * 1.2, cy + r)], col)
    mask = np.zeros(sub.shape[:2], np.uint8)
    _poly(mask, [(x - x0, y - y0) for x, y in pts], 255)
    sel = mask > 127
    sub[sel] = layer[sel]


def draw_person(img, a, view, phase, cx, top, s):
    """Draw one person of height `s` pixels, top at `top`, centred at `cx`. view: front/back/left/right."""
    side = view in ("left", "right")
    d = 1.0 if view == "right" else -1.0            # facing direction in side views
    b = a["build"]
    hr = 0.062 * s * a["head"]
    head = (cx, top + 1.05 * hr)
    sh_y = top + 2.05 * hr + 0.015 * s
    hip_y = top + s * (1.0 - a["leg"])
    foot_y = top + 0.975 * s
    sw, hw = (0.075 * s * b, 0.07 * s * b) if side else (0.125 * s * b, 0.1 * s * b)
    arm_t, leg_t = max(2.0, 0.05 * s * b), max(2.0, 0.07 * s * b)
    upper, lower, skin = a["upper"], a["lower"], a["skin"]
    far = 0.72                                        # far limbs in side views are in shadow
    sp = math.sin(phase)

    def leg(hip, foot, knee_dx, k):
        knee = ((hip[0] + foot[0]) * 0.5 + knee_dx, (hip[1] + foot[1]) * 0.5)
        wear = a["legwear"]
        if wear == "trousers":
            _line(img, hip, knee, _shade(lower, k), leg_t)
            _line(img, knee, foot, _shade(lower, k), leg_t * 0.9)
        else:
            _line(img, hip, knee, _shade(skin, k), leg_t * 0.8)
            _line(img, knee, foot, _shade(skin, k), leg_t * 0.7)
            if wear == "shorts":
                end = (hip[0] + (knee[0] - hip[0]) * 0.75, hip[1] + (knee[1] - hip[1]) * 0.75)
                _line(img, hip, end, _shade(lower, k), leg_t * 1.1)
        shoe_len = 0.05 * s if side else 0.03 * s
        _ellipse(img, (foot[0] + (d * 0.02 * s if side else 0.0), foot[1]), (shoe_len, 0.018 * s), 0, 360,
                 _shade(a["shoes"], k))

    def arm(shoulder, theta, k, sgn):
        if side:
            elbow = (shoulder[0] + d * 0.16 * s * math.sin(theta), shoulder[1] + 0.16 * s * math.cos(theta))
            t2 = theta + 0.35
            hand = (elbow[0] + d * 0.15 * s * math.sin(t2), elbow[1] + 0.15 * s * math.cos(t2))
        else:
            fs = 1.0 - 0.1 * abs(theta)                   # foreshortening of a swinging arm seen from the front
            elbow = (shoulder[0] + sgn * 0.02 * s, shoulder[1] + 0.16 * s * fs)
            hand = (shoulder[0] + sgn * 0.03 * s, shoulder[1] + 0.31 * s * fs)
        if a["short_sleeves"]:
            _line(img, shoulder, elbow, _shade(skin, k), arm_t * 0.85)
            _line(img, elbow, hand, _shade(skin, k), arm_t * 0.8)
            mid = (shoulder[0] + (elbow[0] - shoulder[0]) * 0.55, shoulder[1] + (elbow[1] - shoulder[1]) * 0.55)
            _line(img, shoulder, mid, _shade(upper, k), arm_t * 1.1)
        else:
            _line(img, shoulder, elbow, _shade(upper, k), arm_t)
            _line(img, elbow, hand, _shade(upper, k), arm_t * 0.9)
        _disc(img, hand, arm_t * 0.55, _shade(skin, k))
        return hand

    def backpack_side():
        x_in, x_out = cx - d * sw * 0.6, cx - d * (sw + 0.08 * s)
        _poly(img, [(x_in, sh_y + 0.02 * s), (x_out, sh_y + 0.04 * s), (x_out, sh_y + 0.25 * s),
                    (x_in, sh_y + 0.27 * s)], a["bag_colour"])

    # --- far side first
    hands = []
    if side:
        hands.append(arm((cx, sh_y + 0.5 * arm_t), 0.45 * sp, far, 1))
        if a["bag"] == "backpack":
            backpack_side()
        stride = 0.15 * s * sp
        leg((cx, hip_y), (cx - d * stride, foot_y), d * 0.02 * s * abs(sp), far)
        leg((cx, hip_y), (cx + d * stride, foot_y), d * 0.02 * s * abs(sp), 1.0)
    else:
        if a["long_hair"] and view == "front":
            _poly(img, [(cx - hr * 1.1, head[1]), (cx + hr * 1.1, head[1]), (cx + hr * 1.2, sh_y + 0.06 * s),
                        (cx - hr * 1.2, sh_y + 0.06 * s)], a["hair"])
        lift = 0.025 * s
        leg((cx - 0.5 * hw, hip_y), (cx - 0.55 * hw - 0.01 * s, foot_y - lift * max(0.0, sp)), -0.005 * s, 1.0)
        leg((cx + 0.5 * hw, hip_y), (cx + 0.55 * hw + 0.01 * s, foot_y - lift * max(0.0, -sp)), 0.005 * s, 1.0)
    # hips / skirt
    if a["legwear"] == "skirt":
        _poly(img, [(cx - hw * 1.05, hip_y - 0.01 * s), (cx + hw * 1.05, hip_y - 0.01 * s),
                    (cx + hw * 1.5, hip_y + 0.2 * s), (cx - hw * 1.5, hip_y + 0.2 * s)], lower)
    else:
        _poly(img, [(cx - hw, hip_y - 0.01 * s), (cx + hw, hip_y - 0.01 * s), (cx + hw * 0.9, hip_y + 0.07 * s),
                    (cx - hw * 0.9, hip_y + 0.07 * s)], lower)
    # torso
    torso = [(cx - sw, sh_y), (cx + sw, sh_y), (cx + hw, hip_y + 0.01 * s), (cx - hw, hip_y + 0.01 * s)]
    _poly(img, torso, upper)
    _disc(img, (cx - sw + 0.3 * arm_t, sh_y + 0.45 * arm_t), 0.5 * arm_t, upper)
    _disc(img, (cx + sw - 0.3 * arm_t, sh_y + 0.45 * arm_t), 0.5 * arm_t, upper)
    _torso_pattern(img, a, view, torso, s)
    # near arm(s)
    if side:
        hands.append(arm((cx, sh_y + 0.5 * arm_t), -0.45 * sp, 1.0, 1))
    else:
        hands.append(arm((cx - sw + 0.3 * arm_t, sh_y + 0.5 * arm_t), sp, 1.0, -1))
        hands.append(arm((cx + sw - 0.3 * arm_t, sh_y + 0.5 * arm_t), -sp, 1.0, 1))
    # neck, head, hair
    _line(img, (cx, sh_y), (cx, head[1] + 0.5 * hr), skin, max(1.0, 0.8 * hr))
    if view == "back":
        _disc(img, head, hr, a["hair"])
        if a["long_hair"]:
            _poly(img, [(cx - hr * 1.05, head[1]), (cx + hr * 1.05, head[1]), (cx + hr * 1.15, sh_y + 0.08 * s),
                        (cx - hr * 1.15, sh_y + 0.08 * s)], a["hair"])
    else:
        _disc(img, head, hr, skin)
        if side:
            start, end = (100, 340) if d > 0 else (-160, 80)
            _ellipse(img, head, (hr * 1.06, hr * 1.06), start, end, a["hair"])
            if a["long_hair"]:
                _line(img, (cx - d * hr * 0.7, head[1]), (cx - d * hr * 0.8, sh_y + 0.06 * s), a["hair"], hr * 0.8)
        else:
            _ellipse(img, (head[0], head[1] - 0.1 * hr), (hr * 1.06, hr * 0.95), 180, 360, a["hair"])
    if a["hat"] is not None:
        _ellipse(img, (head[0], head[1] - 0.25 * hr), (hr * 1.05, hr * 0.9), 180, 360, a["hat"])
        _line(img, (cx - hr * 1.1 + (d * 0.4 * hr if side else 0), head[1] - 0.25 * hr),
              (cx + hr * 1.1 + (d * 0.6 * hr if side else 0), head[1] - 0.25 * hr), a["hat"], max(1.0, 0.2 * hr))
    # bags
    bag, bc = a["bag"], a["bag_colour"]
    if bag == "backpack":
        if view == "back":
            _poly(img, [(cx - 0.8 * sw, sh_y + 0.03 * s), (cx + 0.8 * sw, sh_y + 0.03 * s),
                        (cx + 0.85 * sw, sh_y + 0.27 * s), (cx - 0.85 * sw, sh_y + 0.27 * s)], bc)
        elif view == "front":
            for sgn in (-1, 1):
                _line(img, (cx + sgn * 0.6 * sw, sh_y), (cx + sgn * 0.7 * sw, sh_y + 0.2 * s), bc, max(1, 0.02 * s))
    elif bag == "shoulder":
        sgn = 1.0 if view != "back" else -1.0
        _line(img, (cx + sgn * 0.7 * sw, sh_y), (cx - sgn * hw, hip_y - 0.02 * s), bc, max(1, 0.015 * s))
        bx = cx - sgn * (hw + 0.03 * s) if not side else cx - d * 0.02 * s
        _poly(img, [(bx - 0.06 * s, hip_y - 0.06 * s), (bx + 0.06 * s, hip_y - 0.06 * s),
                    (bx + 0.06 * s, hip_y + 0.04 * s), (bx - 0.06 * s, hip_y + 0.04 * s)], bc)
    elif bag == "handbag":
        hx, hy = hands[-1]
        _poly(img, [(hx - 0.045 * s, hy), (hx + 0.045 * s, hy), (hx + 0.05 * s, hy + 0.09 * s),
                    (hx - 0.05 * s, hy + 0.09 * s)], bc)


# ------------------------------------------------------------------------------------------- backgrounds
def _make_background(rng, kind, palette, h, w):
    """One camera scene of size (h, w): kind in street/plaza/grass/indoor, colours from the domain palette."""
    walls, grounds, accents = SCENE_COLOURS[palette]
    img = np.empty((h, w, 3), np.uint8)
    horizon = int(h * rng.uniform(0.35, 0.6))
    wall = walls[int(rng.integers(len(walls)))]
    ground = grounds[int(rng.integers(len(grounds)))]
    accent = accents[int(rng.integers(len(accents)))]
    img[:horizon] = wall
    img[horizon:] = ground
    if kind == "street":
        cell = int(rng.integers(10, 22))
        for y in range(int(rng.integers(2, 8)), horizon - 6, cell):
            for x in range(int(rng.integers(0, 8)), w - 4, cell):
                if rng.random() < 0.75:
                    tint = (80, 96, 120) if rng.random() < 0.7 else accent
                    cv2.rectangle(img, (x, y), (x + cell // 2, y + cell // 2 + 2), _shade(tint, rng.uniform(0.6, 1.1)),
                                  -1)
        if rng.random() < 0.6:
            cv2.rectangle(img, (int(rng.integers(0, w // 2)), horizon - 14), (w, horizon - 4), accent, -1)
        cv2.line(img, (0, horizon + 3), (w, horizon + 3), _shade(ground, 1.3), 2)
        for x in range(int(rng.integers(0, 30)), w, 40):
            cv2.line(img, (x, h - 20), (x + 14, h - 20), (220, 220, 210), 2)
    elif kind == "plaza":
        brick = int(rng.integers(6, 12))
        line = _shade(ground, 0.75)
        for i, y in enumerate(range(horizon, h, brick)):
            cv2.line(img, (0, y), (w, y), line, 1)
            for x in range((i % 2) * brick, w, 2 * brick):
                cv2.line(img, (x, y), (x, y + brick), line, 1)
        for _ in range(int(rng.integers(1, 4))):
            cx, cy = int(rng.integers(0, w)), int(rng.integers(max(1, horizon - 20), horizon + 5))
            cv2.ellipse(img, (cx, cy), (int(rng.integers(8, 20)), int(rng.integers(6, 14))), 0, 0, 360,
                        (50, 100, 50), -1)
    elif kind == "grass":
        for _ in range(int(rng.integers(3, 8))):
            cx, cy = int(rng.integers(0, w)), int(rng.integers(0, horizon))
            cv2.ellipse(img, (cx, cy), (int(rng.integers(10, 30)), int(rng.integers(12, 30))), 0, 0, 360,
                        _shade((40, 80, 40), rng.uniform(0.7, 1.2)), -1)
        x0 = int(rng.integers(-w // 2, w // 2))
        pts = np.array([(x0, h), (x0 + w // 2, h), (x0 + w // 2 + 30, horizon), (x0 + 30, horizon)], np.int32)
        cv2.fillConvexPoly(img, pts, (150, 140, 120) if palette != "night" else (70, 66, 60))
    else:  # indoor corridor: wall, doors, skirting, tiled floor
        for x in range(int(rng.integers(0, 30)), w, int(rng.integers(40, 70))):
            cv2.rectangle(img, (x, max(0, horizon - int(h * 0.45))), (x + 18, horizon), _shade(accent, 0.8), -1)
        cv2.line(img, (0, horizon), (w, horizon), _shade(wall, 0.6), 2)
        tile = int(rng.integers(10, 20))
        for y in range(horizon, h, tile):
            cv2.line(img, (0, y), (w, y), _shade(ground, 0.8), 1)
        for x in range(0, w, tile):
            cv2.line(img, (x, horizon), (x + (x - w // 2) // 3, h), _shade(ground, 0.8), 1)
    # low-frequency shading and fine texture: plain flat backgrounds would be unrealistically easy to ignore
    low = cv2.resize(rng.normal(1.0, 0.12, (6, 4)).astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    out = img.astype(np.float32) * low[:, :, None] + rng.normal(0.0, 6.0, (h, w, 1)).astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------- per-domain context
class _Camera(object):
    pass


_CONTEXTS = {}


def _domain_context(seed, domain_index):
    """Cameras of one domain (scene tiles, light, cast, view preferences); cached per process."""
    key = (seed, domain_index)
    if key in _CONTEXTS:
        return _CONTEXTS[key]
    style = STYLES[domain_index]
    H, W = style.size
    cams = []
    for c in range(style.cameras):
        rng = _stream(seed, domain_index, _K_CAMERA, c)
        cam = _Camera()
        cam.gain = style.gain * math.exp(rng.normal(0.0, style.camera_spread))
        cam.cast = np.array(style.cast) * np.exp(rng.normal(0.0, style.camera_spread * 0.5, 3))
        cam.gradient = float(rng.uniform(-0.35, 0.35))     # light from above / lamp below
        views = np.array(style.views) * np.exp(rng.normal(0.0, 0.6, 3))
        cam.views = [float(x) for x in views / views.sum()]
        cam.blur = style.blur * math.exp(rng.normal(0.0, 0.25))
        kind = style.scenes[int(rng.integers(len(style.scenes)))]
        cam.tiles = [_make_background(rng, kind, style.palette, 2 * H, 3 * W) for _ in range(3)]
        cam.scale = float(rng.uniform(0.84, 0.93))          # typical person height in the box for this camera
        cams.append(cam)
    lut = np.clip(255.0 * (np.arange(256) / 255.0) ** style.gamma + 0.5, 0, 255).astype(np.uint8)
    noise_rng = _stream(seed, domain_index, _K_CAMERA, 1000)
    bank_h, bank_w = int(H * 1.6) + 48, int(W * 2.4) + 48     # larger than any box of this domain
    noise_bank = noise_rng.standard_normal((bank_h, bank_w, 3), dtype=np.float32) * np.float32(style.noise)
    ctx = (style, cams, lut, noise_bank)
    _CONTEXTS[key] = ctx
    return ctx


# ------------------------------------------------------------------------------------------- one image
_PERSONS = {}


def _person(seed, domain_index, entity, key, season):
    # a worker renders all images of an entity in a row: keep the few latest attribute sets
    k = (seed, domain_index, entity, key)
    a = _PERSONS.get(k)
    if a is None:
        if len(_PERSONS) > 64:
            _PERSONS.clear()
        a = _PERSONS[k] = make_person(_stream(seed, domain_index, _K_ENTITY, entity, key), season)
    return a


_VIEW_NAMES = ("front", "back", "side")


def _box_size(rng, style):
    H, W = style.size
    if style.size_jitter <= 0:
        return H, W
    k = math.exp(min(0.45, max(-0.5, rng.normal(0.0, style.size_jitter))))
    h = int(round(H * k))
    w = int(round(h * W / H * math.exp(rng.normal(0.0, 0.07))))
    return max(48, h), max(20, w)


def _occlude(img, rng, style, season):
    h, w = img.shape[:2]
    kind = rng.random()
    if kind < 0.35:       # pole / tree trunk in front
        x, bw = rng.uniform(0, w), rng.uniform(0.08, 0.2) * w
        col = _shade((90, 90, 92), rng.uniform(0.5, 1.4))
        cv2.rectangle(img, (int(x - bw / 2), 0), (int(x + bw / 2), h), col, -1)
    elif kind < 0.7:      # low object: car, bench, railing
        y = int(h * rng.uniform(0.6, 0.85))
        col = _jitter_colour(rng, _pick(rng, BAGS), 30.0)
        cv2.rectangle(img, (0, y), (w, h), col, -1)
        cv2.line(img, (0, y), (w, y), _shade(col, 1.4), 2)
    else:                 # another pedestrian passing at the edge
        other = make_person(rng, season)
        sgn = 1.0 if rng.random() < 0.5 else -1.0
        s = h * rng.uniform(0.85, 1.0)
        draw_person(img, other, ("front", "back", "left", "right")[int(rng.integers(4))], rng.uniform(0, 6.3),
                    w * 0.5 + sgn * w * rng.uniform(0.45, 0.65), h * 0.03, s)


def render_image(seed, domain_index, entity, key, cam, track, image_index):
    """Render one JPEG (bytes). entity: _E_PERSON / _E_DISTRACTOR / _E_JUNK; cam is 1-based."""
    style, cams, lut, noise_bank = _domain_context(seed, domain_index)
    camera = cams[cam - 1]
    person = _person(seed, domain_index, entity, key, style.season)
    tr = _stream(seed, domain_index, _K_TRACK, entity, key, cam, track)
    rng = _stream(seed, domain_index, _K_IMAGE, entity, key, image_index)
    # track: walking direction, distance, light and occluder stay similar over consecutive frames
    v = _VIEW_NAMES[_choose(tr, camera.views)]
    if v == "side":
        v = "left" if tr.random() < 0.5 else "right"
    track_scale = camera.scale * math.exp(tr.normal(0.0, 0.04))
    track_gain = camera.gain * math.exp(tr.normal(0.0, 0.07))
    phase0, speed = tr.uniform(0, 2 * math.pi), tr.uniform(0.8, 1.6)
    occluded = tr.random() < style.occlusion
    tile_index = int(tr.integers(len(camera.tiles)))
    # image: box, phase, small turns
    h, w = _box_size(rng, style)
    if rng.random() < 0.08:   # the person turns a little between frames
        v = {"front": "left", "back": "right", "left": "front", "right": "back"}[v]
    phase = phase0 + speed * image_index + rng.normal(0.0, 0.4)
    tile = camera.tiles[tile_index]
    th, tw = tile.shape[:2]
    y0, x0 = int(rng.integers(0, th - h + 1)) if th > h else 0, int(rng.integers(0, tw - w + 1)) if tw > w else 0
    img = tile[y0:y0 + h, x0:x0 + w]
    if img.shape[0] != h or img.shape[1] != w:
        img = cv2.resize(tile, (w, h), interpolation=cv2.INTER_LINEAR)
    img = np.ascontiguousarray(img)
    s = h * track_scale * math.exp(rng.normal(0.0, 0.025))
    cx = w * 0.5 + rng.normal(0.0, 0.04) * w
    top = (h - s) * rng.uniform(0.2, 0.8)
    if entity == _E_DISTRACTOR and rng.random() < 0.6:
        # bad detection: too close, cut off or off-centre
        s *= rng.uniform(1.1, 1.7)
        cx = w * 0.5 + (1.0 if rng.random() < 0.5 else -1.0) * w * rng.uniform(0.15, 0.45)
        top = -s * rng.uniform(0.0, 0.35)
    if entity == _E_JUNK:
        # junk boxes: background with at most a fragment of someone
        if rng.random() < 0.6:
            draw_person(img, person, v, phase, w * (-0.35 if rng.random() < 0.5 else 1.35), top, s)
    else:
        draw_person(img, person, v, phase, cx, top, s)
    if occluded or (entity == _E_DISTRACTOR and rng.random() < 0.2):
        _occlude(img, rng, style, style.season)
    return _finish(img, rng, style, camera, lut, noise_bank, track_gain)


def _finish(img, rng, style, camera, lut, noise_bank, gain):
    """Camera pipeline: optics blur, resolution loss, illumination + white balance, noise, gamma, JPEG."""
    h, w = img.shape[:2]
    scale = h / float(style.size[0])
    sigma = camera.blur * scale
    if sigma > 0.3:
        img = cv2.GaussianBlur(img, (0, 0), sigma)
    f = style.downscale * math.exp(rng.normal(0.0, 0.1))
    if f > 1.05:
        small = cv2.resize(img, (max(8, int(w / f)), max(16, int(h / f))), interpolation=cv2.INTER_AREA)
        img = cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)
    ramp = 1.0 + camera.gradient * np.linspace(-0.5, 0.5, h, dtype=np.float32)
    factor = (ramp[:, None] * (gain * camera.cast).astype(np.float32)[None, :])[:, None, :]
    out = img.astype(np.float32) * factor
    # sensor noise: a window of the domain's precomputed noise field (drawing fresh normals per image is slow)
    bank = noise_bank
    ny, nx = int(rng.integers(0, bank.shape[0] - h + 1)), int(rng.integers(0, bank.shape[1] - w + 1))
    out += bank[ny:ny + h, nx:nx + w]
    out = cv2.LUT(np.clip(out, 0, 255).astype(np.uint8), lut)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(out, cv2.COLOR_RGB2BGR),
                           [int(cv2.IMWRITE_JPEG_QUALITY), style.jpeg_quality])
    if not ok:
        raise RuntimeError("OpenCV could not encode a JPEG")
    return buf.tobytes()


# ------------------------------------------------------------------------------------------- split plan
def _filename(pid, cam, seq, frame):
    head = "-1" if pid < 0 else "%04d" % pid
    return "%s_c%ds%d_%06d_00.jpg" % (head, cam, seq, frame)


def plan_domain(seed, domain_index, num_ids):
    """Which images exist: list of dicts (entity, key, pid, cam, track, image_index, split, name) + counts."""
    style = STYLES[domain_index]
    rng = _stream(seed, domain_index, _K_PLAN)
    C = style.cameras
    pids = np.arange(1, num_ids + 1)
    n_train = (num_ids + 1) // 2
    train = set(int(p) for p in rng.permutation(pids)[:n_train])
    busy = rng.dirichlet(np.full(C, 4.0))            # some cameras see more people than others
    items = []
    for pid in pids:
        pid = int(pid)
        k = int(rng.integers(2, min(C, 4) + 1))
        cams = sorted(int(c) + 1 for c in rng.choice(C, size=k, replace=False, p=busy))
        n = int(rng.integers(max(5, 2 * k), 16))
        counts = 2 + rng.multinomial(n - 2 * k, np.full(k, 1.0 / k))
        index = 0
        for t, (cam, cnt) in enumerate(zip(cams, counts)):
            query_at = int(rng.integers(cnt))
            for j in range(int(cnt)):
                split = "bounding_box_train" if pid in train else ("query" if j == query_at else "bounding_box_test")
                items.append(dict(entity=_E_PERSON, key=pid, pid=pid, cam=cam, track=t, image_index=index,
                                  split=split))
                index += 1
    n_test = num_ids - n_train
    for entity, pid, count in ((_E_DISTRACTOR, 0, max(2, n_test)), (_E_JUNK, -1, max(2, n_test // 8))):
        for i in range(count):
            cam = int(rng.choice(C, p=busy)) + 1
            items.append(dict(entity=entity, key=i, pid=pid, cam=cam, track=0, image_index=0,
                              split="bounding_box_test"))
    # frame numbers: per camera, tracks in random order over 1..6 sequences; frames of a track are consecutive
    for cam in range(1, C + 1):
        tracks = {}
        for it in items:
            if it["cam"] == cam:
                tracks.setdefault((it["entity"], it["key"], it["track"]), []).append(it)
        keys = sorted(tracks)
        order = rng.permutation(len(keys))
        n_seq = int(rng.integers(1, 7))
        for seq_index, chunk in enumerate(np.array_split(order, n_seq)):
            frame = int(rng.integers(1, 400))
            for o in chunk:
                frame += int(rng.integers(20, 400))
                for it in tracks[keys[int(o)]]:
                    frame += int(rng.integers(1, 12))
                    it["seq"], it["frame"] = seq_index + 1, frame
            if frame >= 10 ** 6:
                raise RuntimeError("frame numbers overflow 6 digits; lower num_ids")
    for it in items:
        it["name"] = _filename(it["pid"], it["cam"], it["seq"], it["frame"])
    return items


def _counts(items):
    def ids(split):
        return sorted(set(it["pid"] for it in items if it["split"] == split and it["pid"] > 0))
    return {
        "train_ids": len(ids("bounding_box_train")),
        "train_images": sum(it["split"] == "bounding_box_train" for it in items),
        "query_ids": len(ids("query")),
        "query_images": sum(it["split"] == "query" for it in items),
        "gallery_ids": len(ids("bounding_box_test")),
        "gallery_images": sum(it["split"] == "bounding_box_test" for it in items),
        "distractor_images": sum(it["pid"] == 0 for it in items),
        "junk_images": sum(it["pid"] == -1 for it in items),
    }


def domain_meta(seed, domain_index, num_ids, items):
    style = STYLES[domain_index]
    return {"generator": "reid.data.synthetic", "version": GENERATOR_VERSION, "domain": style.name,
            "seed": int(seed), "num_ids": int(num_ids), "cameras": style.cameras,
            "native_size_hw": list(style.size), "counts": _counts(items)}


# ------------------------------------------------------------------------------------------- writing
def _render_job(job):
    """Worker: render the images of one entity into its domain's temporary directory."""
    seed, domain_index, out_dir, items = job
    for it in items:
        data = render_image(seed, domain_index, it["entity"], it["key"], it["cam"], it["track"], it["image_index"])
        with open(os.path.join(out_dir, it["split"], it["name"]), "wb") as fh:
            fh.write(data)
    return len(items)


def _jobs(seed, domain_index, out_dir, items):
    groups = {}
    for it in items:
        gk = (it["entity"], it["key"] if it["entity"] == _E_PERSON else it["key"] // 16)
        groups.setdefault(gk, []).append(it)
    return [(seed, domain_index, out_dir, groups[k]) for k in sorted(groups)]


def _read_meta(domain_dir):
    try:
        with open(os.path.join(domain_dir, "meta.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def is_current(domain_dir, seed, num_ids):
    """True when `domain_dir` holds a complete set from this generator version, seed and num_ids."""
    meta = _read_meta(domain_dir)
    name = os.path.basename(os.path.normpath(domain_dir))
    if not meta or meta.get("version") != GENERATOR_VERSION or meta.get("seed") != seed \
            or meta.get("num_ids") != num_ids or meta.get("domain") != name:
        return False
    counts = meta.get("counts", {})
    expect = {"bounding_box_train": counts.get("train_images"), "query": counts.get("query_images"),
              "bounding_box_test": counts.get("gallery_images")}
    for split, n in expect.items():
        d = os.path.join(domain_dir, split)
        if not os.path.isdir(d) or len(os.listdir(d)) != n:
            return False
    return True


def _resolve_domains(domains):
    if domains is None:
        return list(SYNTHETIC_DOMAINS)
    if isinstance(domains, str):
        domains = [d for d in domains.split(",") if d.strip()]
    out = []
    for d in domains:
        d = d.strip()
        name = d if d in _STYLE_BY_NAME else "Synth" + d.upper()
        if name not in _STYLE_BY_NAME:
            raise UserError("unknown synthetic domain %r; use some of %s (or A,B,C,D)"
                              % (d, ",".join(SYNTHETIC_DOMAINS)))
        if name not in out:
            out.append(name)
    if not out:
        raise UserError("no synthetic domain given; use some of %s (or A,B,C,D)" % ",".join(SYNTHETIC_DOMAINS))
    return out


def _check_args(seed, num_ids, workers):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserError("synthetic seed must be a non-negative integer (got %r)" % (seed,))
    if isinstance(num_ids, bool) or not isinstance(num_ids, (int, np.integer)) or not 4 <= num_ids <= MAX_IDS:
        raise UserError("synthetic num_ids must be an integer in 4..%d (identities per domain, half for "
                          "training; got %r)" % (MAX_IDS, num_ids))
    if workers is not None and (not isinstance(workers, (int, np.integer)) or workers < 1):
        raise UserError("synthetic workers must be a positive integer (got %r)" % (workers,))


def default_workers():
    return max(1, min(2, os.cpu_count() or 1))


def ensure_synthetic(root, seed=0, num_ids=300, domains=None, workers=None, force=False, progress=True):
    """Make sure `root/<SynthX>` exist for this seed/num_ids/version; generate the missing or stale ones.

    Each domain is built in a temporary directory next to its target and renamed into place, so a crash
    leaves either the old complete domain or none. Returns `root` as a string.
    """
    _check_args(seed, num_ids, workers)
    seed, num_ids = int(seed), int(num_ids)
    names = _resolve_domains(domains)
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UserError("synthetic data root %s is a file; pass a directory (e.g. data/synthetic)" % root)
    root.mkdir(parents=True, exist_ok=True)
    todo = [n for n in names if force or not is_current(str(root / n), seed, num_ids)]
    if not todo:
        return str(root)
    workers = default_workers() if workers is None else int(workers)
    builds, jobs, total = [], [], 0
    try:
        for name in todo:
            domain_index = SYNTHETIC_DOMAINS.index(name)
            tmp = tempfile.mkdtemp(prefix=".%s.tmp-" % name, dir=str(root))
            for split in SPLIT_DIRS:
                os.mkdir(os.path.join(tmp, split))
            items = plan_domain(seed, domain_index, num_ids)
            builds.append((name, tmp, domain_meta(seed, domain_index, num_ids, items)))
            jobs.extend(_jobs(seed, domain_index, tmp, items))
            total += len(items)
        bar = _progress(total, "synthetic %s" % ",".join(todo), progress)
        threads = cv2.getNumThreads()
        try:
            if workers > 1:
                # fork: workers need no re-import (the package may pull in a framework on import)
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
                with multiprocessing.get_context(method).Pool(workers, initializer=cv2.setNumThreads,
                                                              initargs=(1,)) as pool:
                    for n in pool.imap_unordered(_render_job, jobs, chunksize=4):
                        bar.update(n)
            else:
                cv2.setNumThreads(1)        # OpenCV's own threads would only fight the generator for cores
                for job in jobs:
                    bar.update(_render_job(job))
        finally:
            cv2.setNumThreads(threads)
            bar.close()
        for name, tmp, meta in builds:
            with open(os.path.join(tmp, "meta.json"), "w") as fh:
                json.dump(meta, fh, indent=2, sort_keys=True)
                fh.write("\n")
        for name, tmp, meta in builds:
            target = root / name
            old = None
            if target.exists():
                old = tempfile.mkdtemp(prefix=".%s.old-" % name, dir=str(root))
                os.rename(str(target), os.path.join(old, name))
            os.rename(tmp, str(target))
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        for _, tmp, _ in builds:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
    return str(root)


def _progress(total, desc, enabled):
    try:
        from tqdm import tqdm
    except ImportError:   # tqdm is in the requirements; a bare install still works, silently
        enabled = False
    if not enabled:
        class _Null(object):
            def update(self, n):
                pass

            def close(self):
                pass
        return _Null()
    return tqdm(total=total, desc=desc, unit="img", dynamic_ncols=True, leave=True)


# ------------------------------------------------------------------------------------------- CLI
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reid.data.synthetic",
                                     description="Write the built-in synthetic re-ID domains (Market-1501 layout).")
    parser.add_argument("--out", required=True, help="directory that receives SynthA..SynthD")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-ids", type=int, default=300, help="identities per domain (half train, half test)")
    parser.add_argument("--domains", default="A,B,C,D", help="comma-separated subset of A,B,C,D")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: min(2, CPUs))")
    parser.add_argument("--force", action="store_true", help="regenerate even when up to date")
    args = parser.parse_args(argv)
    # bad input raises reid.errors.UserError, whose import installs the one-line error hook
    start = time.time()
    names = _resolve_domains(args.domains)
    _check_args(args.seed, args.num_ids, args.workers)
    before = dict((n, os.path.isdir(args.out) and is_current(os.path.join(args.out, n), args.seed, args.num_ids))
                  for n in names)
    root = ensure_synthetic(args.out, seed=args.seed, num_ids=args.num_ids, domains=names, workers=args.workers,
                            force=args.force)
    for n in names:
        meta = _read_meta(os.path.join(root, n))
        c = meta["counts"]
        state = "up to date" if before[n] and not args.force else "written"
        print("%s: %s (train %d ids / %d imgs, query %d / %d, gallery %d imgs incl. %d distractors, %d junk)"
              % (os.path.join(root, n), state, c["train_ids"], c["train_images"], c["query_ids"], c["query_images"],
                 c["gallery_images"], c["distractor_images"], c["junk_images"]))
    print("done in %.1f s" % (time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
