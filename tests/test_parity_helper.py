"""tests/parity.py: the update comparison rejects skipped, half-size and misdirected updates, even when the
step is 1e-5 of the weights (where weights-after-the-step at 1e-3 relative would accept them all)."""
import numpy as np
import pytest

from tests.parity import assert_update_matches, update_errors


def _states(step=1e-5, seed=0):
    rng = np.random.RandomState(seed)
    before = {"conv.weight": rng.randn(32, 8, 3, 3), "bn.weight": 1 + 0.1 * rng.randn(8),
              "bn.bias": np.zeros(8), "fc.weight": rng.randn(5, 8)}
    delta = {n: step * (np.abs(v) + 1) * rng.randn(*v.shape) for n, v in before.items()}
    # the "reference" and "got" runs: the same update up to float32-like noise of 1e-3 of it
    ref = {n: before[n] + delta[n] for n in before}
    got = {n: before[n] + delta[n] * (1 + 1e-3 * rng.randn(*delta[n].shape)) for n in before}
    return before, delta, ref, got


def _fails(before, got, ref):
    with pytest.raises(AssertionError):
        assert_update_matches(before, got, ref, total_tol=0.05, tensor_tol=0.2)


def test_matching_update_passes_and_weight_comparison_is_blind():
    before, delta, ref, got = _states()
    total, per = assert_update_matches(before, got, ref, total_tol=0.05, tensor_tol=0.2)
    assert total < 2e-3 and max(per.values()) < 2e-3
    skipped = {n: v.copy() for n, v in before.items()}
    # what the weights-after comparison used to accept: 1e-3 relative, although nothing moved
    for n in ref:
        assert np.linalg.norm(skipped[n] - ref[n]) <= 1e-3 * np.linalg.norm(ref[n]) + 1e-4


@pytest.mark.parametrize("factor", [0.0, 0.5, 2.0, -1.0])
def test_skipped_half_doubled_or_reversed_update_fails(factor):
    before, delta, ref, _ = _states()
    got = {n: before[n] + factor * delta[n] for n in before}
    total, per = update_errors(before, got, ref)
    assert total == pytest.approx(abs(1 - factor), rel=1e-6)
    _fails(before, got, ref)


def test_one_skipped_tensor_fails_even_when_the_total_passes():
    before, delta, ref, got = _states()
    got = dict(got, **{"bn.bias": before["bn.bias"].copy()})   # 8 of 2,376 values: the total barely moves
    total, per = update_errors(before, got, ref)
    assert total < 0.05 and per["bn.bias"] == pytest.approx(1.0, rel=1e-2)
    _fails(before, got, ref)


def test_update_where_the_reference_left_a_tensor_alone_fails():
    before, delta, ref, got = _states()
    ref = dict(ref, **{"fc.weight": before["fc.weight"].copy()})          # e.g. an absent domain's classifier
    got_same = dict(got, **{"fc.weight": before["fc.weight"].copy()})
    assert update_errors(before, got_same, ref)[1]["fc.weight"] == 0.0
    got_decayed = dict(got, **{"fc.weight": before["fc.weight"] * (1 - 1e-6)})
    assert update_errors(before, got_decayed, ref)[1]["fc.weight"] == float("inf")
    _fails(before, got_decayed, ref)


def test_bounds_that_would_accept_a_half_step_are_refused():
    before, _, ref, got = _states()
    with pytest.raises(ValueError, match="half-size"):
        assert_update_matches(before, got, ref, total_tol=0.5, tensor_tol=0.1)
    with pytest.raises(ValueError, match="half-size"):
        assert_update_matches(before, got, ref, total_tol=0.1, tensor_tol=0.1, tensor_tols={"bn.bias": 0.6})
