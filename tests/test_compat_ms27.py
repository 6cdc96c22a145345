"""The MindSpore 2.7 stack (mindnlp 0.5.1's top-level `mindtorch`, `.venv`, the default): compat picks the layer,
never takes it for PyTorch, and each shim of compat/layers/ms27/defects.py fixes a defect of the layer that the
test first shows without it. The layer-free tests run on every stack; the rest where that layer is active
(repros/ms27_defects.py shows each defect without compat)."""
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import compat
from compat import backend
from tests.crossenv import child_env

ROOT = Path(__file__).resolve().parents[1]
# mindnlp's mindtorch is installed here (whether or not it is the active layer: a torch run never imports it)
HAS_MINDNLP_MINDTORCH = "mindtorch" in backend.installed_layers()
on_ms27 = pytest.mark.skipif(not HAS_MINDNLP_MINDTORCH, reason="needs mindnlp's mindtorch (.venv)")


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=child_env(**env), capture_output=True,
                          text=True, timeout=300)


def _stand_in_module(name, file, loader_module):
    module = types.ModuleType(name)
    module.__file__ = file
    loader = type("Loader", (), {})
    loader.__module__ = loader_module
    module.__spec__ = types.SimpleNamespace(loader=loader())
    return module


def test_a_mindtorch_import_hook_is_not_taken_for_pytorch():
    real = _stand_in_module("torch", "/venv/lib/site-packages/torch/__init__.py", "importlib._bootstrap_external")
    proxy = _stand_in_module("torch", "/venv/lib/site-packages/mindtorch/__init__.py", "mindtorch.torch_proxy")
    assert not backend.is_proxy_torch(real)
    assert backend.is_proxy_torch(proxy)
    # the hook's module found by its loader alone, or by its file alone
    assert backend.is_proxy_torch(_stand_in_module("torch", real.__file__, "mindtorch.torch_proxy"))
    assert backend.is_proxy_torch(_stand_in_module("torch", proxy.__file__, "importlib._bootstrap_external"))


def test_the_active_layer_is_the_installed_one():
    layers = backend.installed_layers()
    if compat.BACKEND == "torch":
        assert compat.LAYER == "torch" and compat.STACK == "torch"
        return
    assert layers and compat.LAYER == layers[0]
    assert compat.STACK == backend.STACKS[compat.LAYER]
    info = compat.info()
    assert info["torch_api"] == compat.LAYER and info["stack"] == compat.STACK
    if compat.STACK == "ms27":
        import mindspore
        assert mindspore.__version__.startswith("2.7.")
        assert info["torch_api_version"].endswith("(mindnlp)") and info["torch_api_version"][0].isdigit()


