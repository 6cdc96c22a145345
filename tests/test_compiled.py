"""Compiled (MindSpore graph mode: TEST.JIT, on by default, and MODEL.JIT) execution against op-by-op execution
of the same model.

Compiled code silently computes wrong values where it meets in-place ops, host reads or Python state
(compat/jit.py), so every module type of the ACL network is run both ways: the whole tiny network holds
each of them (conv, batch norm in all three modes, instance norm, IBN, gate, router, SE, experts, GeM,
BNNeck, classifiers, centers). Building a graph of this demo-width network took 1-6 minutes per graph on
our loaded 2-core machines, hence two graphs in all (plus a fresh process that loads the evaluation graph
from the compile cache, ~15 s) and the `slow` mark.
"""
import numpy as np
import pytest

import compat

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not compat.IS_MINDSPORE, reason="compiled execution exists on MindSpore only; "
                                                                 "on torch MODEL.JIT runs eagerly")]


def _tiny_model():
    from reid.config import get_cfg
    from reid.modeling import build_model
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH = 8
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [5, 6, 7]
    cfg.MODEL.NUM_SPLITS = 1
    np.random.seed(0)
    return build_model(cfg)


def _images(n, seed=1):
    # 64x32 (the demo size): the last stage's maps are 4x2 (at 32x16, 2x1 maps, an instance norm by reductions
    # and the fused kernel differed by up to 4e-2 relative; both paths now run the kernel)
    return (np.random.RandomState(seed).rand(n, 3, 64, 32) * 255).astype(np.float32)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.fixture(scope="module")
def model():
    m = _tiny_model()
    compat.jit.prepare(m)
    return m


def test_train_forward_and_running_statistics_compiled_equal_op_by_op(model):
    """Train mode, batch-norm mode 'general': every output and every running statistic after one forward."""
    from reid.modeling import bn_mode
    model.train()
    x = compat.as_tensor(_images(8, seed=2))
    start = compat.checkpoint.state_dict(model)
    with bn_mode(model, "general"):
        ref = model(x)
    ref = dict({k: compat.to_numpy(v) for k, v in ref.items() if compat.is_tensor(v)},
               logits1=compat.to_numpy(ref["logits"][1]))
    ref_stats = {k: v for k, v in compat.checkpoint.state_dict(model).items() if "running" in k}
    compat.checkpoint.load_state_dict(model, start)

    from reid.modeling.heads import train_dict

    def train_forward(images):
        out = train_dict(model(images))  # compiled, the train-mode forward gives a tuple
        return out["features"], out["neck_feat"], out["feat_norm"], out["center_dist"], out["paths"], out["logits"][1]
    with bn_mode(model, "general"):
        got = compat.jit.compiled(train_forward, "test_train_forward")(x)
    # both paths run the same kernels (measured 0)
    tol = 1e-5
    for name, value in zip(("features", "neck_feat", "feat_norm", "center_dist", "paths", "logits1"), got):
        err = _rel(compat.to_numpy(value), ref[name])
        assert err < tol, (name, err)
    stats = compat.checkpoint.state_dict(model)
    # per tensor, the compiled update against the op-by-op update (from the same start), L2-relative: a
    # skipped or half-size update fails by far (error 1 / 0.5). Compiled and op by op run the same kernels
    # (instance norm included: compat.norm._graph_instance_norm): measured 0 for every statistic; with the
    # earlier compiled instance norm by reductions the worst was 3.0e-4 (a running mean of layer2's IBN BN).
    errors = {}
    for name, value in ref_stats.items():
        ref_update = value.astype(np.float64) - start[name]
        got_update = stats[name].astype(np.float64) - start[name]
        assert np.linalg.norm(ref_update) > 0, name  # every running statistic moved
        errors[name] = np.linalg.norm(got_update - ref_update) / np.linalg.norm(ref_update)
    worst = max(errors, key=errors.get)
    print("worst running-statistics update error %.2e (%s)" % (errors[worst], worst))
    assert errors[worst] < 1e-5, (worst, errors[worst])


