"""compat.batch_norm / compat.instance_norm against real torch F.batch_norm / F.instance_norm."""
import numpy as np
import pytest

from tests.crossenv import child_env, run_cases


def case_norms(seed, shape, mode, momentum=0.1):
    import compat
    rng = np.random.RandomState(seed)
    c = shape[1]
    x = rng.randn(*shape).astype(np.float32) * 2 + 0.5
    w, b = rng.rand(c).astype(np.float32) + 0.5, rng.randn(c).astype(np.float32)
    rm0, rv0 = rng.randn(c).astype(np.float32), rng.rand(c).astype(np.float32) + 0.5
    rm, rv = compat.as_tensor(rm0), compat.as_tensor(rv0)
    weight, bias = compat.nn.Parameter(compat.as_tensor(w)), compat.nn.Parameter(compat.as_tensor(b))
    xt = compat.as_tensor(x)

    def loss_fn(inp):
        y = compat.batch_norm(inp, rm, rv, weight, bias, mode, momentum, 1e-5)
        weights = compat.as_tensor(np.linspace(-1, 1, c).astype(np.float32)).reshape((1, -1) + (1,) * (len(shape) - 2))
        return (y * y * weights).sum(), y

    loss, y, grads = compat.value_and_grad(loss_fn, [weight, bias])(xt)
    out = dict(y=compat.to_numpy(y), rm=compat.to_numpy(rm), rv=compat.to_numpy(rv),
               gw=compat.to_numpy(grads[0]), gb=compat.to_numpy(grads[1]))
    out["in_y"] = compat.to_numpy(compat.instance_norm(xt, weight, bias)) if len(shape) == 4 else np.zeros(1)
    return out


def case_reference(seed, shape, mode, momentum=0.1):
    """Real torch's F.batch_norm (mode 'hold': batch statistics, no running statistics)."""
    import torch
    import torch.nn.functional as F
    rng = np.random.RandomState(seed)
    c = shape[1]
    x = torch.from_numpy(rng.randn(*shape).astype(np.float32) * 2 + 0.5)
    w = torch.from_numpy(rng.rand(c).astype(np.float32) + 0.5).requires_grad_()
    b = torch.from_numpy(rng.randn(c).astype(np.float32)).requires_grad_()
    rm, rv = torch.from_numpy(rng.randn(c).astype(np.float32)), torch.from_numpy(rng.rand(c).astype(np.float32) + 0.5)
    if mode == "eval":
        y = F.batch_norm(x, rm, rv, w, b, False, momentum, 1e-5)
    elif mode == "general":
        y = F.batch_norm(x, rm, rv, w, b, True, momentum, 1e-5)
    else:
        y = F.batch_norm(x, None, None, w, b, True, momentum, 1e-5)
    scale = torch.from_numpy(np.linspace(-1, 1, c).astype(np.float32)).reshape((1, -1) + (1,) * (len(shape) - 2))
    (y * y * scale).sum().backward()
    in_y = F.instance_norm(x, None, None, w, b, True) if len(shape) == 4 else torch.zeros(1)
    return dict(y=y.detach().numpy(), rm=rm.numpy(), rv=rv.numpy(), gw=w.grad.numpy(), gb=b.grad.numpy(),
                in_y=in_y.detach().numpy())


CASES = [((8, 5, 6, 4), "general"), ((8, 5, 6, 4), "hold"), ((8, 5, 6, 4), "eval"), ((12, 7), "general"),
         ((12, 7), "hold"), ((8, 5, 3, 3), "general"), ((12, 6), "hold")]


@pytest.fixture(scope="module")
def results():
    """All cases in one child process per backend (interpreter start-up dominates otherwise)."""
    def calls(target):
        return [(target, dict(seed=3, shape=s, mode=m)) for s, m in CASES]
    ref = run_cases("torch", calls("tests.test_compat_norm:case_reference")
                    + calls("tests.test_compat_norm:case_norms"))
    ms = run_cases("mindspore", calls("tests.test_compat_norm:case_norms"))
    n = len(CASES)
    return dict(ref=ref[:n], torch=ref[n:], mindspore=ms)