@on_ms27
def test_python_m_compat_names_the_ms27_stack():
    proc = subprocess.run([sys.executable, "-m", "compat"], cwd=str(ROOT), env=child_env(REID_BACKEND="mindspore"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert rows["stack"] == "ms27" and rows["torch_api"] == "mindtorch"
    assert rows["torch_api_version"].startswith("0.5.1") and rows["framework_version"].startswith("2.7.")


@on_ms27
@pytest.mark.parametrize("first", ["", "import mindtorch\n"], ids=["plain", "after-import-mindtorch"])
def test_torch_backend_in_the_ms27_environment_is_a_one_line_error(first):
    """No PyTorch here: plainly `import torch` fails; after `import mindtorch` it succeeds (the layer answers for
    the name) and compat must still refuse it, naming the torch environment."""
    if first:
        probe = _run(first + "import torch, sys\nprint(type(torch.zeros(1)).__module__)\n")
        assert probe.returncode == 0, probe.stderr          # the layer answers `import torch`
    proc = _run(first + "import compat\ncompat.torch\n", REID_BACKEND="torch")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: backend 'torch'")
    assert ".venv-torch" in proc.stderr and "make setup-torch" in proc.stderr


# -- the layer's defects: each shown without its shim (the layer's own function, kept by the shim), then fixed
def _ms27():
    if compat.STACK != "ms27":
        pytest.skip("the MindSpore 2.7 stack's layer (mindnlp's mindtorch) is not the active one")
    from compat.layers.ms27 import defects
    return compat.torch, defects


def _grad(fn, *arrays):
    """compat.value_and_grad of fn over Parameters made of `arrays`: (loss, [gradients as numpy])."""
    params = [compat.nn.Parameter(compat.as_tensor(a)) for a in arrays]
    loss, _, grads = compat.value_and_grad(lambda: fn(*params), params)()
    return float(compat.to_numpy(loss)), [compat.to_numpy(g) for g in grads]


def test_checkpoints_written_after_the_layer_import_read_back(tmp_path):
    """The layer makes str() of MindSpore dtypes their repr(), which save_checkpoint writes as the type name."""
    torch, shims = _ms27()
    import mindspore
    from mindspore._c_expression.typing import Type
    entries = [{"name": "w", "data": mindspore.Tensor(np.arange(3, dtype=np.float32))},
               {"name": "n", "data": mindspore.Tensor(np.array(7, np.int64))}]
    fixed = Type.__str__
    Type.__str__ = shims._SAVED["layer_dtype_str"]       # as the layer leaves it
    try:
        assert str(mindspore.float32) == "mindspore.float32"
        mindspore.save_checkpoint(entries, str(tmp_path / "layer.ckpt"))
    finally:
        Type.__str__ = fixed
    with pytest.raises(ValueError, match="mindspore.float32"):
        mindspore.load_checkpoint(str(tmp_path / "layer.ckpt"))
    assert str(mindspore.float32) == "Float32" and repr(mindspore.float32) == "mindspore.float32"
    compat.checkpoint.export_mindspore_ckpt({"w": np.arange(3, dtype=np.float32), "n": np.array(7, np.int64)},
                                            str(tmp_path / "fixed.ckpt"))
    loaded = mindspore.load_checkpoint(str(tmp_path / "fixed.ckpt"))
    assert np.array_equal(loaded["w"].asnumpy(), np.arange(3)) and int(loaded["n"].asnumpy()) == 7


def test_tensors_from_mindspore_ops_have_the_layers_device():
    torch, shims = _ms27()
    import mindspore
    a = torch.tensor(np.ones(3, np.float32))
    made = mindspore.ops.add(a, a)                    # a MindSpore op outside the layer: no `_device`
    assert not hasattr(made, "_device")
    with pytest.raises(ValueError, match="must have device"):
        shims._SAVED["layer_device"].fget(made)
    assert made.device == a.device and made.device.type == "cpu"
    assert np.array_equal(compat.to_numpy(made * a - 1), np.ones(3))


def test_a_move_to_the_device_a_tensor_is_on_keeps_its_gradient():
    torch, shims = _ms27()
    a, b = np.array([3.0, 1.0], np.float32), np.array([1.0, 2.0], np.float32)

    def moved_difference(x, y):   # the layer's `-` moves both operands to their device first
        return ((x - y).to(x.device) ** 2).sum()

    original = torch.Tensor._move_to.compat_original
    fixed = torch.Tensor._move_to
    torch.Tensor._move_to = original
    try:
        loss, grads = _grad(moved_difference, a, b)
    finally:
        torch.Tensor._move_to = fixed
    assert loss == pytest.approx(5.0) and not np.any(grads[0]) and not np.any(grads[1])   # through numpy: lost
    loss, grads = _grad(moved_difference, a, b)
    assert loss == pytest.approx(5.0)
    assert np.allclose(grads[0], 2 * (a - b)) and np.allclose(grads[1], -2 * (a - b))
    t = torch.tensor(a)
    assert t.to("cpu") is t and t.cpu() is t


@pytest.mark.parametrize("order", [2, 1, 3, 2.5, float("inf"), -float("inf"), 0])
@pytest.mark.parametrize("dim", [None, 1, (0, 1)])
def test_vector_norm_over_any_dims_and_order(order, dim):
    torch, _ = _ms27()
    rng = np.random.RandomState(0)
    x = rng.randn(3, 4, 2).astype(np.float32)
    x[0, 0, 0] = 0.0
    axes = dim if dim is not None else (0, 1, 2)
    a = np.abs(x.astype(np.float64))
    if order in (float("inf"), -float("inf")):
        want = a.max(axes) if order > 0 else a.min(axes)
    elif order == 0:
        want = (a != 0).sum(axes)
    else:
        want = (a ** order).sum(axes) ** (1.0 / order)
    got = compat.to_numpy(torch.linalg.vector_norm(torch.tensor(x), order, dim))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    if dim is None and order == 2:
        assert float(compat.to_numpy(torch.tensor(x).norm())) == pytest.approx(float(want), rel=2e-6)
        assert float(compat.to_numpy(torch.norm(torch.tensor(x)))) == pytest.approx(float(want), rel=2e-6)


def test_vector_norm_defects_of_the_layer_kernel_and_the_fractional_gradient():
    torch, _ = _ms27()
    from mindtorch._apis import cpu
    original = cpu.linalg_vector_norm.compat_original
    x = torch.tensor(np.array([[3.0, -4.0]], np.float32))
    with pytest.raises(TypeError, match="axis"):
        original(x, 2, None, False)                       # all elements
    with pytest.raises(OverflowError):
        original(x, float("inf"), 1, False)
    truncated = float(compat.to_numpy(original(x, 2.5, 1, False))[0])
    assert truncated == pytest.approx(5.0)               # the 2-norm, not the 2.5-norm
    v = np.array([0.5, -2.0, 1.5], np.float32)
    _, (g,) = _grad(lambda p: torch.linalg.vector_norm(p, 2.5), v)
    norm = np.sum(np.abs(v) ** 2.5) ** 0.4
    np.testing.assert_allclose(g, np.sign(v) * np.abs(v) ** 1.5 / norm ** 1.5, rtol=1e-5)


def _cross_entropy_case():
    rng = np.random.RandomState(0)
    logits = (rng.randn(6, 3) * 2).astype(np.float32)
    target = np.array([0, 2, 1, 1, 0, 2], np.int64)
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = p.copy()
    grad[np.arange(6), target] -= 1
    return logits, target, -np.log(p[np.arange(6), target]).mean(), grad / 6


def test_cross_entropy_is_as_accurate_as_torch():
    """Against float64: torch's float32 gradient is within ~5e-8 here; the layer's LogSoftmax-based one 3e-7."""
    torch, _ = _ms27()
    logits, target, want_loss, want_grad = _cross_entropy_case()
    y = torch.tensor(target)
    F = torch.nn.functional
    errors = {}
    for name, fn in (("layer", F.cross_entropy.compat_original), ("fixed", F.cross_entropy)):
        loss, (g,) = _grad(lambda p: fn(p, y), logits)
        errors[name] = (abs(loss - want_loss), float(np.abs(g - want_grad).max()))
    assert errors["layer"][1] > 2e-7 and errors["fixed"][1] < 1e-7, errors
    assert errors["fixed"][0] < 1e-6, errors
    smoothed, (g,) = _grad(lambda p: F.cross_entropy(p, y, label_smoothing=0.1, reduction="sum"), logits)
    x = logits.astype(np.float64)
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    soft = np.full_like(logp, 0.1 / 3)
    soft[np.arange(6), target] += 0.9
    assert smoothed == pytest.approx(float(-(soft * logp).sum()), rel=1e-6)
    np.testing.assert_allclose(g, np.exp(logp) - soft, atol=1e-6)


def test_manual_seed_also_seeds_mindspore():
    """The layer's `torch.manual_seed` seeds its own generator only and leaves MindSpore's global seed as it was;
    compat's (defects._manual_seed_seeds_mindspore) sets it too, as compat.manual_seed does."""
    torch, _ = _ms27()
    import mindspore
    before = mindspore.get_seed()
    try:
        mindspore.set_seed(7)
        torch.manual_seed.compat_original(123)
        assert mindspore.get_seed() == 7
        torch.manual_seed(123)
        assert mindspore.get_seed() == 123
    finally:
        if before is not None:
            mindspore.set_seed(before)


def test_float_of_a_tensor_is_its_full_value():
    """The layer's `float(tensor)` rounds to 5 decimal places; compat's (defects._float_full_precision) is the
    value itself, as torch's and as `.item()`."""
    torch, _ = _ms27()
    value = np.float32(3.5315153598785400)
    small = np.float32(3e-6)
    t, s = torch.tensor(value), torch.tensor(small)
    original = vars(torch.Tensor)["__float__"].compat_original
    assert original(t) == 3.53152 and original(s) == 0.0
    assert float(t) == float(value) == t.item()
    assert float(s) == float(small)
    assert "%.9f" % torch.tensor(np.float32(0.123456789)) == "%.9f" % np.float32(0.123456789)
    assert float(torch.tensor([2.5e-7])) == float(np.float32(2.5e-7))  # one element, any shape


def test_batch_norm_modules_use_their_affine_and_running_statistics():
    torch, _ = _ms27()
    rng = np.random.RandomState(0)
    x = (rng.randn(2, 4, 3, 3) * 2 + 1).astype(np.float32)
    weight, bias = (rng.rand(4) + 0.5).astype(np.float32), (rng.randn(4) * 0.1).astype(np.float32)
    F = torch.nn.functional

    def module():
        bn = torch.nn.BatchNorm2d(4)
        bn.weight.data, bn.bias.data = torch.tensor(weight), torch.tensor(bias)
        return bn

    bn = module()
    original, fixed = F.batch_norm.compat_original, F.batch_norm
    F.batch_norm = original
    try:
        broken = compat.to_numpy(bn(torch.tensor(x)))
    finally:
        F.batch_norm = fixed
    assert np.allclose(broken, 1.0)                       # statistics as affine: scale 0, offset 1
    assert not np.allclose(compat.to_numpy(bn.weight), weight)   # and the kernel wrote its statistics there
    bn = module()
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * weight[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(compat.to_numpy(bn(torch.tensor(x))), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compat.to_numpy(bn.running_mean), 0.1 * mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(compat.to_numpy(bn.running_var), 0.9 + 0.1 * x.var((0, 2, 3), ddof=1), rtol=1e-5)
    np.testing.assert_allclose(compat.to_numpy(bn.weight), weight)
    bn.eval()
    mean, var = compat.to_numpy(bn.running_mean), compat.to_numpy(bn.running_var)
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * weight[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(compat.to_numpy(bn(torch.tensor(x))), want, rtol=1e-5, atol=1e-5)


class _Numbers:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"x": np.full(3, i, np.float32), "targets": i}


def test_a_loader_with_workers_ends_without_waiting_for_its_clean_up_process(monkeypatch):
    """MindSpore 2.7's own defect: a dataset `map` with worker processes ends by waiting up to 5 s for its
    clean-up process, which was never told to quit, then kills it. Shown with MindSpore's shutdown (the process
    is still there to be killed), then with the shim (it has quit by itself); the batches are the same."""
    import gc
    _ms27()
    from mindspore.dataset.engine import datasets
    from compat.data import make_loader
    pool = datasets._PythonMultiprocessing
    fixed = pool._abort_monitor
    assert fixed.compat_original is not None
    terminate, killed = pool._terminate_processes, []

    def recording(processes):   # the clean-up process, when it is still there to be killed
        killed.extend(p for p in processes if p.name == "MapCleanProcess" and p.exitcode is None)
        return terminate(processes)
    monkeypatch.setattr(pool, "_terminate_processes", staticmethod(recording))

    seen, ends = [], []
    for shutdown in (fixed.compat_original, fixed):
        monkeypatch.setattr(pool, "_abort_monitor", shutdown)
        before = len(killed)
        seen.append([compat.to_numpy(b["targets"]).tolist()
                     for b in make_loader(_Numbers(), [[0, 1], [2, 3], [4, 5]], num_workers=2)])
        gc.collect()
        ends.append("killed" if len(killed) > before else "quit")
    assert seen == [[[0, 1], [2, 3], [4, 5]]] * 2
    assert ends == ["killed", "quit"]


# -- defects compat replaces rather than patches: the layer's own way, then compat's
def test_backward_leaves_no_gradient_and_value_and_grad_gives_it():
    torch, _ = _ms27()
    v = np.array([1.0, -2.0, 0.5], np.float32)
    w = torch.nn.Parameter(torch.tensor(v))
    (w * w).sum().backward()
    assert w.grad is None                                # the layer's backward() records nothing
    _, (g,) = _grad(lambda p: (p * p).sum(), v)
    np.testing.assert_allclose(g, 2 * v)


def test_the_layers_sgd_has_no_cpu_kernel_and_compats_steps():
    torch, _ = _ms27()
    w = torch.nn.Parameter(torch.tensor(np.ones(3, np.float32)))
    w.grad = torch.tensor(np.full(3, 0.5, np.float32))
    with pytest.raises(RuntimeError, match="No implementation"):
        torch.optim.SGD([w], lr=0.1).step()
    opt = compat.optim.SGD([w], lr=0.1, momentum=0.9)
    opt.step([torch.tensor(np.full(3, 0.5, np.float32))])
    np.testing.assert_allclose(compat.to_numpy(w), np.full(3, 0.95), rtol=1e-6)


def test_a_module_bprop_is_ignored_and_custom_op_uses_a_cell():
    """The layer's nn.Module is not a MindSpore Cell: a `bprop` on it is never called."""
    torch, _ = _ms27()

    class Reverse(torch.nn.Module):
        def forward(self, x):
            return x * 1.0

        def bprop(self, x, out, dout):
            return (-dout,)

    v = np.array([1.0, 2.0], np.float32)
    _, (g,) = _grad(lambda p: (Reverse()(p) * 3).sum(), v)
    np.testing.assert_allclose(g, [3.0, 3.0])             # autodiff through forward: the bprop was not used
    reverse = compat.custom_op(lambda x: x * 1.0, lambda inputs, out, dout: (-dout,))
    _, (g,) = _grad(lambda p: (reverse(p) * 3).sum(), v)
    np.testing.assert_allclose(g, [-3.0, -3.0])


def test_ops_launch_synchronously():
    """compat.backend asks MindSpore 2.7 for synchronous op launch before the layer's import runs any op (with
    the launch thread the op-by-op step was several times slower on 2 cores: docs/ms27.md)."""
    _ms27()
    from mindspore._c_expression import RuntimeConf
    assert RuntimeConf.get_instance().is_launch_blocking()


def test_devices_map_to_mindspore_2_7s_device_api(monkeypatch):
    """--device ascend / gpu on MindSpore 2.7: `mindspore.set_device` (only when the target changes: 2.7 refuses
    any call once an op ran) and the layer's default device label ('npu' / 'cuda'). Here (a CPU-only build) the
    device calls are recorded by stand-ins; the real ones are one-line errors."""
    torch, _ = _ms27()
    import mindspore
    from mindtorch._bind import get_default_device
    calls = []
    monkeypatch.setattr(mindspore, "set_device", lambda target, device_id=None: calls.append(target))
    monkeypatch.setattr(mindspore, "get_context", lambda key: "CPU" if key == "device_target" else None)
    try:
        assert compat.set_device("npu") == "ascend" and calls == ["Ascend"] and get_default_device().type == "npu"
        assert compat.set_device("cuda") == "gpu" and calls[-1] == "GPU" and get_default_device().type == "cuda"
        assert compat.set_device("cpu") == "cpu" and len(calls) == 2   # already the target: not passed on
    finally:
        monkeypatch.undo()
        compat.set_device("cpu")
    assert get_default_device().type == "cpu" and compat.as_tensor(np.ones(2, np.float32)).device.type == "cpu"
    for key in ("gpu", "ascend"):
        with pytest.raises(compat.UserError, match="device '%s' is not available to this MindSpore install" % key):
            compat.set_device(key)
    assert compat.current_device() == "cpu"
    assert float(compat.to_numpy((compat.as_tensor(np.ones(2, np.float32)) * 2).sum())) == 4.0