def _eval_batches():
    images = _images(7, seed=4)
    return [{"images": images[:4], "targets": np.arange(4)}, {"images": images[4:], "targets": np.arange(4, 7)}]


def test_extract_features_default_is_compiled_and_equals_op_by_op(model, tmp_path):
    """The evaluation path as train.py / test.py run it (TEST.JIT's default: compiled), with a short last batch
    (padded to one graph shape) and flip averaging, against op by op. Its graph goes into a compile cache
    (MODEL.COMPILE_CACHE), which a fresh process then loads instead of building (same features): with the
    weights registered on the other of MindSpore 2.7's two graph executors (compat.jit._graph_executor), the
    loaded graph gave all-zero features."""
    from reid.evaluation import extract_features
    assert model.jit_eval  # TEST.JIT True by default
    batches = _eval_batches()
    ref = extract_features(model, batches, flip=True, compiled=False)[0]
    assert "eval" not in model.compiled
    cache = tmp_path / "compile_cache"
    compat.jit.set_cache_dir(str(cache))
    try:
        got, pids, _, _ = extract_features(model, batches, flip=True)
    finally:
        compat.jit.set_cache_dir(None)
    assert "eval" in model.compiled  # the compiled forward ran
    import mindspore
    # on only while that graph was built
    assert mindspore.get_context("enable_compile_cache") in (False, None)
    assert got.shape == ref.shape == (7, ref.shape[1])
    assert np.array_equal(pids, np.arange(7))
    err = _rel(got, ref)
    assert err < 1e-5, err
    assert len(list(cache.rglob("*.mindir"))) == 1, sorted(cache.rglob("*"))

    # the graph reads the model's Parameters, not copies: after the weights change (as training changes them
    # between evaluations) it follows them
    start = compat.checkpoint.state_dict(model)
    rng = np.random.RandomState(5)  # every float weight moved by ~10% (scale kept: 50 layers deep)
    changed = {k: (v * (1 + 0.1 * rng.randn(*v.shape))).astype(v.dtype)
               if "running_var" not in k and v.dtype == np.float32 else v for k, v in start.items()}
    compat.checkpoint.load_state_dict(model, changed)
    try:
        moved_ref = extract_features(model, batches, flip=True, compiled=False)[0]
        moved = extract_features(model, batches, flip=True)[0]
    finally:
        compat.checkpoint.load_state_dict(model, start)
    assert _rel(moved_ref, ref) > 1e-2  # the change shows op by op...
    assert _rel(moved, moved_ref) < 1e-5, _rel(moved, moved_ref)  # ...and compiled alike

    warm = _in_fresh_process("tests.test_compiled:warm_cache_case", cache=str(cache),
                             weights=compat.checkpoint.state_dict(model))
    assert warm["loaded"], warm["log"]
    assert _rel(warm["features"], got) < 1e-6
    print("graph built in %.1f s here, loaded in %.1f s by a fresh process" % (
        model.compiled["eval_graph"].compile_seconds if "eval_graph" in model.compiled else float("nan"),
        warm["seconds"]))


def warm_cache_case(cache, weights):
    """In a fresh process: the same model and weights, the same compile cache; the evaluation's features and
    whether the graph came from the cache."""
    from reid.evaluation import extract_features
    lines = []
    compat.jit.log = lines.append
    compat.jit.set_cache_dir(cache)
    m = _tiny_model()
    compat.checkpoint.load_state_dict(m, weights)
    feats = extract_features(m, _eval_batches(), flip=True)[0]
    graph = m.compiled["eval_graph"]
    return {"features": feats, "loaded": graph.loaded, "seconds": graph.compile_seconds, "log": lines}


