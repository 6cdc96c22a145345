"""Comparing training updates between two implementations (two backends, or compiled vs op-by-op).

A step moves the weights by only 1e-5..1e-3 of their size, so "the weights after the step agree to 1e-3"
also holds for an implementation that skipped the step. What must agree is the update itself:
Δ = θ_after - θ_before, both runs starting from the same θ_before (teacher forcing), compared as
‖Δ_got - Δ_ref‖ / ‖Δ_ref‖ over all tensors together and per tensor. A skipped update scores 1, a half-size
one 0.5, a doubled one 1, so any bound well below 0.5 rejects them (`tests/test_parity_helper.py` checks that).
"""
import numpy as np


def update_errors(before, got_after, ref_after):
    """(total, {name: per-tensor}) relative errors of the update Δ_got against Δ_ref.

    All arguments map tensor names to numpy arrays; `before` is the shared start state. A tensor that the
    reference left exactly unchanged gets error 0 when `got` left it unchanged too, else inf (an update
    where none belongs is never a rounding difference)."""
    names = sorted(ref_after)
    if sorted(got_after) != names or not set(names) <= set(before):
        raise ValueError("the three states must hold the same tensors")
    per, num, den = {}, 0.0, 0.0
    for name in names:
        start = np.asarray(before[name], np.float64)
        d_got = np.asarray(got_after[name], np.float64) - start
        d_ref = np.asarray(ref_after[name], np.float64) - start
        diff2, ref2 = float(((d_got - d_ref) ** 2).sum()), float((d_ref ** 2).sum())
        num, den = num + diff2, den + ref2
        if ref2 == 0.0:
            per[name] = 0.0 if diff2 == 0.0 else float("inf")
        else:
            per[name] = float(np.sqrt(diff2 / ref2))
    total = float(np.sqrt(num / den)) if den > 0 else (0.0 if num == 0 else float("inf"))
    return total, per


def assert_update_matches(before, got_after, ref_after, total_tol, tensor_tol, label="", tensor_tols=None):
    """Fail unless the update agrees within `total_tol` over all tensors and `tensor_tol` per tensor
    (`tensor_tols` may give a different bound for named tensors). Both bounds must stay below 0.5: a
    half-size or skipped update must fail. Returns (total, per-tensor) for reporting."""
    bounds = [total_tol, tensor_tol] + list((tensor_tols or {}).values())
    if max(bounds) >= 0.5:
        raise ValueError("an update bound >= 0.5 would accept a half-size or skipped update")
    total, per = update_errors(before, got_after, ref_after)
    assert total <= total_tol, "%s: update relative error %.3g > %.3g (over all tensors)" % (label, total, total_tol)
    bad = {n: e for n, e in per.items() if e > (tensor_tols or {}).get(n, tensor_tol)}
    assert not bad, "%s: per-tensor update relative errors above %.3g: %s" % (
        label, tensor_tol, ", ".join("%s %.3g" % kv for kv in sorted(bad.items(), key=lambda kv: -kv[1])[:8]))
    return total, per