@pytest.mark.parity
@pytest.mark.parametrize("index", range(len(CASES)), ids=["%s-%s" % ("x".join(map(str, s)), m) for s, m in CASES])
@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_norms_match_torch(results, backend, index):
    ref, got = results["ref"][index], results[backend][index]
    for key in ("y", "rm", "rv", "in_y"):
        np.testing.assert_allclose(got[key], ref[key], atol=1e-5, rtol=1e-5, err_msg=key)
    for key in ("gw", "gb"):
        np.testing.assert_allclose(got[key], ref[key], atol=1e-4, rtol=1e-4, err_msg=key)


def test_instance_norm_compiled_equals_op_by_op():
    """Compiled, instance norm runs the same fused kernel as op by op (compat.norm._graph_instance_norm):
    outputs bit for bit (3-D and 4-D, with and without affine; the earlier formulation by reductions differed
    by 2.4e-7 here, a wrong tiling of the affine by O(1)), gradients of weight and bias to 1e-6. On both
    MindSpore stacks (on MindSpore 2.7 the kernel's instance, not a subclass, is made pure)."""
    import compat
    if not compat.IS_MINDSPORE:
        pytest.skip("compiled execution exists on MindSpore only")
    rng = np.random.RandomState(5)
    for shape in ((4, 6, 5, 3), (3, 5, 7)):
        c = shape[1]
        x = compat.as_tensor(rng.randn(*shape).astype(np.float32) * 2 + 0.5)
        w = compat.nn.Parameter(compat.as_tensor(rng.rand(c).astype(np.float32) + 0.5))
        b = compat.nn.Parameter(compat.as_tensor(rng.randn(c).astype(np.float32)))
        holder = compat.nn.Module()  # graphs need unique Parameter names: prepare() gives the attribute names
        setattr(holder, "in_w_%d" % len(shape), w)
        setattr(holder, "in_b_%d" % len(shape), b)
        compat.jit.prepare(holder)
        scale = compat.as_tensor(rng.randn(*shape).astype(np.float32))

        def loss_fn(inp):
            return (compat.instance_norm(inp, w, b) * scale).sum()

        def plain(inp):
            return compat.instance_norm(inp)

        for fn in (loss_fn, plain):
            ref = compat.to_numpy(fn(x))
            got = compat.to_numpy(compat.jit.compiled(fn, "test_in_%s_%d" % (fn.__name__, len(shape)))(x))
            np.testing.assert_array_equal(got, ref, err_msg=fn.__name__)
        def loss_and_aux(inp):
            loss = loss_fn(inp)
            return loss, {"loss": loss}

        _, _, ref_grads = compat.value_and_grad(loss_fn, [w, b])(x)
        _, _, got_grads = compat.jit.value_and_grad(loss_and_aux, [w, b], "test_in_grad_%d" % len(shape))(x)
        for name, r, g in zip(("weight", "bias"), ref_grads, got_grads):
            np.testing.assert_allclose(compat.to_numpy(g), compat.to_numpy(r), rtol=1e-6, atol=1e-6, err_msg=name)