def _in_fresh_process(target, **kwargs):
    """`target(**kwargs)` in a new process of this interpreter (tests/_crossenv_child.py)."""
    import pickle
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    from tests.crossenv import child_env
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="fresh-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as fh:
            pickle.dump([(target, kwargs)], fh, protocol=4)
        proc = subprocess.run([sys.executable, str(root / "tests" / "_crossenv_child.py"), str(src), str(dst)],
                              cwd=str(root), env=child_env(), capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        with open(dst, "rb") as fh:
            return pickle.load(fh)[0]


def test_compile_cache_entry_changes_with_what_the_graph_bakes_in(model):
    """A cached graph's folder is named by everything it depends on: another key (model config), input shape,
    graph name or parameter set gives another folder, so a changed setting never loads a stale graph."""
    from compat.jit import _graph_dir
    compat.jit.set_cache_dir("/nonexistent/cache")
    try:
        x = compat.as_tensor(_images(4))
        base = _graph_dir("eval_forward", model, "key", (x,))
        assert base == _graph_dir("eval_forward", model, "key", (x,))
        assert base.startswith("/nonexistent/cache/eval_forward-")
        others = [_graph_dir("eval_forward", model, "key2", (x,)),
                  _graph_dir("eval_forward", model, "key", (compat.as_tensor(_images(5)),)),
                  _graph_dir("other", model, "key", (x,)),
                  _graph_dir("eval_forward", model.heads, "key", (x,))]
        assert len(set(others + [base])) == 5
    finally:
        compat.jit.set_cache_dir(None)


def test_compiled_graph_reads_every_weight_live():
    """After a graph is built, every parameter and buffer is changed in place (as optimizer steps, checkpoint
    loading and running-statistics updates change them): the compiled evaluation must follow every one of them.

    A fresh model, whose weights no kernel has written yet (at this width the first stage's IBN layers hold
    Parameters of at most 4 elements, which an older MindSpore kept at their build-time values in a graph:
    docs/ms27.md). The change is additive as well as
    multiplicative, so zero-initialised tensors (biases, running means) move too; one tensor at a time is
    checked only if the whole-model comparison fails, to name the ones left behind."""
    from reid.evaluation import extract_features
    m = _tiny_model()
    batches = _eval_batches()
    before = extract_features(m, batches, compiled=True)[0]  # builds the graph (prepare included)
    rng = np.random.RandomState(6)
    tensors = [(n, t) for n, t in list(m.named_parameters()) + list(m.named_buffers())
               if compat.to_numpy(t).dtype == np.float32]
    for name, t in tensors:
        v = compat.to_numpy(t).astype(np.float64)
        if "running_var" in name:
            new = v * np.exp(0.2 * rng.randn(*v.shape))
        else:
            new = v * (1 + 0.1 * rng.randn(*v.shape)) + 0.05 * rng.randn(*v.shape)
        compat.assign_(t, compat.as_tensor(new.astype(np.float32)))
    ref = extract_features(m, batches, compiled=False)[0]
    got = extract_features(m, batches, compiled=True)[0]
    assert _rel(ref, before) > 1e-2  # the change shows op by op
    err = _rel(got, ref)
    if err >= 1e-5:  # name the stale tensors: each one moved alone
        stale = []
        for name, t in tensors:
            old = compat.to_numpy(t).copy()
            compat.assign_(t, compat.as_tensor(old + 0.5))
            if _rel(extract_features(m, batches, compiled=True)[0], got) < 1e-6:  # the graph did not move...
                if _rel(extract_features(m, batches, compiled=False)[0], ref) > 1e-6:  # ...op by op did
                    stale.append(name)
            compat.assign_(t, compat.as_tensor(old))
        raise AssertionError("compiled evaluation differs from op by op by %.2e after every weight changed; "
                             "tensors it does not follow: %s" % (err, stale))


def _dict_step(layer):
    """A differentiated step of `layer` that returns (loss, dict of terms), as the training steps do."""
    def step(t):
        y = layer(t).sum()
        return y * y, {"y": y, "twice": y * 2}
    return step


def _compiled_against_op_by_op(step, params, x, name):
    """`step` through compat.jit.value_and_grad (graph `name`) against compat.value_and_grad, as plain Python:
    the compiled aux's type and keys, the worst relative errors of loss, terms and gradients, and the op-by-op
    gradients."""
    loss, aux, grads = compat.value_and_grad(step, params)(x)
    c_loss, c_aux, c_grads = compat.jit.value_and_grad(step, params, name)(x)
    is_dict = isinstance(c_aux, dict)
    return {"aux_type": type(c_aux).__name__, "keys": sorted(c_aux) if is_dict else None,
            "loss_err": _rel(compat.to_numpy(c_loss), compat.to_numpy(loss)),
            "aux_err": max(_rel(compat.to_numpy(c_aux[k]), compat.to_numpy(aux[k])) for k in aux) if is_dict
            else None,
            "grad_err": max(_rel(compat.to_numpy(g), compat.to_numpy(r)) for g, r in zip(c_grads, grads)),
            "grads": [compat.to_numpy(g) for g in grads]}


def _assert_step_matches(got):
    assert got["aux_type"] == "dict" and got["keys"] == ["twice", "y"], got
    assert got["loss_err"] < 1e-6 and got["aux_err"] < 1e-6 and got["grad_err"] < 1e-5, got


def test_built_graphs_run_on_the_low_priority_helper_thread():
    """MODEL.JIT_HELPER_THREAD (default on): after its build a graph runs on compat's helper thread at nice 19
    while the caller sleeps, with the same outputs as on the calling thread, bit for bit; the helper's errors
    are raised in the caller. (The compiled step and evaluation tests run on the helper by default.)"""
    import os
    import threading
    layer = compat.nn.Linear(3, 2)
    compat.jit.prepare(layer)

    def affine(t):
        return {"y": layer(t) * 2.0 + 1.0, "s": layer(t).sum()}
    fn = compat.jit.compiled(affine, "helper_thread_affine")
    x = compat.as_tensor(np.random.RandomState(9).rand(4, 3).astype(np.float32))
    built = fn(x)                                     # the build, on the calling thread
    before = compat.jit.helper_thread()
    on_helper = fn(x)
    helper_id, calls = compat.jit.helper_thread()
    assert calls == (before[1] if before else 0) + 1
    assert helper_id != threading.get_native_id()
    assert os.getpriority(os.PRIO_PROCESS, helper_id) == compat.jit.HELPER_NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0   # the caller keeps its priority
    compat.jit.set_helper_thread(False)
    try:
        on_caller = fn(x)
    finally:
        compat.jit.set_helper_thread(True)
    assert compat.jit.helper_thread()[1] == calls    # that call did not go through the helper
    for key in ("y", "s"):
        a, b, c = (compat.to_numpy(out[key]) for out in (built, on_helper, on_caller))
        assert np.array_equal(a, b) and np.array_equal(b, c), key
    assert np.allclose(compat.to_numpy(on_helper["y"]), compat.to_numpy(layer(x)) * 2 + 1, rtol=1e-6)

    def fails(value):
        raise ValueError("raised on the helper: %d" % value)
    with pytest.raises(ValueError, match="raised on the helper: 3"):
        compat.jit._helper().call(fails, 3)
    assert compat.jit._helper().call(divmod, 7, 2) == (3, 1)   # and it keeps serving


def test_the_caller_sleeps_while_a_built_graph_runs():
    """The wait for a built graph's kernels happens on the helper thread: the calling thread, from its call to
    reading the output, uses a small fraction of the wall time in CPU. (MindSpore spins at full speed in the
    thread that waits for a graph; `mindspore.jit`'s call of a differentiated graph only queues it,
    and the spin came in the caller's first read of an output, taking a core from the kernels on a 2-core
    machine: about half the wall time in the caller's CPU.)"""
    import time
    conv = compat.nn.Conv2d(32, 32, 3, padding=1)
    compat.jit.prepare(conv)

    def loss_fn(x):
        y = x
        for _ in range(6):
            y = compat.F.relu(conv(y))
        return (y * y).mean()
    step = compat.jit.value_and_grad(loss_fn, list(conv.parameters()), "caller_sleeps_step")
    x = compat.as_tensor(np.random.RandomState(3).rand(8, 32, 64, 32).astype(np.float32))
    expected = float(compat.to_numpy(step(x)[0]))     # the build, on the calling thread
    step(x)
    walls, cpus = [], []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.thread_time()
        got = float(compat.to_numpy(step(x * 1.0)[0]))
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
        assert got == expected
    assert compat.jit.helper_thread() is not None
    # the call's own Python (arguments, outputs) is milliseconds
    assert sum(cpus) < 0.2 * sum(walls), (cpus, walls)


def test_a_compiled_function_builds_a_graph_per_input_shape():
    """A compiled function called with another batch size gets a graph of its own (a built graph run directly
    would take the new shape and return garbage), and the first shape's graph still serves its own."""
    layer = compat.nn.Linear(3, 2)
    compat.jit.prepare(layer)

    def affine(t):
        return layer(t) * 2.0 + 1.0
    fn = compat.jit.compiled(affine, "per_shape_affine")
    rs = np.random.RandomState(4)
    for rows in (1, 5, 1, 5, 2):
        x = compat.as_tensor(rs.rand(rows, 3).astype(np.float32))
        with compat.no_grad():
            want = compat.to_numpy(layer(x)) * 2 + 1
        got = compat.to_numpy(fn(x))
        assert got.shape == (rows, 2) and np.allclose(got, want, rtol=1e-6, atol=1e-6), rows


def test_an_error_inside_a_gradient_leaves_later_compiled_steps_intact():
    """An exception raised inside an op-by-op gradient (an input check's UserError) must not leave MindSpore
    recording: a compiled step afterwards returns its dict of terms and the right gradients. Before compat's
    reset (compat/autograd.py `_stop_recording`), a compiled step afterwards could fail with "Jit does
    not support dynamic shape input yet"."""
    from mindspore.common.api import _pynative_executor
    from compat.errors import UserError
    layer = compat.nn.Linear(3, 2)
    compat.jit.prepare(layer)
    params = list(layer.parameters())
    x = compat.as_tensor(np.random.RandomState(7).rand(4, 3).astype(np.float32))
    step = _dict_step(layer)

    def failing_step(x):
        layer(x).sum()
        raise UserError("a check inside the step failed")

    before = compat.value_and_grad(step, params)(x)[2]
    with pytest.raises(UserError, match="check inside"):
        compat.value_and_grad(failing_step, params)(x)
    assert not _pynative_executor.grad_flag()
    got = _compiled_against_op_by_op(step, params, x, "step_after_an_error")
    _assert_step_matches(got)
    for g, ref in zip(got["grads"], before):  # op by op records as before
        assert _rel(g, compat.to_numpy(ref)) < 1e-6


def case_export_then_compiled(out_dir):
    """In a fresh process: MINDIR export and compat.export's compiled runner first, then compiled graphs with dict
    outputs (a value_and_grad step and a plain function). Returns what the checks need, as plain Python."""
    import os

    import compat.export
    layer, other = compat.nn.Linear(3, 2), compat.nn.Linear(3, 2)
    compat.jit.prepare(layer)
    other.eval()
    x = np.random.RandomState(8).rand(4, 3).astype(np.float32)
    compat.export.export(other, x, os.path.join(out_dir, "other.mindir"), "mindir")
    compat.export.CompiledRunner(other).run(x)
    variable = compat.jit._c_getenv(compat.jit.FALLBACK_VARIABLE)
    t = compat.as_tensor(x)
    got = _compiled_against_op_by_op(_dict_step(layer), list(layer.parameters()), t, "step_after_saving")

    def terms(t):
        y = layer(t)
        return {"y": y, "log_p": compat.F.log_softmax(y, 1)}
    c_terms = compat.jit.compiled(terms, "terms_after_saving")(t)
    got.update(variable=variable, terms_type=type(c_terms).__name__,
               log_p_err=_rel(compat.to_numpy(c_terms["log_p"]), compat.to_numpy(compat.F.log_softmax(layer(t), 1)))
               if isinstance(c_terms, dict) else None)
    return got


def test_compiled_graphs_are_right_after_an_export(tmp_path):
    """A MindSpore export may switch JIT fallback off for the rest of the process
    (MS_DEV_ENABLE_FALLBACK_RUNTIME=0); graphs built afterwards would return a dict as a tuple or fail to parse
    the torch-API layer's Python. compat/export.py puts the variable back (`compat.jit.fallback_kept`), and
    compiled graphs with dict outputs built after an export and compat/export.py's compiled runner are right.
    Run in a fresh process: there the export is the first graph, as in a user's script that exports and then
    trains."""
    from tests.crossenv import run_cases
    got = run_cases("mindspore", [("tests.test_compiled:case_export_then_compiled", {"out_dir": str(tmp_path)})],
                    fresh=True)[0]
    assert got["variable"] is None  # restored (unset) after the export and the runner
    _assert_step_matches(got)
    assert got["terms_type"] == "dict" and got["log_p_err"] < 1e-6, got


def test_graph_builds_refuse_a_switched_off_fallback():
    """The guard of compat/jit.py: a graph build that finds JIT fallback switched off behind the user's back (the
    variable set in the process, not in os.environ) stops with a one-line UserError, and builds again once it is
    back."""
    import os

    from compat.errors import UserError
    x = compat.as_tensor(np.ones((2, 3), np.float32))

    def double(t):
        return t * 2
    graph = compat.jit.compiled(double, "double_plain")
    os.putenv(compat.jit.FALLBACK_VARIABLE, "0")
    try:
        with pytest.raises(UserError, match="JIT fallback is off"):
            graph(x)
    finally:
        os.unsetenv(compat.jit.FALLBACK_VARIABLE)
    np.testing.assert_allclose(compat.to_numpy(graph(x)), 2.0)


def test_model_jit_compiles_steps_on_mindspore(synth_root, tmp_path):
    """MODEL.JIT True (the default) gives the trainer compiled step functions (built without side effects:
    compat.jit.grad_graph_forms), False op-by-op ones. No step is run: the trainer is only built. The trainer
    also sets the runtime's side-by-side kernels for its graph layout (compat.jit.set_step_graph_layout):
    MindSpore's default (0) for the shared basic / meta-train graph, at least 2 for a graph per step kind."""
    import mindspore
    from reid.engine.trainer import Trainer
    from tests.test_training import _cfg
    assert compat.jit.grad_graph_forms() is True
    before = mindspore.get_context("inter_op_parallel_num")
    try:
        separate = Trainer(_cfg(synth_root, str(tmp_path / "sep"), ["MODEL.JIT", "True",
                                                                      "MODEL.JIT_SHARED_GRAPH", "False"]))
        assert separate.steps.compiled is True
        assert mindspore.get_context("inter_op_parallel_num") == max(2, compat.jit.set_threads())
        shared = Trainer(_cfg(synth_root, str(tmp_path), ["MODEL.JIT", "True", "MODEL.JIT_SHARED_GRAPH", "True"]))
        assert shared.steps.compiled is True and shared.steps.shared_graph is True
        assert mindspore.get_context("inter_op_parallel_num") == 0
    finally:
        mindspore.set_context(inter_op_parallel_num=before)
    assert Trainer(_cfg(synth_root, str(tmp_path / "off"), ["MODEL.JIT", "False"])).steps.compiled is False
