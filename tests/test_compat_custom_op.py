"""compat.custom_op: a gradient-reversal layer and a two-input op with a hand-written backward, on both
backends, against real torch autograd (the reversal is checked against the analytic -lambda * plain grads)."""
import numpy as np
import pytest

from tests.crossenv import run_cases

LAMBDA = 0.7
ORDER = ["w1", "b1", "w2", "b2", "scale"]


def _inputs(seed):
    rng = np.random.RandomState(seed)
    w = dict(w1=rng.randn(5, 4).astype(np.float32) * 0.5, b1=rng.randn(5).astype(np.float32) * 0.1,
             w2=rng.randn(3, 5).astype(np.float32) * 0.5, b2=rng.randn(3).astype(np.float32) * 0.1,
             scale=(rng.rand(5) + 0.5).astype(np.float32))
    return w, rng.randn(6, 4).astype(np.float32), np.array([0, 2, 1, 1, 0, 2], np.int64)


def case_compat(seed):
    """Gradients of CE(lin2(mul(grl(relu(lin1(x))), scale))) with the custom ops and with plain autodiff."""
    import compat
    from compat import F
    w, x, y = _inputs(seed)
    params = {k: compat.nn.Parameter(compat.as_tensor(v)) for k, v in w.items()}
    # forward returns its input as-is: the hardest case for torch (needs a new autograd node)
    grl = compat.custom_op(lambda t: t, lambda inputs, out, g: (g * -LAMBDA,))
    # d(x*s)/dx = s, d(x*s)/ds = sum over the batch of g*x; the x-gradient is left to None on purpose below
    mul = compat.custom_op(lambda t, s: t * s, lambda inputs, out, g: (g * inputs[1], (g * inputs[0]).sum(0)))
    mul_no_x_grad = compat.custom_op(lambda t, s: t * s, lambda inputs, out, g: (None, (g * inputs[0]).sum(0)))

    def head(h, multiply):
        return F.cross_entropy(F.linear(multiply(h, params["scale"]), params["w2"], params["b2"]),
                               compat.as_tensor(y))

    def with_ops(inp):
        return head(grl(F.relu(F.linear(inp, params["w1"], params["b1"]))), mul)

    def plain(inp):
        return head(F.relu(F.linear(inp, params["w1"], params["b1"])), lambda h, s: h * s)

    def cut(inp):  # None gradient for the op's first input: nothing reaches lin1
        return head(F.relu(F.linear(inp, params["w1"], params["b1"])), mul_no_x_grad)

    out = {}
    for name, fn in (("ops", with_ops), ("plain", plain), ("cut", cut)):
        loss, _, grads = compat.value_and_grad(fn, [params[k] for k in ORDER])(compat.as_tensor(x))
        out[name] = dict(loss=float(compat.to_numpy(loss)), grads=[compat.to_numpy(g) for g in grads])
    return out


def case_torch_reference(seed):
    import torch
    import torch.nn.functional as F
    w, x, y = _inputs(seed)
    params = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in w.items()}
    h = F.relu(F.linear(torch.from_numpy(x), params["w1"], params["b1"]))
    loss = F.cross_entropy(F.linear(h * params["scale"], params["w2"], params["b2"]), torch.from_numpy(y))
    loss.backward()
    return dict(loss=float(loss), grads=[params[k].grad.numpy() for k in ORDER])


@pytest.fixture(scope="module")
def results():
    torch_side = run_cases("torch", [("tests.test_compat_custom_op:case_torch_reference", dict(seed=4)),
                                     ("tests.test_compat_custom_op:case_compat", dict(seed=4))])
    ms_side = run_cases("mindspore", [("tests.test_compat_custom_op:case_compat", dict(seed=4))])
    return dict(ref=torch_side[0], torch=torch_side[1], mindspore=ms_side[0])


@pytest.mark.parity
@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_gradient_reversal_gives_reversed_gradient(results, backend):
    ref, got = results["ref"], results[backend]
    assert got["ops"]["loss"] == pytest.approx(ref["loss"], rel=1e-6)   # forward is the identity
    for i, name in enumerate(ORDER):
        before_grl = name in ("w1", "b1")
        expected = ref["grads"][i] * (-LAMBDA if before_grl else 1.0)
        np.testing.assert_allclose(got["ops"]["grads"][i], expected, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got["plain"]["grads"][i], ref["grads"][i], rtol=1e-5, atol=1e-6, err_msg=name)
        if before_grl:  # the custom backward really replaced autodiff
            assert np.abs(ref["grads"][i]).max() > 1e-3
            assert not np.allclose(got["ops"]["grads"][i], got["plain"]["grads"][i], atol=1e-4)


@pytest.mark.parity
@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_none_gradient_means_zero(results, backend):
    got = results[backend]["cut"]["grads"]
    ref = results["ref"]["grads"]
    assert np.all(got[0] == 0) and np.all(got[1] == 0)
    for i in (2, 3, 4):
        np.testing.assert_allclose(got[i], ref[i], rtol=1e-5, atol=1e-6)


def test_custom_op_rejects_bad_use():
    import compat
    with pytest.raises(compat.UserError, match="two callables"):
        compat.custom_op(lambda t: t, None)
    op = compat.custom_op(lambda t, k: t * k, lambda inputs, out, g: (g, None))
    with pytest.raises(compat.UserError, match="input 1 is a float; pass tensors only"):
        op(compat.as_tensor(np.ones(2, np.float32)), 2.0)