def test_compiled_step_hands_the_running_statistics_update_out_and_adds_it():
    """A training-mode batch norm (mode 'general') in a differentiated graph (`compat.jit.value_and_grad` with the
    running statistics as `state`): the loss, the gradients and the running statistics after the call equal op by
    op's (`compat.value_and_grad`, which updates them as torch does); `update_state=False` (the shared step graph's
    meta-train calls, BN mode 'hold') leaves the statistics as they were, the gradients the same."""
    import compat
    if not compat.IS_MINDSPORE:
        pytest.skip("compiled execution exists on MindSpore only")
    rng = np.random.RandomState(7)
    x = compat.as_tensor(rng.randn(6, 4, 5, 3).astype(np.float32) * 2 + 0.5)
    scale = compat.as_tensor(rng.randn(6, 4, 5, 3).astype(np.float32))
    mean0, var0 = rng.randn(4).astype(np.float32), rng.rand(4).astype(np.float32) + 0.5
    w0, b0 = rng.rand(4).astype(np.float32) + 0.5, rng.randn(4).astype(np.float32)

    def module(tag):
        holder = compat.nn.Module()  # graphs need unique names: prepare() gives the attribute names
        holder.register_parameter("w", compat.nn.Parameter(compat.as_tensor(w0.copy())))
        holder.register_parameter("b", compat.nn.Parameter(compat.as_tensor(b0.copy())))
        holder.register_buffer("rm", compat.jit.state_buffer(mean0))
        holder.register_buffer("rv", compat.jit.state_buffer(var0))
        outer = compat.nn.Module()
        setattr(outer, "tap_" + tag, holder)
        compat.jit.prepare(outer)
        return holder

    ref_mod = module("eager")
    got_mod = module("graph")

    def loss_of(m):
        def loss_and_aux(inp):
            loss = (compat.batch_norm(inp, m.rm, m.rv, m.w, m.b, "general", 0.1, 1e-5) * scale).sum()
            return loss, {"loss": loss}
        return loss_and_aux

    ref_loss, _, ref_grads = compat.value_and_grad(loss_of(ref_mod), [ref_mod.w, ref_mod.b])(x)
    step = compat.jit.value_and_grad(loss_of(got_mod), [got_mod.w, got_mod.b], "test_bn_state",
                                     state=[got_mod.rm, got_mod.rv])
    for update in (False, True):
        loss, _, grads = step(x, update_state=update)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
        for name, r, g in zip(("weight", "bias"), ref_grads, grads):
            np.testing.assert_allclose(compat.to_numpy(g), compat.to_numpy(r), rtol=1e-5, atol=1e-5, err_msg=name)
        want = [compat.to_numpy(t) for t in (ref_mod.rm, ref_mod.rv)] if update else [mean0, var0]
        for name, t, w in zip(("running_mean", "running_var"), (got_mod.rm, got_mod.rv), want):
            np.testing.assert_allclose(compat.to_numpy(t), w, rtol=1e-6, atol=1e-7, err_msg=name)
    assert np.abs(compat.to_numpy(ref_mod.rm) - mean0).max() > 1e-2  # op by op moved them: the check has teeth


def case_recorded_ops():
    """Primitive names MindSpore runs in each of three calls of one op-by-op differentiated function holding a
    training-mode batch norm, in a process where no batch norm ran before."""
    import compat
    from mindspore.common.api import _pynative_executor
    rng = np.random.RandomState(0)
    weight = compat.nn.Parameter(compat.as_tensor(rng.rand(3).astype(np.float32) + 0.5))
    bias = compat.nn.Parameter(compat.as_tensor(np.zeros(3, np.float32)))
    rm, rv = compat.state_buffer(np.zeros(3)), compat.state_buffer(np.ones(3))

    def bn_loss(inp):
        return (compat.batch_norm(inp, rm, rv, weight, bias, "general", 0.1, 1e-5) ** 2).sum()

    step = compat.value_and_grad(bn_loss, [weight, bias])
    executor = type(_pynative_executor)
    original = executor.run_op_async
    calls = []

    def recording(self, prim, *rest):   # MindSpore 2.7 passes (prim, name, args)
        calls[-1].append(prim.name)
        return original(self, prim, *rest)
    executor.run_op_async = recording
    try:
        for _ in range(3):
            calls.append([])
            step(compat.as_tensor(rng.randn(4, 3, 2, 2).astype(np.float32)))
    finally:
        executor.run_op_async = original
    return {"calls": calls}


def test_first_differentiated_call_records_the_same_ops_as_later_ones():
    """MindSpore's PyNative grad executor compares each call's op sequence with the previous call's; a
    difference (here: the batch-norm kernel probe, run lazily on the first training-mode batch norm) switches
    the function to its dynamic path, which rebuilds and recompiles the backward graph on every later call
    (the demo basic step was 2.4x slower). compat.value_and_grad runs the probe before the first recorded call;
    a fresh process, because the probe runs once per process."""
    import compat
    if not compat.IS_MINDSPORE:
        pytest.skip("MindSpore's grad executor")
    import pickle
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="fresh-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as fh:
            pickle.dump([("tests.test_compat_norm:case_recorded_ops", {})], fh, protocol=4)
        proc = subprocess.run([sys.executable, str(root / "tests" / "_crossenv_child.py"), str(src), str(dst)],
                              cwd=str(root), env=child_env(), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        with open(dst, "rb") as fh:
            calls = pickle.load(fh)[0]["calls"]
    assert "BatchNorm" in calls[0]
    assert calls[0] == calls[1] == calls[2]
