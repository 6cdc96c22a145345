"""compat.optim.SGD, compat.clip_grad_norm and compat.value_and_grad against real torch (optim / autograd)."""
import numpy as np
import pytest

from tests.crossenv import run_cases

# Four param groups that exercise every SGD branch; shapes repeat across groups on purpose (shared buffers).
SHAPES = [(4, 3, 3, 3), (4,), (6, 4), (6,), (4,), (5, 2), (4,), (6, 4), (3,)]
GROUPS = [
    dict(idx=[0, 1], cfg=dict()),                                                      # defaults: mom .9, wd 5e-4
    dict(idx=[2, 3], cfg=dict(lr=0.05, nesterov=True, weight_decay=1e-3, name="heads")),
    dict(idx=[4, 5], cfg=dict(momentum=0.5, dampening=0.3, weight_decay=0.0, lr_factor=2.0)),
    dict(idx=[6, 7, 8], cfg=dict(momentum=0.0, weight_decay=1e-2)),
]
DEFAULTS = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
NEVER_GRAD = 8        # never gets a gradient: must stay bit-identical
STEPS, SPLIT, SET_LR_AT, NEW_LR = 50, 23, 30, 0.07


def _sgd_inputs(seed):
    rng = np.random.RandomState(seed)
    init = [rng.randn(*s).astype(np.float32) for s in SHAPES]
    grads = [[None if (i == NEVER_GRAD or rng.rand() < 0.2) else rng.randn(*s).astype(np.float32)
              for i, s in enumerate(SHAPES)] for _ in range(STEPS)]
    return init, grads


def _lr_for(group, lr):
    return lr * group["cfg"].get("lr_factor", 1.0)


def case_compat_sgd(seed):
    """compat.optim.SGD for STEPS steps, and the same run interrupted at SPLIT by a state_dict round trip
    through a checkpoint file into a fresh optimizer on fresh parameters."""
    import os
    import tempfile
    import compat
    from compat.optim import SGD
    init, grads = _sgd_inputs(seed)

    def build(values):
        params = [compat.nn.Parameter(compat.as_tensor(v)) for v in values]
        groups = [dict(g["cfg"], params=[params[i] for i in g["idx"]]) for g in GROUPS]
        return params, SGD(groups, **DEFAULTS)

    def run(params, opt, steps):
        order = [i for g in GROUPS for i in g["idx"]]  # opt.params is flattened in group order
        for step in steps:
            if step == SET_LR_AT:
                opt.set_lr(NEW_LR)
            g = grads[step]
            opt.step([None if g[i] is None else compat.as_tensor(g[i]) for i in order])
        return [compat.to_numpy(p).copy() for p in params]

    params, opt = build(init)
    full = run(params, opt, range(STEPS))
    state_full = opt.state_dict()

    params, opt = build(init)
    half = run(params, opt, range(SPLIT))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.pth")
        compat.checkpoint.save({"optimizer": opt.state_dict(), "params": half}, path)
        saved = compat.checkpoint.load(path)
    params2, opt2 = build(saved["params"])
    opt2.load_state_dict(saved["optimizer"])
    resumed = run(params2, opt2, range(SPLIT, STEPS))
    lrs = [g["lr"] for g in opt2.param_groups]
    buffers = {int(k): v["momentum_buffer"] for k, v in state_full["state"].items()}
    return dict(full=full, resumed=resumed, lrs=lrs, buffers=buffers,
                names=[g.get("name") for g in opt.param_groups])


def case_torch_sgd(seed):
    import torch
    init, grads = _sgd_inputs(seed)
    params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in init]
    groups = [dict({k: v for k, v in g["cfg"].items()}, params=[params[i] for i in g["idx"]]) for g in GROUPS]
    opt = torch.optim.SGD(groups, **DEFAULTS)
    for step in range(STEPS):
        if step == SET_LR_AT:
            for group, spec in zip(opt.param_groups, GROUPS):
                group["lr"] = _lr_for(spec, NEW_LR)
        for p, g in zip(params, grads[step]):
            p.grad = None if g is None else torch.from_numpy(g)
        opt.step()
    order = [i for g in GROUPS for i in g["idx"]]
    buffers = {}
    for k, p in enumerate(params[i] for i in order):
        state = opt.state.get(p, {})
        if state:
            buf = state.get("momentum_buffer")
            buffers[k] = None if buf is None else buf.numpy().copy()
    return dict(full=[p.detach().numpy().copy() for p in params], lrs=[g["lr"] for g in opt.param_groups],
                buffers=buffers)


# -- clip_grad_norm -------------------------------------------------------------------------------------
CLIP_CASES = [(2.0, 0.5), (2.0, 1e6), (1.0, 0.3), (float("inf"), 0.2), (3.0, 0.7)]


