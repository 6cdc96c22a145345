"""compat.max_pool2d_ceil (the stem's ceil-mode pooling) against real torch F.max_pool2d(ceil_mode=True):
values and input gradients, op by op on both backends and compiled on MindSpore, on maps whose ceil-mode
windows hang over the bottom / right edge and on maps where they do not."""
import numpy as np
import pytest

from tests.crossenv import run_cases

SHAPES = [(2, 3, 9, 7), (2, 3, 8, 8), (1, 2, 10, 11), (2, 4, 16, 8)]


def _data(shape, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(*shape).astype(np.float32) - 1.0     # mostly negative: a zero padding would show
    out_shape = shape[:2] + tuple(-(-(s - 3) // 2) + 1 for s in shape[2:])
    return x, rng.randn(*out_shape).astype(np.float32)


def case_compat(shape, compiled=False):
    import compat
    x, w = _data(shape)
    xt, wt = compat.as_tensor(x), compat.as_tensor(w)

    def pooled(inp):
        return compat.max_pool2d_ceil(inp, 3, 2)

    def loss_fn(inp):
        return (pooled(inp) * wt).sum()

    if compiled:
        y = compat.jit.compiled(pooled, "test_pool_%d_%d" % shape[2:])(xt)
        return dict(y=compat.to_numpy(y))
    xp = compat.nn.Parameter(xt)
    _, _, grads = compat.value_and_grad(lambda: loss_fn(xp), [xp])()
    return dict(y=compat.to_numpy(pooled(xt)), grad=compat.to_numpy(grads[0]))


def case_reference(shape):
    import torch
    import torch.nn.functional as F
    x, w = _data(shape)
    xt = torch.from_numpy(x).requires_grad_()
    y = F.max_pool2d(xt, 3, 2, 0, 1, True)
    (y * torch.from_numpy(w)).sum().backward()
    return dict(y=y.detach().numpy(), grad=xt.grad.numpy())


@pytest.fixture(scope="module")
def results():
    ref = run_cases("torch", [("tests.test_compat_functional:case_reference", dict(shape=s)) for s in SHAPES]
                    + [("tests.test_compat_functional:case_compat", dict(shape=s)) for s in SHAPES])
    ms = run_cases("mindspore", [("tests.test_compat_functional:case_compat", dict(shape=s)) for s in SHAPES])
    n = len(SHAPES)
    return dict(ref=ref[:n], torch=ref[n:], mindspore=ms)


@pytest.fixture(scope="module")
def compiled_results():
    """The compiled cases, asked for by the compiled tests alone."""
    return run_cases("mindspore", [("tests.test_compat_functional:case_compat", dict(shape=s, compiled=True))
                                   for s in SHAPES])


@pytest.mark.parity
@pytest.mark.parametrize("index", range(len(SHAPES)), ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("kind", ["mindspore", "compiled", "torch"])
def test_max_pool2d_ceil_matches_torch(results, request, kind, index):
    ref = results["ref"][index]
    got = request.getfixturevalue("compiled_results")[index] if kind == "compiled" else results[kind][index]
    assert got["y"].shape == ref["y"].shape
    np.testing.assert_array_equal(got["y"], ref["y"])
    if "grad" in got:
        np.testing.assert_allclose(got["grad"], ref["grad"], rtol=1e-6, atol=1e-6)
