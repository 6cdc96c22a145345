"""The trainer against the method's rules (docs/architecture.md "Engine contract", docs/method.md#training),
not against the other backend: a rule both backends get wrong fails here.

* fast-weight steps: α·r·g with α the meta optimizer's lr of the iteration, r = 0.5 for `adaptor` parameters;
* one meta step == a plain first-order MAML step written independently with real torch autograd
  (autograd.grad, detached g, torch.func.functional_call at θ - α·r·g, SGD without momentum);
* `objective` == the weighted sum of loop reference losses (tests/test_losses.py) per step kind, whole batch
  and per DataParallel chunk;
* DataParallel emulation at trainer level: an absent domain's classifier stays bit-identical with
  NUM_SPLITS 1 and receives exactly weight decay with NUM_SPLITS 4.
"""
import math

import numpy as np
import pytest

from tests.crossenv import run_cases
from tests.parity import assert_update_matches, update_errors
from tests.test_training import NO_AUG, _cfg

# the spec's loss weights (docs/method.md section 3), written here rather than read from the config so that a wrong
# default fails too
CE_SCALE, CENTER_BASIC, CENTER_MTEST, TRI_MARGIN = 0.5, 5e-4, 1e-3, 0.3


def _trainer(root, out, extra=()):
    from reid.engine.trainer import Trainer
    return Trainer(_cfg(root, out, list(NO_AUG) + list(extra)), quiet=True)


def _is_adaptor(name):
    """Parameters of modules whose name contains `adaptor` (the CODE blocks' static and dynamic branches)."""
    return any("adaptor" in part for part in name.split(".")[:-1])


def _spec_lr(cfg, iters_per_epoch, it):
    """The lr in effect at iteration `it` by fast-reid's rules: linear warmup per iteration over WARMUP_EPOCHS,
    then cosine per epoch, the first post-warmup epoch at cosine step 1."""
    s = cfg.SOLVER
    warmup = s.WARMUP_EPOCHS * iters_per_epoch
    if it < warmup:
        a = it / warmup
        return s.BASE_LR * (s.WARMUP_FACTOR * (1 - a) + a)
    step = it // iters_per_epoch - s.WARMUP_EPOCHS + 1
    cosine = math.cos(math.pi * step / (s.MAX_EPOCH - s.WARMUP_EPOCHS))
    return s.ETA_MIN_LR + (s.BASE_LR - s.ETA_MIN_LR) * (1 + cosine) / 2


def test_spec_defaults():
    """The recipe's constants that the rules below take from the config."""
    from reid.config import get_cfg
    cfg = get_cfg()
    assert cfg.MODEL.BACKBONE.ADAPTOR_STEP_RATIO == 0.5 and cfg.SOLVER.META_MOMENTUM == 0.0
    assert cfg.SOLVER.MOMENTUM == 0.9 and cfg.SOLVER.WEIGHT_DECAY == 5e-4
    losses = cfg.MODEL.LOSSES
    assert (losses.CE.SCALE, losses.CE.EPSILON, losses.TRI.SCALE, losses.TRI.MARGIN) == (CE_SCALE, 0.1, 1.0, TRI_MARGIN)
    assert (losses.CENTER.SCALE, losses.CENTER.META_SCALE, losses.SCT.SCALE) == (CENTER_BASIC, CENTER_MTEST, 1.0)
    assert (losses.CLUSTER.INTRA_MARGIN, losses.CLUSTER.INTER_MARGIN, losses.CLUSTER.CENTROID) == (0.1, 0.3, "scalar")


def test_fast_weight_steps_are_lr_times_ratio(synth_root, tmp_path):
    """On unit gradients, fast_weight_steps gives lr_at(iter)·(0.5 for adaptor parameters, else 1), with
    lr_at(iter) the meta optimizer's lr of that iteration (warmup and cosine iterations)."""
    import compat
    t = _trainer(synth_root, str(tmp_path / "fw"))
    names = t.param_names
    assert 0 < sum(map(_is_adaptor, names)) < len(names)
    ones = [compat.torch.ones(*tuple(p.shape)) for p in t.params]
    for it in (0, 1, 3, 5, 9, 14):
        t.iter = it
        t.set_lr(it)
        alpha = _spec_lr(t.cfg, t.iters_per_epoch, it)
        for g in t.optimizer_meta.param_groups:
            assert g["lr"] / g["lr_factor"] == pytest.approx(alpha, rel=1e-9)
        assert all(g["momentum"] == 0.0 for g in t.optimizer_meta.param_groups)
        steps = [compat.to_numpy(s) for s in t.fast_weight_steps(ones)]
        for name, step in zip(names, steps):
            want = alpha * (0.5 if _is_adaptor(name) else 1.0)
            np.testing.assert_allclose(step, want, rtol=1e-6, err_msg="iteration %d, %s" % (it, name))


