"""compat.schedules.LRSchedule against torch's schedulers stepped exactly as fast-reid's LRScheduler hook
steps them (ACL's trainer): main scheduler built first, warmup second; warmup stepped after every iteration
while iter + 1 <= warmup_iters; main scheduler stepped after every epoch (cosine only once
iter + 1 > warmup_iters, with the iteration counter already advanced past the epoch)."""
import math

import pytest

from tests.crossenv import run_cases

# (iters_per_epoch, max_epoch, warmup_epochs, warmup_factor, warmup_method, sched, eta_min, milestones, gamma)
GRID = []
for ipe in (1, 3):
    for warmup in (0, 1, 3):
        for method in ("linear", "constant"):
            GRID.append((ipe, 8, warmup, 0.01, method, "CosineAnnealingLR", 4e-5, (), 0.1))
            GRID.append((ipe, 8, warmup, 0.1, method, "MultiStepLR", 0.0, (2, 4, 4, 6), 0.5))
GRID.append((2, 5, 2, 0.05, "exp", "CosineAnnealingLR", 1e-3, (), 0.1))
GRID.append((4, 6, 2, 0.3, "linear", "MultiStepLR", 0.0, (1, 3), 0.1))   # milestone inside the warmup
ACL = (1214, 60, 10, 0.01, "linear", "CosineAnnealingLR", 4e-5, (30, 50), 0.1)   # docs/method.md#recipe, #schedule
BASE_LR = 0.04


def case_torch_hook_lrs(config, warmup_kind="lambda"):
    """lr in effect during every iteration, with torch schedulers driven like fast-reid's hook."""
    import torch
    ipe, max_epoch, warmup_epochs, factor, method, sched, eta_min, milestones, gamma = config
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    if sched == "CosineAnnealingLR":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max_epoch - warmup_epochs, eta_min=eta_min)
    else:
        main = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(milestones), gamma=gamma)
    warmup_iters = warmup_epochs * ipe
    warmup = None
    if warmup_iters > 0:
        if warmup_kind == "linear_lr":   # torch's own (chainable) linear warmup: same values without milestones
            warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=factor, end_factor=1.0,
                                                       total_iters=warmup_iters)
        else:                            # fast-reid's WarmupLR: base_lr * factor(k), closed form
            def warmup_factor(k):
                if k >= warmup_iters:
                    return 1.0
                if method == "constant":
                    return factor
                if method == "linear":
                    return factor * (1 - k / warmup_iters) + k / warmup_iters
                return factor ** (1 - k / warmup_iters)
            warmup = torch.optim.lr_scheduler.LambdaLR(opt, warmup_factor)
    lrs, it = [], 0
    for epoch in range(max_epoch):
        for _ in range(ipe):
            lrs.append(opt.param_groups[0]["lr"])            # run_step(it) uses this lr
            if it + 1 <= warmup_iters:                      # hook.after_step
                warmup.step()
            it += 1
        next_iter = it + 1                                  # hook.after_epoch (trainer.iter already advanced)
        if sched == "MultiStepLR" or next_iter > warmup_iters:
            main.step()
    return lrs


def _ours(config):
    from compat.schedules import LRSchedule
    ipe, max_epoch, warmup_epochs, factor, method, sched, eta_min, milestones, gamma = config
    schedule = LRSchedule(BASE_LR, ipe, max_epoch, warmup_epochs, factor, method, sched, eta_min, milestones, gamma)
    return schedule.lrs(range(ipe * max_epoch))


@pytest.fixture(scope="module")
def reference():
    calls = [("tests.test_compat_schedules:case_torch_hook_lrs", dict(config=c)) for c in GRID + [ACL]]
    calls += [("tests.test_compat_schedules:case_torch_hook_lrs", dict(config=c, warmup_kind="linear_lr"))
              for c in GRID if c[5] == "CosineAnnealingLR" and c[4] == "linear" and c[2] > 0]
    out = run_cases("torch", calls)
    return dict(zip([repr(c) for c in GRID + [ACL]], out[:len(GRID) + 1]), linear_lr=out[len(GRID) + 1:])


def _assert_same(ours, ref):
    assert len(ours) == len(ref)
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0), "iteration %d: %r != %r" % (i, a, b)


@pytest.mark.parity
@pytest.mark.parametrize("config", GRID, ids=["ipe%d-w%d-%s-%s" % (c[0], c[2], c[4], c[5][:6]) for c in GRID])
def test_schedule_matches_torch_hook_stepping(reference, config):
    _assert_same(_ours(config), reference[repr(config)])


@pytest.mark.parity
def test_linear_warmup_also_equals_torch_linear_lr(reference):
    configs = [c for c in GRID if c[5] == "CosineAnnealingLR" and c[4] == "linear" and c[2] > 0]
    assert len(configs) == len(reference["linear_lr"]) > 0
    for config, ref in zip(configs, reference["linear_lr"]):
        _assert_same(_ours(config), ref)


@pytest.mark.parity
def test_full_acl_schedule(reference):
    ours = _ours(ACL)
    _assert_same(ours, reference[repr(ACL)])
    # known answers from the spec: 72,840 iterations; warmup from 4e-4 to 0.04 over 12,140; eta_min 4e-5 at the end
    assert len(ours) == 72840
    assert ours[0] == pytest.approx(4e-4, rel=1e-12)
    assert ours[12139] == pytest.approx(0.04 * (0.01 * (1 / 12140) + 12139 / 12140), rel=1e-12)
    assert ours[12140] == pytest.approx(4e-5 + (0.04 - 4e-5) * (1 + math.cos(math.pi / 50)) / 2, rel=1e-12)
    assert ours[-1] == pytest.approx(4e-5, rel=1e-12)


def test_lr_schedule_pure_helpers_and_errors():
    import compat
    from compat.schedules import LRSchedule, cosine_lr, multistep_lr, warmup_factor_at
    assert warmup_factor_at(0, 10, 0.1, "linear") == 0.1
    assert warmup_factor_at(5, 10, 0.1, "linear") == pytest.approx(0.55)
    assert warmup_factor_at(10, 10, 0.1, "constant") == 1.0
    assert cosine_lr(1.0, 0, 5, 0.1) == 1.0 and cosine_lr(1.0, 5, 5, 0.1) == pytest.approx(0.1)
    assert multistep_lr(1.0, 4, (2, 4, 4), 0.5) == 0.125
    sched = LRSchedule(0.1, 2, 4, 0, sched="MultiStepLR", milestones=(2,), gamma=0.1)
    assert sched.lrs(range(8)) == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01])
    with pytest.raises(compat.UserError, match="MAX_EPOCH"):
        LRSchedule(0.1, 10, 5, warmup_epochs=5)
    with pytest.raises(compat.UserError, match="warmup method"):
        LRSchedule(0.1, 10, 5, warmup_method="cubic")
    with pytest.raises(compat.UserError, match="SOLVER.SCHED"):
        LRSchedule(0.1, 10, 5, sched="OneCycle")
    with pytest.raises(compat.UserError, match="iteration"):
        sched.lr_at(-1)