def _clip_grads(seed):
    rng = np.random.RandomState(seed)
    return [None if i == 2 else rng.randn(*s).astype(np.float32) for i, s in enumerate([(3, 4), (5,), (2,), (2, 2, 3)])]


def case_compat_clip(seed):
    import compat
    out = []
    for norm_type, max_norm in CLIP_CASES:
        grads = [None if g is None else compat.as_tensor(g) for g in _clip_grads(seed)]
        clipped, total = compat.clip_grad_norm(grads, max_norm, norm_type)
        out.append(dict(total=float(compat.to_numpy(total)),
                        clipped=[None if g is None else compat.to_numpy(g) for g in clipped]))
    return out


def case_torch_clip(seed):
    import torch
    out = []
    for norm_type, max_norm in CLIP_CASES:
        grads = _clip_grads(seed)
        params = [torch.nn.Parameter(torch.zeros(g.shape if g is not None else (2,))) for g in grads]
        for p, g in zip(params, grads):
            p.grad = None if g is None else torch.from_numpy(g.copy())
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        out.append(dict(total=float(total), clipped=[None if p.grad is None else p.grad.numpy() for p in params]))
    return out


# -- value_and_grad on a small conv net -----------------------------------------------------------------
def _net_inputs(seed):
    rng = np.random.RandomState(seed)
    w = dict(conv=rng.randn(6, 3, 3, 3).astype(np.float32) * 0.3, conv_b=rng.randn(6).astype(np.float32) * 0.1,
             bn_w=(rng.rand(6) + 0.5).astype(np.float32), bn_b=rng.randn(6).astype(np.float32) * 0.1,
             fc=rng.randn(5, 6).astype(np.float32) * 0.3, fc_b=rng.randn(5).astype(np.float32) * 0.1)
    x = rng.randn(4, 3, 10, 8).astype(np.float32)
    y = np.array([0, 3, 1, 4], np.int64)
    return w, x, y


NET_ORDER = ["conv", "conv_b", "bn_w", "bn_b", "fc", "fc_b"]


def case_compat_value_and_grad(seed):
    import compat
    from compat import F
    w, x, y = _net_inputs(seed)
    params = {k: compat.nn.Parameter(compat.as_tensor(v)) for k, v in w.items()}
    rm, rv = compat.as_tensor(np.zeros(6, np.float32)), compat.as_tensor(np.ones(6, np.float32))

    def loss_fn(inp, target):
        h = F.conv2d(inp, params["conv"], params["conv_b"], stride=1, padding=1)
        h = compat.batch_norm(h, rm, rv, params["bn_w"], params["bn_b"], "general", 0.1, 1e-5)
        h = F.max_pool2d(F.relu(h), 2, 2)
        h = F.adaptive_avg_pool2d(h, 1).reshape(inp.shape[0], -1)
        logits = F.linear(h, params["fc"], params["fc_b"])
        return F.cross_entropy(logits, target), logits

    loss, logits, grads = compat.value_and_grad(loss_fn, [params[k] for k in NET_ORDER])(
        compat.as_tensor(x), compat.as_tensor(y))
    return dict(loss=float(compat.to_numpy(loss)), logits=compat.to_numpy(logits),
                grads=[compat.to_numpy(g) for g in grads], rm=compat.to_numpy(rm), rv=compat.to_numpy(rv))


def case_torch_value_and_grad(seed):
    import torch
    import torch.nn.functional as F
    w, x, y = _net_inputs(seed)
    params = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in w.items()}
    rm, rv = torch.zeros(6), torch.ones(6)
    h = F.conv2d(torch.from_numpy(x), params["conv"], params["conv_b"], stride=1, padding=1)
    h = F.batch_norm(h, rm, rv, params["bn_w"], params["bn_b"], True, 0.1, 1e-5)
    h = F.adaptive_avg_pool2d(F.max_pool2d(F.relu(h), 2, 2), 1).flatten(1)
    logits = F.linear(h, params["fc"], params["fc_b"])
    loss = F.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    return dict(loss=float(loss), logits=logits.detach().numpy(), grads=[params[k].grad.numpy() for k in NET_ORDER],
                rm=rm.numpy(), rv=rv.numpy())


@pytest.fixture(scope="module")
def results():
    """Every case in one process per backend."""
    def compat_calls():
        return [("tests.test_compat_optim:case_compat_sgd", dict(seed=0)),
                ("tests.test_compat_optim:case_compat_clip", dict(seed=1)),
                ("tests.test_compat_optim:case_compat_value_and_grad", dict(seed=2))]
    ref_calls = [("tests.test_compat_optim:case_torch_sgd", dict(seed=0)),
                 ("tests.test_compat_optim:case_torch_clip", dict(seed=1)),
                 ("tests.test_compat_optim:case_torch_value_and_grad", dict(seed=2))]
    torch_side = run_cases("torch", ref_calls + compat_calls())
    ms_side = run_cases("mindspore", compat_calls())
    keys = ["sgd", "clip", "vag"]
    return dict(ref=dict(zip(keys, torch_side[:3])), torch=dict(zip(keys, torch_side[3:])),
                mindspore=dict(zip(keys, ms_side)))