# ------------------------------------------------------------------------- one meta step vs first-order MAML
META_ITER = 6          # a meta iteration after the warmup (TINY: 4 iterations per epoch, 1 warmup epoch)
META_EXTRA = ["SOLVER.BASE_LR", "0.2"]   # a larger step makes θ' = θ - α·r·g matter in the meta-test loss


def _fixed_domain_batches(trainer):
    """Replace the per-domain streams by one fixed batch each and record the order they are drawn in."""
    batches = [next(s) for s in trainer.data.domains]
    order = []

    def stream(d):
        while True:
            order.append(d)
            yield batches[d]
    trainer.data.domains = [stream(d) for d in range(len(batches))]
    return batches, order


def case_meta_step(root, out, weights, ratio=None, reference=False, save_fast=None, load_fast=None):
    """One meta step of the trainer from `weights` at META_ITER on fixed per-domain batches; returns the
    trainable weights before and after, the domains in drawing order (meta-train ..., meta-test) and the
    fast-weight steps it computed. save_fast / load_fast: write its fast-weight steps to / take them from a
    file (teacher forcing, as in tests/test_training.py). reference=True (torch only): also the same step
    computed by `_maml_reference`."""
    import compat
    extra = META_EXTRA + ["MODEL.WEIGHTS", weights, "MODEL.NUM_SPLITS", "1"]
    if ratio is not None:
        extra += ["MODEL.BACKBONE.ADAPTOR_STEP_RATIO", str(ratio)]
    t = _trainer(root, out, extra)
    batches, order = _fixed_domain_batches(t)
    own_steps, computed = t.fast_weight_steps, []

    def fast_weight_steps(grads):
        # first-order: on torch the meta-train gradients arrive without a graph (fast_weight_steps does not
        # detach them). MindSpore has no tape to check (its tensors report requires_grad True): there the step
        # functions differentiate with respect to the parameters they are given only.
        if not compat.IS_MINDSPORE:
            assert not any(g.requires_grad for g in grads)
        steps = [compat.to_numpy(s) for s in own_steps(grads)]
        computed.append(np.concatenate([s.ravel() for s in steps]))
        if save_fast:
            compat.checkpoint.save(steps, save_fast)
        return [compat.as_tensor(a) for a in (compat.checkpoint.load(load_fast) if load_fast else steps)]
    t.fast_weight_steps = fast_weight_steps
    state = compat.checkpoint.state_dict(t.model) if reference else None
    before = {n: compat.to_numpy(p).copy() for n, p in zip(t.param_names, t.params)}
    t.iter = META_ITER
    lr = t.set_lr(META_ITER)
    t.meta_step()
    after = {n: compat.to_numpy(p).copy() for n, p in zip(t.param_names, t.params)}
    res = dict(before=before, after=after, order=list(order), lr=lr, fast_steps=computed)
    if reference:
        compat.checkpoint.load_state_dict(t.model, state)
        res["reference"] = _maml_reference(t, batches, order[:-1], order[-1], lr)
    return res


def _maml_reference(trainer, batches, train_domains, test_domain, lr):
    """First-order MAML as the spec states it, in plain torch: g = ∇L_mtr(θ) detached; θ' = θ - α·r·g with
    α = lr and r = 0.5 for adaptor parameters; update θ ← θ - lr·(∇θL_mtr(θ) + ∇θ'L_mte(θ') + wd·θ) (SGD,
    no momentum) for every parameter with a gradient, the others untouched (single device)."""
    import torch
    from reid.engine.objectives import objective
    from reid.modeling import bn_mode
    model, cfg = trainer.model, trainer.cfg
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    mtr = {k: torch.cat([batches[d][k] for d in sorted(train_domains)], 0) for k in ("images", "targets", "domains")}
    mte = batches[test_domain]
    with bn_mode(model, "hold"):
        loss_mtr, _ = objective("mtrain", model(mtr["images"]), mtr, cfg, trainer.offsets, 1)
    g = torch.autograd.grad(loss_mtr, params, allow_unused=True, retain_graph=True)
    fast = {n: p if gi is None else p - lr * (0.5 if _is_adaptor(n) else 1.0) * gi.detach()
            for (n, p), gi in zip(named, g)}
    with bn_mode(model, "hold"):
        out = torch.func.functional_call(model, fast, (mte["images"],), strict=False)
        loss_mte, _ = objective("mtest", out, mte, cfg, trainer.offsets, 1)
    total = torch.autograd.grad(loss_mtr + loss_mte, params, allow_unused=True)
    wd = cfg.SOLVER.WEIGHT_DECAY
    with torch.no_grad():
        return {n: (p if gi is None else p - lr * (gi + wd * p)).numpy().copy() for (n, p), gi in zip(named, total)}


