"""The hand-crafted colour-histogram reference: known answers on drawn images, its ranking through the shared
evaluator, the comparison table, and input errors."""
import numpy as np
import pytest

from compat.errors import UserError
from reid.evaluation import evaluate_histogram, format_rows_table, hsv_histogram
from reid.evaluation.histogram import grey_world


def person(top, bottom, h=64, w=32, background=(90, 90, 90)):
    """A box with a background and a centred 'person': top colour above the middle, bottom colour below."""
    img = np.empty((h, w, 3), np.uint8)
    img[:] = background
    img[: h // 2, w // 4: 3 * w // 4] = top
    img[h // 2:, w // 4: 3 * w // 4] = bottom
    return img


RED, BLUE, GREEN, YELLOW = (200, 30, 30), (30, 40, 190), (30, 170, 50), (220, 210, 40)


def cosine(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_feature_shape_and_per_stripe_normalisation():
    f = hsv_histogram(person(RED, BLUE), stripes=4, bins=(8, 4, 4))
    assert f.shape == (4 * 128,) and f.dtype == np.float32
    # square-rooted L1-normalised histograms: each stripe has unit L2 norm, so cosine = mean Bhattacharyya
    np.testing.assert_allclose(np.linalg.norm(f.reshape(4, -1), axis=1), 1.0, rtol=1e-6)


def test_identical_images_are_at_distance_zero_and_background_is_ignored():
    a = person(RED, BLUE)
    assert cosine(hsv_histogram(a), hsv_histogram(a.copy())) == pytest.approx(1.0, abs=1e-6)
    # the default keeps the central half of the columns: the same person on another background is the same
    b = person(RED, BLUE, background=(20, 160, 20))
    assert cosine(hsv_histogram(a), hsv_histogram(b)) == pytest.approx(1.0, abs=1e-6)
    assert cosine(hsv_histogram(a, center=1.0), hsv_histogram(b, center=1.0)) < 0.9


def test_colour_swapped_identities_separate():
    """Red-over-blue and blue-over-red have the same global colour content; the stripes tell them apart."""
    a, b = person(RED, BLUE), person(BLUE, RED)
    assert cosine(hsv_histogram(a, stripes=1), hsv_histogram(b, stripes=1)) == pytest.approx(1.0, abs=1e-6)
    assert cosine(hsv_histogram(a), hsv_histogram(b)) == pytest.approx(0.0, abs=1e-6)


def test_grey_world_removes_a_global_colour_cast():
    a = person(RED, BLUE)
    cast = np.clip(a.astype(np.float32) * np.array([1.3, 1.0, 0.7], np.float32), 0, 255).astype(np.uint8)
    plain = cosine(hsv_histogram(a), hsv_histogram(cast))
    balanced = cosine(hsv_histogram(a, white_balance=True), hsv_histogram(cast, white_balance=True))
    assert balanced > plain and balanced > 0.95
    grey = np.full((8, 8, 3), (100, 120, 140), np.uint8)
    assert np.abs(grey_world(grey).astype(int) - 120).max() <= 1


def test_ranking_through_the_shared_evaluator(monkeypatch):
    """Four identities in two cameras: each query's own identity (other camera) ranks first; a distractor of
    another colour and the same-camera copy (removed by the protocol) do not count."""
    colours = [(RED, BLUE), (BLUE, RED), (GREEN, YELLOW), (YELLOW, GREEN)]
    rng = np.random.default_rng(0)

    def shot(top, bottom):   # a slightly different view: small brightness change and pixel noise
        img = person(top, bottom).astype(np.float32) * rng.uniform(0.9, 1.1) + rng.normal(0, 2, (64, 32, 3))
        return np.clip(img, 0, 255).astype(np.uint8)

    images = {}
    query = [("q%d" % i, i + 1, 0) for i in range(4)]
    gallery = [("g%d" % i, i + 1, 1) for i in range(4)] + [("s%d" % i, i + 1, 0) for i in range(4)]
    for path, pid, _ in query + gallery:
        images[path] = shot(*colours[pid - 1])
    images["d"] = person((120, 60, 160), (240, 240, 240))
    gallery.append(("d", 0, 1))

    import reid.data.common as common
    monkeypatch.setattr(common, "read_image", lambda path, on_bad: images[path])
    r = evaluate_histogram(query, gallery)
    assert r["Rank-1"] == 100.0 and r["mAP"] == 100.0 and r["mINP"] == 100.0


def test_reference_row_in_the_results_table():
    """The reference is one row of the same table as the network's evaluations (untrained, reference, last)."""
    rows = [{"name": "untrained", "iteration": -1, "results": {"SynthD": {"mAP": 1.5, "Rank-1": 1.3, "mINP": 0.4}}},
            {"name": "colour histogram", "iteration": None, "results": {"SynthD": {"mAP": 23.04, "Rank-1": 30.8}}},
            {"name": "last", "iteration": 174, "results": {"SynthD": {"mAP": 30.26, "Rank-1": 40.0, "mINP": 12.0}}}]
    lines = format_rows_table(rows).splitlines()
    assert [l.split("|")[1].strip() for l in lines[2:]] == ["untrained", "colour histogram", "last"]
    assert lines[3].split("|")[2].strip() == "-" and "   23.0 |" in lines[3] and lines[3].endswith("|       - |")


def test_bad_input_is_one_clear_error():
    with pytest.raises(UserError, match="HxWx3 RGB uint8"):
        hsv_histogram(np.zeros((8, 8), np.uint8))
    with pytest.raises(UserError, match="center"):
        hsv_histogram(person(RED, BLUE), center=0.0)
    with pytest.raises(UserError, match="bins"):
        hsv_histogram(person(RED, BLUE), bins=(8, 4))
    with pytest.raises(UserError, match="stripes"):
        hsv_histogram(np.zeros((4, 8, 3), np.uint8), stripes=6)
