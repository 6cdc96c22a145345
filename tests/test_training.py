"""The ACL trainer end to end at a tiny size: MindSpore vs torch loss trajectories, exact resume, NaN stop,
learning on a fixed batch, and the user-facing errors of train.py / test.py."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.crossenv import ROOT, run_cases

# Augmentation off so that both backends see identical pixels; 3 tiny synthetic domains -> the 4th.
TINY = ["MODEL.BACKBONE.BASE_WIDTH", "8", "INPUT.SIZE_TRAIN", "[64,32]", "INPUT.SIZE_TEST", "[64,32]",
        "DATASETS.NAMES", "['SynthA','SynthB','SynthC']", "DATASETS.TESTS", "['SynthD']",
        "DATASETS.SYNTHETIC.NUM_IDS", "16", "SOLVER.IMS_PER_BATCH", "16", "META.IMS_PER_DOMAIN", "8",
        "SOLVER.MAX_EPOCH", "5", "SOLVER.ITERS_PER_EPOCH", "4", "SOLVER.WARMUP_EPOCHS", "1",
        "SOLVER.CHECKPOINT_PERIOD", "1", "TEST.EVAL_PERIOD", "0", "DATALOADER.NUM_WORKERS", "0", "LOG_PERIOD", "1",
        "META.INITIAL_BASIC_STEPS", "2"]  # the recipe's 10 warm-up steps at iteration 0 only cost test time
NO_AUG = ["INPUT.AUTOAUG.ENABLED", "False", "INPUT.FLIP.ENABLED", "False", "INPUT.PADDING.ENABLED", "False",
          "INPUT.CJ.ENABLED", "False", "INPUT.REA.ENABLED", "False"]


def _cfg(root, out, extra=()):
    from reid.config import load_cfg
    return load_cfg(str(ROOT / "configs" / "synthetic" / "acl.yml"),
                    TINY + ["DATASETS.ROOT", root, "OUTPUT_DIR", out] + list(extra))


def _trainer(root, out, extra=(), resume=False):
    from reid.engine.trainer import Trainer
    return Trainer(_cfg(root, out, extra), resume=resume, quiet=True)


def case_initial_weights(root, out, path, extra=()):
    """Build the tiny model once (torch) and save its weights, so both backends start from them."""
    import compat
    trainer = _trainer(root, out, extra)
    compat.checkpoint.save(compat.checkpoint.state_dict(trainer.model), path)
    return {"num_classes": np.array(trainer.data.num_classes)}


def _step_state(trainer):
    import compat
    rng = trainer.meta_rng.get_state()
    return {"model": compat.checkpoint.state_dict(trainer.model), "optimizer": trainer.optimizer.state_dict(),
            "optimizer_meta": trainer.optimizer_meta.state_dict(),
            "meta_rng": {"keys": np.asarray(rng[1], np.int64), "pos": int(rng[2])}}


def _load_step_state(trainer, state):
    import compat
    compat.checkpoint.load_state_dict(trainer.model, state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.optimizer_meta.load_state_dict(state["optimizer_meta"])
    r = state["meta_rng"]
    trainer.meta_rng.set_state(("MT19937", np.asarray(r["keys"], np.uint32), int(r["pos"]), 0, 0.0))


def case_steps(root, out, weights, iterations, state_dir, extra=(), follow=False):
    """Run `iterations` iterations step by step. The reference run (follow=False) saves its full state
    before every step into `state_dir`; a following run (follow=True) loads that state before each step,
    so every step of both runs starts from the same weights, optimizer buffers and meta-domain RNG; in meta
    steps it also takes the reference's fast-weight step α·r·g (its own is recorded for comparison).
    Returns per-step kinds, losses, the trainable weights after every step and the fast-weight steps."""
    import compat
    trainer = _trainer(root, out, list(extra) + NO_AUG + ["MODEL.WEIGHTS", weights])
    kinds, losses, after, steps = [], [], [], []
    own_steps = trainer.fast_weight_steps

    def record_or_replay(grads):
        computed = own_steps(grads)
        steps.append(np.concatenate([compat.to_numpy(s).ravel() for s in computed]))
        path = os.path.join(state_dir, "fast%03d.pth" % len(kinds))
        if not follow:
            compat.checkpoint.save([compat.to_numpy(s) for s in computed], path)
            return computed
        return [compat.as_tensor(a) for a in compat.checkpoint.load(path)]

    trainer.fast_weight_steps = record_or_replay
    for it in range(iterations):
        trainer.iter = it
        trainer.set_lr(it)
        for kind in trainer.iteration_plan(it):
            path = os.path.join(state_dir, "step%03d.pth" % len(kinds))
            if follow:
                _load_step_state(trainer, compat.checkpoint.load(path))
            else:
                compat.checkpoint.save(_step_state(trainer), path)
            trainer.basic_step() if kind == "basic" else trainer.meta_step()
            kinds.append(kind)
            losses.append(trainer.step_log[-1][2])
            after.append({n: compat.to_numpy(p).copy() for n, p in zip(trainer.param_names, trainer.params)})
    return {"kinds": kinds, "losses": np.array(losses), "after": after, "fast_steps": steps}


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    from reid.data.synthetic import ensure_synthetic
    root = tmp_path_factory.mktemp("data")
    ensure_synthetic(str(root / "synthetic"), seed=0, num_ids=16, workers=1, progress=False)
    return str(root)


@pytest.mark.parity
@pytest.mark.parametrize("splits,iterations", [(1, 20), (2, 7)])
def test_steps_match_between_backends(synth_root, tmp_path, splits, iterations):
    """20 iterations (2 + 19 basic steps, 7 meta steps) at demo width with single-device semantics (as the
    demo), and 7 iterations (2 + 6 basic, 3 meta) with 2 DataParallel chunks; both backends start from the
    same initial weights and see the same batches (augmentation off). Every step starts both backends from the torch run's state before that step (weights, buffers,
    both optimizers' momentum, the meta-domain RNG) and meta steps use the torch run's fast-weight step; the
    step's loss must agree to 1e-3 relative and the weights after it to 1e-3 relative (L2 over all trainable
    weights; 1e-2 per tensor), for every step including the last. The fast-weight steps each backend computed
    must agree in direction (cosine > 0.999) and length (1%).

    Why teacher-forced: from-scratch training at this size is ill-conditioned in float32. The features of an
    untrained network are nearly the same for every image, so the BNNeck and the CODE-block norms divide tiny
    differences by tiny deviations: torch float32 gradients are ~1% (median) off torch float64 ones, the
    meta-test loss at θ - α·g inherits that, and batch-hard mining sits on near-ties. Torch against torch
    with the initial weights perturbed by 1e-6 (relative) differs by ~1e-2 in the loss after one step and
    by ~10% in the weights after 25 steps; free-running trajectories of any two float32 implementations
    diverge that way. Per-step agreement is what identifies an implementation difference."""
    extra = ["MODEL.NUM_SPLITS", str(splits)]
    weights = str(tmp_path / "init.pth")
    states = tmp_path / "states"
    states.mkdir()
    run_cases("torch", [("tests.test_training:case_initial_weights",
                         dict(root=synth_root, out=str(tmp_path / "init"), path=weights, extra=extra))])
    kwargs = dict(root=synth_root, weights=weights, iterations=iterations, extra=extra, state_dir=str(states))
    pt = run_cases("torch", [("tests.test_training:case_steps", dict(kwargs, out=str(tmp_path / "pt")))])[0]
    ms = run_cases("mindspore", [("tests.test_training:case_steps",
                                  dict(kwargs, out=str(tmp_path / "ms"), follow=True))])[0]
    assert ms["kinds"] == pt["kinds"] and pt["kinds"] == [k for it in range(iterations) for k in (["basic"] * (2 if it == 0 else 1)
                                                                  + ["meta"] * (it % 3 == 0))]
    np.testing.assert_allclose(ms["losses"], pt["losses"], rtol=1e-3)
    for got, ref in zip(ms["fast_steps"], pt["fast_steps"]):  # the meta-train gradients, to float32 conditioning
        cosine = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
        assert cosine > 0.999 and abs(np.linalg.norm(got) / np.linalg.norm(ref) - 1) < 0.01, cosine
    init = run_cases("torch", [("tests.test_training:case_read", dict(path=weights))])[0]
    names = sorted(pt["after"][0])
    for step, (got, ref) in enumerate(zip(ms["after"], pt["after"])):
        flat_got, flat_ref = (np.concatenate([w[n].ravel() for n in names]) for w in (got, ref))
        err = np.linalg.norm(flat_got - flat_ref) / np.linalg.norm(flat_ref)
        assert err < 1e-3, "step %d (%s): weights relative error %.2e" % (step, pt["kinds"][step], err)
        # per tensor within 1e-2, except zero-initialised ones (BN biases), whose value is nothing but
        # accumulated updates: single gradients carry the ~1% float32 conditioning described above, which
        # one large step (the stem conv's gradient is the largest) turns into a few 1e-3 of a tensor
        for name in names:
            if np.any(init[name]):
                err = np.linalg.norm(got[name] - ref[name]) / np.linalg.norm(ref[name])
                assert err < 1e-2, "step %d (%s), %s: relative error %.2e" % (step, pt["kinds"][step], name, err)
    # the run went somewhere: most weights moved and the loss changed
    moved = [n for n, v in pt["after"][-1].items() if not np.allclose(v, init[n])]
    assert len(moved) > 0.9 * len(pt["after"][-1])
    assert abs(pt["losses"][-2] - pt["losses"][0]) > 1e-2


def case_read(path):
    from compat import checkpoint
    return dict(checkpoint.load(path))


def test_resume_continues_the_same_trajectory(synth_root, tmp_path):
    """8 iterations straight vs 5 + resume from the checkpoint after iteration 4 (a meta step follows at 6;
    augmentation on, so the per-sample augmentation streams and sampler positions must be restored too)."""
    import compat
    full = _trainer(synth_root, str(tmp_path / "full"))
    full.train(max_iter=8)
    part = _trainer(synth_root, str(tmp_path / "part"))
    part.hooks = [_SaveAt(4)]
    part.train(max_iter=5)
    resumed = _trainer(synth_root, str(tmp_path / "part"), resume=True)
    assert resumed.start_iter == 5
    resumed.train(max_iter=8)
    assert [kind for _, kind, _ in resumed.step_log] == ["basic", "basic", "meta", "basic"]
    tail = [loss for it, _, loss in full.step_log if it >= 5]
    assert [loss for _, _, loss in resumed.step_log] == pytest.approx(tail, rel=1e-6, abs=1e-7)
    a, b = compat.checkpoint.state_dict(full.model), compat.checkpoint.state_dict(resumed.model)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-7, err_msg=name)


class _SaveAt:
    def __init__(self, iteration):
        self.iteration = iteration

    def before_train(self, trainer):
        pass

    def after_step(self, trainer):
        if trainer.iter == self.iteration:
            trainer.save_checkpoint("model_%07d.pth" % trainer.iter)

    def after_train(self, trainer):
        pass

    def close(self, trainer):
        pass


def test_nan_loss_stops_and_keeps_the_last_checkpoint(synth_root, tmp_path, monkeypatch):
    from reid.engine import trainer as trainer_mod
    out = str(tmp_path / "nan")
    t = _trainer(synth_root, out)
    t.hooks = [_SaveAt(1)]
    real = trainer_mod.objective

    def poisoned(kind, *args, **kwargs):
        total, terms = real(kind, *args, **kwargs)
        return (total * float("nan") if t.iter >= 3 else total), terms

    monkeypatch.setattr(trainer_mod, "objective", poisoned)
    with pytest.raises(trainer_mod.TrainingDiverged, match="loss became nan .* iteration 3"):
        t.train(max_iter=6)
    with open(os.path.join(out, "last_checkpoint")) as fh:
        assert fh.read().strip() == "model_0000001.pth"
    state = trainer_mod.Checkpointer(out).load_last()[1]
    assert state["iteration"] == 1


def test_training_reduces_the_loss_on_a_fixed_batch(synth_root, tmp_path):
    """Learning, cheaply: 25 basic steps on one batch bring its loss far down (both backends run this)."""
    t = _trainer(synth_root, str(tmp_path / "fit"), NO_AUG + ["META.ENABLED", "False"])
    batch = next(t.data.combined)
    t.data.combined = iter(lambda: batch, None)
    t.optimizer.set_lr(0.04)
    losses = []
    for _ in range(25):
        t.basic_step()
        losses.append(t.last_terms["loss_basic"])
    assert losses[-1] < 0.5 * losses[0], losses


def _run_cli(args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([sys.executable] + args, cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_unknown_config_key_is_one_clear_line():
    proc = _run_cli(["train.py", "--config-file", "configs/synthetic/acl.yml", "SOLVER.BASE_LRR", "0.1"])
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines[-1] == "error: command line: unknown config key SOLVER.BASE_LRR (check the spelling; " \
                        "'python train.py --help-config' lists every key)"
    assert "Traceback" not in proc.stderr


def test_cli_missing_dataset_names_the_layout(tmp_path):
    proc = _run_cli(["train.py", "--config-file", "configs/protocol2/acl_to_cuhk03.yml", "DATASETS.ROOT",
                     str(tmp_path), "MODEL.BACKBONE.PRETRAIN", "False", "OUTPUT_DIR", str(tmp_path / "o")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "cuhksysu" in last.lower() and "DATASETS.ROOT" in last


def test_cli_test_without_weights_and_with_corrupt_weights(tmp_path):
    proc = _run_cli(["test.py", "--config-file", "configs/synthetic/acl.yml"])
    assert proc.returncode == 2 and "MODEL.WEIGHTS" in proc.stderr.strip().splitlines()[-1]
    bad = tmp_path / "model.pth"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    proc = _run_cli(["test.py", "--config-file", "configs/synthetic/acl.yml", "MODEL.WEIGHTS", str(bad)])
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("error: ") and str(bad) in last


@pytest.fixture(scope="module")
def cli_run(synth_root, tmp_path_factory):
    """train.py for 2 epochs of 2 iterations with an evaluation after each epoch, on the active backend."""
    out = tmp_path_factory.mktemp("cli") / "run"
    common = ["--config-file", "configs/synthetic/acl.yml"] + TINY + [
        "DATASETS.ROOT", synth_root, "OUTPUT_DIR", str(out), "SOLVER.MAX_EPOCH", "2", "SOLVER.ITERS_PER_EPOCH", "2",
        "TEST.EVAL_PERIOD", "1"]
    proc = _run_cli(["train.py"] + common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_train_then_test_cli_writes_outputs(cli_run):
    """train.py's outputs, then test.py on its weights with --vis-rank: config.yaml, metrics.json (JSON lines),
    results.json, checkpoints, curves.png, TensorBoard events, rank-list PNGs; test.py reproduces the
    final evaluation."""
    out = cli_run
    for name in ("config.yaml", "metrics.json", "results.json", "model_0001.pth", "model_final.pth", "curves.png",
                 "last_checkpoint"):
        assert (out / name).exists(), name
    records = [json.loads(l) for l in (out / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in records if "lr" in r] == [0, 1, 2, 3]
    assert any("SynthD/mAP" in r for r in records) and any(r["iteration"] == -1 for r in records)
    results = json.loads((out / "results.json").read_text())["results"]["SynthD"]
    assert set(results) >= {"mAP", "Rank-1", "Rank-5", "Rank-10", "mINP"} and 0 < results["mAP"] <= 100
    assert os.listdir(out / "tb")
    # the demo config asks for the colour-histogram reference: results.json holds the untrained network's and
    # the reference's rows next to the trained network's (the printed comparison table's rows)
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["untrained"]["SynthD"]) >= {"mAP", "Rank-1", "mINP"}
    assert [r["SynthD/mAP"] for r in records if r["iteration"] == -1] == [saved["untrained"]["SynthD"]["mAP"]]
    assert 0 < saved["references"]["histogram"]["SynthD"]["mAP"] <= 100
    proc = _run_cli(["test.py", "--config-file", str(out / "config.yaml"), "MODEL.WEIGHTS",
                     str(out / "model_final.pth"), "--vis-rank", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluated = json.loads((out / "eval" / "results.json").read_text())["results"]["SynthD"]
    assert evaluated["mAP"] == pytest.approx(results["mAP"], abs=1e-6)
    assert len(list((out / "eval" / "rank_lists" / "SynthD").glob("*.png"))) == 2
    assert json.loads((out / "eval" / "results.json").read_text())["references"]["histogram"]["SynthD"] == \
        pytest.approx(saved["references"]["histogram"]["SynthD"])
    assert "colour histogram" in proc.stdout and "model_final.pth" in proc.stdout


def test_cli_reference_alone_needs_no_weights(synth_root, tmp_path):
    """`test.py --reference histogram` evaluates the hand-crafted reference on the configured target without a
    network; TEST.REFERENCE with an unknown name is one clear line."""
    args = ["test.py", "--config-file", "configs/synthetic/baseline.yml"] + TINY + [
        "DATASETS.ROOT", synth_root, "OUTPUT_DIR", str(tmp_path), "TEST.REFERENCE", ""]
    proc = _run_cli(args + ["--reference", "histogram"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert set(saved) == {"references"} and 0 < saved["references"]["histogram"]["SynthD"]["mAP"] <= 100
    assert "colour histogram" in proc.stdout
    proc = _run_cli(args[:-1] + ["sift"])
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        "error: TEST.REFERENCE must be one of histogram or empty, got 'sift'"


@pytest.mark.parity
def test_weights_trained_on_one_backend_evaluate_the_same_on_the_other(cli_run, tmp_path):
    """A checkpoint written by train.py on this backend, evaluated by test.py running on the other backend
    (its own environment): same mAP / Rank-1 as the training run's final evaluation, to feature tolerance."""
    from tests.crossenv import PYTHONS, active_backend, require_backend
    other = "torch" if active_backend() == "mindspore" else "mindspore"
    require_backend(other)
    out = cli_run
    env = dict(os.environ, PYTHONPATH=str(ROOT), REID_BACKEND=other)
    proc = subprocess.run([str(PYTHONS[other]), "test.py", "--config-file", str(out / "config.yaml"), "MODEL.WEIGHTS",
                           str(out / "model_final.pth"), "OUTPUT_DIR", str(tmp_path)], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert got["backend"] == other
    trained = json.loads((out / "results.json").read_text())["results"]["SynthD"]
    for key in ("mAP", "Rank-1", "mINP"):  # percent; features agree to ~1e-5, so only near-ties could move
        assert got["results"]["SynthD"][key] == pytest.approx(trained[key], abs=0.05), key
