"""The torch backend on a CUDA GPU against the torch backend on the CPU.

Skipped unless the torch backend sees a CUDA device: CI has none and none of our MindSpore environments has a GPU
build, so `make test` passes them by; a GPU machine is checked with
`REID_BACKEND=torch python -m pytest tests/test_gpu.py` (docs/testing.md#gpu). The protocols and tolerances are the
cross-backend ones, with the GPU where the MindSpore run stands there:
- every module type (tests/test_modeling.py's cases: train-mode outputs, input and parameter gradients, running
  statistics, eval outputs, the fast-weight path and its identity with set weights) to the module tolerances;
- the ACL and Baseline networks no further from CPU float64 than 4x (at θ) / 8x (at θ - α·g) CPU float32's own
  error, and the full-width ACL eval feature (256x128) to 1e-4;
- 7 teacher-forced training iterations through the Trainer (tests/test_training.py's TINY config, basic and meta
  steps): the loss per step to 1e-3, each update within STEP_TOLS, the fast-weight steps in direction and length;
- train.py on the GPU, its checkpoint evaluated by test.py on the CPU: the same mAP / Rank-1 / mINP.
TF32 is switched off here (NVIDIA_TF32_OVERRIDE=0 for the command-line runs): by torch's default cuDNN convolutions
on Ampere and later GPUs round their inputs to TF32's 10-bit mantissa (~1e-3 relative), and float32 parity does
not hold under it. train.py keeps torch's defaults.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

import compat
from tests import test_modeling as tm
from tests.crossenv import ROOT, call, child_env
from tests.parity import assert_update_matches
from tests.test_training import FAST_STEP_COSINE, STEP_TENSOR_TOLS, STEP_TOLS, _cli_train_args, case_steps

pytestmark = pytest.mark.skipif(compat.IS_MINDSPORE or not compat.torch.cuda.is_available(),
                                reason="needs the torch backend and a CUDA device")


@pytest.fixture(scope="module", autouse=True)
def float32_on_the_gpu():
    backends = compat.torch.backends
    saved = backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32
    backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False
    yield
    backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = saved
    compat.set_device("cpu")


def _on(device, target, **kwargs):
    """`target(**kwargs)` with tensors created on `device` (the current device goes back to the CPU after)."""
    compat.set_device(device)
    try:
        return call(target, kwargs)
    finally:
        compat.set_device("cpu")


@pytest.fixture(scope="module")
def results():
    """tests/test_modeling.py's results layout, the GPU run under "mindspore" (its assertions are reused)."""
    case = "tests.test_modeling:case_module"
    cpu = {kind: _on("cpu", case, kind=kind) for kind in tm.KINDS}
    cpu64 = {kind: _on("cpu", case, kind=kind, float64=True) for kind in tm.NETWORKS}
    gpu = {kind: _on("gpu", case, kind=kind, state=cpu[kind]["state"]) for kind in tm.KINDS}
    full = {device: _on(device, "tests.test_modeling:case_full_width") for device in ("cpu", "gpu")}
    return dict(torch=cpu, mindspore=gpu, torch64=cpu64, states={k: cpu[k]["state"] for k in tm.KINDS},
                full_width=dict(torch=full["cpu"], mindspore=full["gpu"]))


@pytest.mark.parametrize("kind", [k for k in tm.KINDS if k not in tm.NETWORKS])
def test_module_on_the_gpu_matches_the_cpu(results, kind):
    gpu, cpu = results["mindspore"][kind], results["torch"][kind]
    tm._same_layout(gpu, cpu, kind)
    pairs = list(zip(tm._pairs(gpu, kind), tm._pairs(cpu, kind)))
    assert len(pairs) > 3
    for (label, got), (_, want) in pairs:
        tm._assert_close(label, got, want)


@pytest.mark.parametrize("kind,step,grad_factor", [
    ("acl_model", "train", 4), ("baseline_model", "train", 4), ("acl_model", "fast", 8),
    pytest.param("baseline_model", "fast", 8, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
        "measured on an H200: torch's gradients at θ' = θ - α·g 2.7% off CPU float64 (backbone.conv1.weight), "
        "CPU torch float32's 2e-4; MindSpore on the CPU is 1.6-5% off there too (tests/test_modeling.py): the "
        "Baseline at θ' is ill-conditioned and CPU torch's rounding the fortunate one")))])
def test_network_on_the_gpu_as_accurate_as_the_cpu(results, kind, step, grad_factor):
    tm._assert_as_accurate_as_torch(results, kind, step, grad_factor, who="torch on the GPU")