BACKENDS = ["mindspore", "torch"]


@pytest.mark.parity
@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_matches_torch_optim(results, backend):
    ref, got = results["ref"]["sgd"], results[backend]["sgd"]
    for i, (a, b) in enumerate(zip(got["full"], ref["full"])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg="param %d" % i)
    assert np.array_equal(got["full"][NEVER_GRAD], _sgd_inputs(0)[0][NEVER_GRAD])  # None grad: untouched
    assert got["lrs"] == pytest.approx(ref["lrs"], rel=1e-12)
    assert got["names"] == [None, "heads", None, None]
    assert sorted(got["buffers"]) == sorted(ref["buffers"])
    for k, buf in ref["buffers"].items():
        if buf is None:
            assert got["buffers"][k] is None
        else:
            np.testing.assert_allclose(got["buffers"][k], buf, rtol=1e-6, atol=1e-6, err_msg="buffer %d" % k)
    # the run really moved the parameters (so the comparison above is not vacuous)
    assert np.abs(got["full"][0] - _sgd_inputs(0)[0][0]).max() > 0.1


@pytest.mark.parity
def test_sgd_torch_backend_is_bitwise_torch(results):
    for a, b in zip(results["torch"]["sgd"]["full"], results["ref"]["sgd"]["full"]):
        assert np.array_equal(a, b)


@pytest.mark.parity
@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_state_dict_round_trip_continues_identically(results, backend):
    got = results[backend]["sgd"]
    for a, b in zip(got["resumed"], got["full"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parity
@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_grad_norm_matches_torch(results, backend):
    for (norm_type, max_norm), ref, got in zip(CLIP_CASES, results["ref"]["clip"], results[backend]["clip"]):
        assert got["total"] == pytest.approx(ref["total"], rel=1e-6), (norm_type, max_norm)
        for a, b in zip(got["clipped"], ref["clipped"]):
            if b is None:
                assert a is None
            else:
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=str((norm_type, max_norm)))
    # the small max_norm cases really clipped, the huge one left the gradients as they were
    raw = _clip_grads(1)
    assert not np.allclose(results[backend]["clip"][0]["clipped"][0], raw[0])
    np.testing.assert_allclose(results[backend]["clip"][1]["clipped"][0], raw[0], rtol=1e-6)


@pytest.mark.parity
@pytest.mark.parametrize("backend", BACKENDS)
def test_value_and_grad_matches_torch_autograd(results, backend):
    ref, got = results["ref"]["vag"], results[backend]["vag"]
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
    for name, a, b in zip(NET_ORDER, got["grads"], ref["grads"]):
        assert np.abs(b).max() > 0, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(got["rm"], ref["rm"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["rv"], ref["rv"], rtol=1e-5, atol=1e-6)


# -- bad input (active backend, in process) -------------------------------------------------------------
def _params(n=2):
    import compat
    return [compat.nn.Parameter(compat.as_tensor(np.ones((2, 2), np.float32))) for _ in range(n)]


def test_sgd_rejects_bad_input():
    import compat
    from compat.optim import SGD
    with pytest.raises(compat.UserError, match="nesterov needs momentum > 0 and dampening = 0"):
        SGD(_params(), lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(compat.UserError, match="lr"):
        SGD(_params(), lr=-1.0)
    p = _params(1)
    with pytest.raises(compat.UserError, match="appears twice"):
        SGD([{"params": p}, {"params": p}], lr=0.1)
    opt = SGD(_params(), lr=0.1, momentum=0.9)
    with pytest.raises(compat.UserError, match="got 1 gradients for 2 parameters"):
        opt.step([None])
    with pytest.raises(compat.UserError, match=r"shape \(3,\) but its parameter has shape \(2, 2\)"):
        opt.step([compat.as_tensor(np.ones(3, np.float32)), None])
    other = SGD([{"params": _params(1)}, {"params": _params(1)}], lr=0.1)
    with pytest.raises(compat.UserError, match="2 param groups, this optimizer has 1"):
        opt.load_state_dict(other.state_dict())


def test_sgd_groups_keep_extra_keys_and_set_lr_scales_by_factor():
    from compat.optim import SGD
    opt = SGD([{"params": _params(1), "lr_factor": 0.5, "name": "a"}, {"params": _params(1), "lr": 3.0}],
              lr=0.2, weight_decay=1e-4)
    assert opt.param_groups[0]["name"] == "a" and opt.param_groups[1]["lr"] == 3.0
    assert opt.param_groups[0]["weight_decay"] == 1e-4
    opt.set_lr(0.4)
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.4]
    assert len(opt.params) == 2