@pytest.fixture(scope="module")
def meta_weights(synth_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("meta")
    path = str(tmp / "init.pth")
    run_cases("torch", [("tests.test_training:case_initial_weights", dict(root=synth_root, out=str(tmp / "i"),
                                                                         path=path, extra=META_EXTRA))])
    return path, tmp


@pytest.fixture(scope="module")
def maml(synth_root, meta_weights):
    """The torch trainer's meta step, the MAML reference, and the trainer with r = 1 everywhere."""
    path, tmp = meta_weights
    kw = dict(root=synth_root, weights=path)
    return run_cases("torch", [("tests.test_training_spec:case_meta_step", dict(kw, out=str(tmp / "r"), reference=True,
                                                                              save_fast=str(tmp / "fast.pth"))),
                               ("tests.test_training_spec:case_meta_step", dict(kw, out=str(tmp / "w"), ratio=1.0))])


# The reference runs in the torch environment; these run from the MindSpore one (parity marker) because the
# MindSpore comparison below needs the same fixture: one run of it per suite.
@pytest.mark.parity
def test_meta_step_is_first_order_maml(maml):
    """torch trainer == the independent reference to float32 rounding (same ops, different code path)."""
    good, _ = maml
    assert len(good["order"]) == 3 and sorted(good["order"]) == [0, 1, 2]
    total, per = assert_update_matches(good["before"], good["after"], good["reference"], 1e-4, 1e-3, "meta step")
    moved = [n for n in per if np.any(good["reference"][n] != good["before"][n])]
    assert len(moved) > 0.9 * len(per)       # everything but the classifiers moved
    assert all(n.startswith("heads.classifiers.") for n in set(per) - set(moved))


@pytest.mark.parity
def test_a_wrong_step_ratio_fails_the_maml_comparison(maml):
    """The comparison above sees r: with r = 1 for every parameter the update is off by far more than its bound
    (measured: 0.29 against 6e-8 for the right rule)."""
    good, wrong = maml
    assert wrong["order"] == good["order"]
    total, per = update_errors(good["before"], wrong["after"], good["reference"])
    assert total > 1e-2, total
    with pytest.raises(AssertionError):
        assert_update_matches(good["before"], wrong["after"], good["reference"], 1e-4, 1e-3)


@pytest.mark.parity
def test_mindspore_meta_step_matches_the_maml_reference(synth_root, meta_weights, maml):
    """The MindSpore trainer's meta step from the same weights and batches against the torch reference, at the
    bounds of the teacher-forced training parity (tests/test_training.py). Teacher-forced in the same way:
    the meta-test loss at θ' is so sensitive to θ' here (lr 0.2) that scaling torch's own fast-weight step by
    1.001 moves its update by 9%, so MindSpore takes torch's step α·r·g, and its own must agree with it in
    direction (cosine > 0.999) and length (1%)."""
    from tests.test_training import STEP_TENSOR_TOL, STEP_TOTAL_TOL
    path, tmp = meta_weights
    good, _ = maml
    ms = run_cases("mindspore", [("tests.test_training_spec:case_meta_step",
                                  dict(root=synth_root, weights=path, out=str(tmp / "ms"),
                                       load_fast=str(tmp / "fast.pth")))])[0]
    assert ms["order"] == good["order"]
    for n in good["before"]:
        np.testing.assert_array_equal(ms["before"][n], good["before"][n])
    (got,), (ref,) = ms["fast_steps"], good["fast_steps"]
    cosine = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert cosine > 0.999 and abs(np.linalg.norm(got) / np.linalg.norm(ref) - 1) < 0.01, cosine
    total, per = assert_update_matches(good["before"], ms["after"], good["reference"], STEP_TOTAL_TOL,
                                       STEP_TENSOR_TOL, "MindSpore meta step vs MAML reference")
    print("MindSpore meta step vs MAML reference: update relative error %.3g overall, %.3g worst tensor"
          % (total, max(per.values())))


# ----------------------------------------------------------------------------------- objective per step kind
def _objective_inputs(kind, seed=0):
    """A 16-sample batch of model outputs: basic mixes 3 domains, mtrain is [domain 0 x 8 | domain 2 x 8]
    (each DataParallel chunk of 4 single-domain, as in the original), mtest one domain."""
    rng = np.random.RandomState(seed)
    widths, offsets = [6, 5, 4], [0, 6, 11]
    if kind == "basic":
        domains = np.array([0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 0, 2, 2])
    elif kind == "mtrain":
        domains = np.array([0] * 8 + [2] * 8)
    else:
        domains = np.array([1] * 16)
    local = np.repeat(np.arange(8), 2) % np.array(widths)[domains]   # pairs of images per id
    local[8:] = (local[8:] + 1) % np.array(widths)[domains[8:]]      # every chunk of 4 has 2 ids
    targets = local + np.array(offsets)[domains]
    feat = rng.randn(16, 8)
    out = dict(feat_norm=(feat / np.linalg.norm(feat, axis=1, keepdims=True)).astype(np.float32),
               logits=[(rng.randn(16, w) * 2).astype(np.float32) for w in widths],
               center_dist=(rng.rand(16, sum(widths)) * 3).astype(np.float32),
               paths=(rng.rand(16, 16) + 0.05).astype(np.float32))
    return out, targets.astype(np.int64), domains.astype(np.int64), offsets


def _reference_objective(kind, out, targets, domains, offsets):
    from tests.test_losses import np_ce, np_center, np_inter, np_intra, np_sct, np_triplet
    f, p = out["feat_norm"], out["paths"]
    cluster = np_intra(p, domains, 0.1) + np_inter(p, domains, 0.3)
    if kind == "basic":
        return (np_ce(out["logits"], targets, domains, offsets, 0.1, CE_SCALE)
                + np_triplet(f, targets, margin=TRI_MARGIN) + cluster
                + CENTER_BASIC * np_center(out["center_dist"], targets))
    if kind == "mtrain":
        return (np_triplet(f, targets, domains, "add", margin=0.0)
                + np_triplet(f, targets, domains, "mtrain", TRI_MARGIN) + np_sct(f, domains) + cluster)
    return (np_triplet(f, targets, domains, "mtest", TRI_MARGIN) + cluster
            + CENTER_MTEST * np_center(out["center_dist"], targets))


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("kind", ["basic", "mtrain", "mtest"])
def test_objective_is_the_weighted_sum_of_reference_losses(kind, splits):
    """objective(kind) == Σ weight·reference loss; with NUM_SPLITS 4 the mean over the 4 contiguous chunks of
    that sum (the original's DataParallel: each replica's losses on its own chunk)."""
    import compat
    from reid.config import get_cfg
    from reid.engine.objectives import objective
    out, targets, domains, offsets = _objective_inputs(kind)
    T = compat.as_tensor
    got, _ = objective(kind, {k: ([T(a) for a in v] if isinstance(v, list) else T(v)) for k, v in out.items()},
                       {"targets": T(targets), "domains": T(domains)}, get_cfg(), offsets, splits)
    size = 16 // splits
    chunks = [slice(i * size, (i + 1) * size) for i in range(splits)]
    want = np.mean([_reference_objective(kind, {k: ([a[c] for a in v] if isinstance(v, list) else v[c])
                                                for k, v in out.items()}, targets[c], domains[c], offsets)
                    for c in chunks])
    assert float(compat.to_numpy(got)) == pytest.approx(want, rel=1e-5, abs=1e-6)
    if splits == 4:        # the chunked objective really differs from the whole-batch one here
        assert abs(want - _reference_objective(kind, out, targets, domains, offsets)) > 1e-3


# ------------------------------------------------------------------ DataParallel emulation at trainer level
@pytest.mark.parametrize("splits", [1, 4])
def test_absent_domain_classifier_in_a_basic_step(synth_root, tmp_path, splits):
    """A basic batch of domains 0 and 1 only: with NUM_SPLITS 1 (single device) domain 2's classifier gets
    torch's `grad is None` and stays bit-identical; with 4 (DataParallel's materialised zero gradients) it
    receives exactly one step of weight decay, θ·(1 - lr·wd); the present domains' classifiers learn."""
    import compat
    t = _trainer(synth_root, str(tmp_path / "dp"), ["MODEL.NUM_SPLITS", str(splits)])
    parts = [next(t.data.domains[d]) for d in (0, 1)]
    batch = {k: compat.torch.cat([p[k] for p in parts], 0) for k in ("images", "targets", "domains")}
    t.data.combined = iter([batch])
    t.iter = 5
    lr = t.set_lr(5)
    before = {n: compat.to_numpy(p).copy() for n, p in zip(t.param_names, t.params)}
    t.basic_step()
    after = {n: compat.to_numpy(p) for n, p in zip(t.param_names, t.params)}
    absent = [n for n in before if n.startswith("heads.classifiers.2.")]
    present = [n for n in before if n.startswith(("heads.classifiers.0.", "heads.classifiers.1."))]
    assert absent and present
    for n in present:
        assert not np.allclose(after[n], before[n] * (1 - lr * t.cfg.SOLVER.WEIGHT_DECAY), rtol=1e-6, atol=0), n
    for n in absent:
        if splits == 1:
            np.testing.assert_array_equal(after[n], before[n], err_msg=n)
        else:
            decayed = before[n] * (1 - lr * t.cfg.SOLVER.WEIGHT_DECAY)
            assert not np.array_equal(after[n], before[n])
            np.testing.assert_allclose(after[n], decayed, rtol=1e-6, atol=1e-9, err_msg=n)