@pytest.mark.parametrize("kind", tm.KINDS)
def test_fast_weights_equal_updated_weights_on_the_gpu(results, kind):
    r = results["mindspore"][kind]
    for (label, fast), (_, held) in zip(tm._pairs(r, kind, ("fast",)), tm._pairs(r, kind, ("set",))):
        if " fast " in label:
            tm._assert_close(label.replace(" fast ", " fast-vs-set "), fast, held, fast_vs_set=True)
    if r["names"]:
        assert abs(r["fast"]["loss"] - r["train"]["loss"]) > 1e-6 * (1 + abs(r["train"]["loss"]))


def test_full_width_eval_on_the_gpu_matches_the_cpu(results):
    gpu, cpu = results["full_width"]["mindspore"], results["full_width"]["torch"]
    assert cpu["feat"].shape == gpu["feat"].shape == (2, 2048)
    assert np.isfinite(cpu["feat"]).all() and float(np.abs(cpu["feat"]).max()) > 1e-3
    np.testing.assert_allclose(gpu["feat"], cpu["feat"], atol=tm.OUT_ATOL, rtol=tm.OUT_RTOL)


def test_training_steps_on_the_gpu_match_the_cpu(synth_root, tmp_path):
    """tests/test_training.py's teacher-forced comparison (7 iterations: 2 + 6 basic steps, 3 meta steps), the
    CPU run recording its state before every step and the GPU run starting each step from it."""
    iterations, extra = 7, ["SOLVER.MAX_EPOCH", "10"]
    weights, states = str(tmp_path / "init.pth"), tmp_path / "states"
    states.mkdir()
    _on("cpu", "tests.test_training:case_initial_weights", root=synth_root, out=str(tmp_path / "init"), path=weights,
        extra=extra)
    kwargs = dict(root=synth_root, weights=weights, iterations=iterations, state_dir=str(states))
    try:
        cpu = case_steps(out=str(tmp_path / "cpu"), extra=extra, **kwargs)
        gpu = case_steps(out=str(tmp_path / "gpu"), extra=extra + ["MODEL.DEVICE", "gpu"], follow=True, **kwargs)
    finally:
        compat.set_device("cpu")
    plan = [k for it in range(iterations) for k in ["basic"] * (2 if it == 0 else 1) + ["meta"] * (it % 3 == 0)]
    assert gpu["kinds"] == cpu["kinds"] == plan
    np.testing.assert_allclose(gpu["losses"], cpu["losses"], rtol=1e-3)
    for got, ref in zip(gpu["fast_steps"], cpu["fast_steps"]):
        cosine = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
        assert cosine > FAST_STEP_COSINE and abs(np.linalg.norm(got) / np.linalg.norm(ref) - 1) < 0.01, cosine
    worst = 0.0
    for step, (start, got, ref) in enumerate(zip(cpu["before"], gpu["after"], cpu["after"])):
        total, _ = assert_update_matches(start, got, ref, *STEP_TOLS[1], label="step %d (%s)" % (step, plan[step]),
                                         tensor_tols=STEP_TENSOR_TOLS)
        worst = max(worst, total)
    print("GPU against CPU: worst step update relative error %.3g over all tensors" % worst)
    moved = [n for n, v in cpu["after"][-1].items() if not np.allclose(v, cpu["before"][0][n])]
    assert len(moved) > 0.9 * len(cpu["after"][-1])


def test_weights_trained_on_the_gpu_evaluate_the_same_on_the_cpu(synth_root, tmp_path):
    """train.py --device gpu (2 epochs of 2 iterations, evaluated at the end), then test.py on the CPU with its
    checkpoint: the same metrics as the training run's final evaluation (features agree to ~1e-5)."""
    env = child_env(REID_BACKEND="torch", NVIDIA_TF32_OVERRIDE="0")
    out = tmp_path / "run"

    def cli(args):
        proc = subprocess.run([sys.executable] + args, cwd=str(ROOT), env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    proc = cli(_cli_train_args(synth_root, out) + ["--device", "gpu"])
    assert "device gpu" in proc.stdout
    cli(["test.py", "--config-file", str(out / "config.yaml"), "MODEL.WEIGHTS", str(out / "model_final.pth"),
         "OUTPUT_DIR", str(tmp_path / "cpu"), "--device", "cpu"])
    trained = json.loads((out / "results.json").read_text())["results"]["SynthD"]
    got = json.loads((tmp_path / "cpu" / "eval" / "results.json").read_text())["results"]["SynthD"]
    assert 0 < trained["mAP"] <= 100
    for key in ("mAP", "Rank-1", "mINP"):
        assert got[key] == pytest.approx(trained[key], abs=0.05), key
