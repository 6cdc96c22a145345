"""Compiled training steps (MODEL.JIT on MindSpore) against op-by-op MindSpore and against torch, step by step.

One teacher-forced run serves all three comparisons (the machinery of tests/test_training.py): torch runs the
iterations and saves its state before every step; MindSpore op by op and MindSpore compiled each start every
step from that state (weights, running statistics, both optimizers' momentum, the meta-domain RNG) and take
torch's fast-weight step in meta steps. So compiled and op-by-op MindSpore are compared on identical inputs,
without a graph build of their own for the op-by-op side.

Cost: the compiled side builds one graph per (step kind, number of domains per chunk) it meets: here basic
(3 domains), meta-train (2) and meta-test (1); a basic batch missing a domain would add one. Each took 3.3-5
minutes of wall time on our loaded 2-core machine (load ~10), and the whole test 15.7 minutes (slow).
"""
import numpy as np
import pytest

from tests.crossenv import run_cases
from tests.parity import assert_update_matches
from tests.test_training import STEP_TENSOR_TOL, STEP_TENSOR_TOLS, STEP_TOTAL_TOL

pytestmark = [pytest.mark.slow, pytest.mark.parity]

ITERATIONS = 7  # 2 + 6 basic steps and 3 meta steps (iterations 0, 3, 6): every step kind, both BN modes

# Compiled against op by op on the same start state, both MindSpore: the loss to 1e-5 relative; the update
# (tests/parity.py: a skipped step scores 1, a half step 0.5) to COMPILED_TOLS = (over all tensors, per tensor).
# They are not equal to rounding: compiled, instance norm runs as two-pass reductions (compat/norm.py) where op by
# op runs the fused batch-norm kernel, and the network's float32 conditioning at this size amplifies that (see
# test_training.py). Measured (7 iterations, loaded 2-core machine): worst loss 1e-6, worst logged term 2.1e-5,
# worst update 0.0078 over all tensors and 0.044 per tensor, running statistics 1.7e-4.
COMPILED_TOLS = (0.02, 0.12)
# running statistics after a basic step: the update of each, relative (L2), compiled against op by op
STATS_TOL = 1e-3


def _rel(a, b):
    return abs(float(a) - float(b)) / max(abs(float(b)), 1e-12)


def test_compiled_steps_match_op_by_op_and_torch(synth_root, tmp_path):
    extra = ["MODEL.NUM_SPLITS", "1", "SOLVER.MAX_EPOCH", "10"]
    weights = str(tmp_path / "init.pth")
    states = tmp_path / "states"
    states.mkdir()
    run_cases("torch", [("tests.test_training:case_initial_weights",
                         dict(root=synth_root, out=str(tmp_path / "init"), path=weights, extra=extra))])
    kwargs = dict(root=synth_root, weights=weights, iterations=ITERATIONS, state_dir=str(states))
    pt = run_cases("torch", [("tests.test_training:case_steps",
                              dict(kwargs, out=str(tmp_path / "pt"), extra=extra))])[0]
    eager, compiled = run_cases("mindspore", [
        ("tests.test_training:case_steps", dict(kwargs, out=str(tmp_path / "ms"), follow=True,
                                                extra=extra + ["MODEL.JIT", "False"])),
        ("tests.test_training:case_steps", dict(kwargs, out=str(tmp_path / "jit"), follow=True,
                                                extra=extra + ["MODEL.JIT", "True"]))])
    plan = [k for it in range(ITERATIONS) for k in ["basic"] * (2 if it == 0 else 1) + ["meta"] * (it % 3 == 0)]
    assert compiled["kinds"] == eager["kinds"] == pt["kinds"] == plan
    assert eager["graphs"] == [] and {g.split()[0] for g in compiled["graphs"]} == {"basic", "mtrain", "mtest"}
    print("compiled graphs:", compiled["graphs"])

    # compiled against op by op (MindSpore both)
    worst = {"loss": 0.0, "term": 0.0, "total": 0.0, "tensor": 0.0, "stats": 0.0}
    for step, kind in enumerate(plan):
        label = "step %d (%s)" % (step, kind)
        worst["loss"] = max(worst["loss"], _rel(compiled["losses"][step], eager["losses"][step]))
        assert _rel(compiled["losses"][step], eager["losses"][step]) < 1e-5, label
        assert sorted(compiled["terms"][step]) == sorted(eager["terms"][step]), label
        for key, value in eager["terms"][step].items():
            err = abs(compiled["terms"][step][key] - value) / max(abs(value), 1e-3)  # (center terms are ~1e-3)
            worst["term"] = max(worst["term"], err)
            assert err < 1e-4, (label, key, err)
        total, per = assert_update_matches(pt["before"][step], compiled["after"][step], eager["after"][step],
                                           *COMPILED_TOLS, label=label + " compiled vs op by op")
        worst["total"], worst["tensor"] = max(worst["total"], total), max(worst["tensor"], max(per.values()))
        for name, ref in eager["stats"][step].items():
            begin, got = pt["stats_before"][step][name], compiled["stats"][step][name]
            if kind == "meta":  # 'hold' batch norm: the running statistics stay exactly where the step began
                assert np.array_equal(got, begin) and np.array_equal(ref, begin), (label, name)
                continue
            moved = np.linalg.norm(ref.astype(np.float64) - begin)
            err = np.linalg.norm(got.astype(np.float64) - ref) / moved
            worst["stats"] = max(worst["stats"], err)
            assert moved > 0 and err < STATS_TOL, (label, name, err)
    print("compiled vs op by op, worst: loss %.2g, term %.2g, update %.2g over all tensors, %.2g per tensor, "
          "running statistics %.2g" % (worst["loss"], worst["term"], worst["total"], worst["tensor"], worst["stats"]))

    # compiled against torch, at the step-parity bounds of tests/test_training.py
    np.testing.assert_allclose(compiled["losses"], pt["losses"], rtol=1e-3)
    for step, (start, got, ref) in enumerate(zip(pt["before"], compiled["after"], pt["after"])):
        assert_update_matches(start, got, ref, STEP_TOTAL_TOL, STEP_TENSOR_TOL, tensor_tols=STEP_TENSOR_TOLS,
                              label="step %d compiled vs torch" % step)
