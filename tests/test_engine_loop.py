"""The training loop's parts without a model: the event storage, metrics.json records, model_best selection,
the checkpoint schedule, and the crash supervisor of train.py --max-restarts (with stand-in child processes)."""
import json
import os
import signal
import sys

import pytest

from reid.engine.events import EventStorage, MetricsWriter, read_metrics
from reid.engine.train_loop import HookBase, TrainLoop


class ScriptedLoop(TrainLoop):
    """A loop whose step puts known scalars: lr = iteration / 10, loss_basic = iteration, and a meta-step
    term every 3rd iteration (as META.PERIOD 3)."""

    def __init__(self, output_dir, max_iter, iters_per_epoch):
        super().__init__()
        self.output_dir, self.max_iter, self.iters_per_epoch = str(output_dir), max_iter, iters_per_epoch
        self.model = "model"
        self.saved = []  # (iteration, name, point)

    def run_step(self):
        self.storage.put_scalars({"lr": self.iter / 10.0, "loss_basic": float(self.iter)})
        if self.iter % 3 == 0:
            self.storage.put_scalar("meta/loss_mtest", 100.0 + self.iter)

    def save_checkpoint(self, name, point=True):
        from reid.engine.checkpointer import Checkpointer
        self.saved.append((self.iter, name, point))
        state = {"iteration": self.iter, "hooks": {type(h).__name__: h.state_dict() for h in self.hooks
                                                   if hasattr(h, "state_dict")}}
        return Checkpointer(self.output_dir).save(name, state, point=point)


def test_event_storage_tags_values_with_their_iteration():
    s = EventStorage(start_iter=5)
    s.put_scalar("a", 1.5)
    s.put_scalar("b", 3)                      # ints stay ints (meta/test_domain)
    s.put_scalar("eval", 7.0, iteration=-1)   # an explicit iteration (the evaluation before training)
    s.iter = 6
    s.put_scalar("a", 2.5)
    assert s.latest() == {"a": (2.5, 6), "b": (3, 5), "eval": (7.0, -1)}
    assert s.at(5) == {"b": 3} and s.at(6) == {"a": 2.5}
    assert s.since(None) == {-1: {"eval": 7.0}, 5: {"b": 3}, 6: {"a": 2.5}}
    assert s.since(5) == {6: {"a": 2.5}}
    assert isinstance(s.latest()["b"][0], int)


def test_metrics_records_hold_only_what_happened_in_their_iteration(tmp_path):
    """LOG_PERIOD 2 over 10 iterations with a flush before a checkpoint after iteration 4: one record per
    iteration that has unwritten values, a meta term only under its own iteration (never repeated under
    later ones), every value the one put in that iteration."""
    from reid.engine.hooks import MetricsLogger
    loop = ScriptedLoop(tmp_path, max_iter=10, iters_per_epoch=5)
    writer = MetricsWriter(str(tmp_path), tensorboard=False)
    loop.register_hooks([MetricsLogger(writer, period=2, flush_at=lambda it: it == 4)])
    loop.train(0, 10)
    records = read_metrics(writer.path)
    # written after 1, 3, 4 (flush), 5, 7, 9 (last); iteration 0 and 6 left only their meta term unwritten
    assert [r["iteration"] for r in records] == [0, 1, 3, 4, 5, 6, 7, 9]
    for r in records:
        assert r["epoch"] == r["iteration"] // 5
        assert ("meta/loss_mtest" in r) == (r["iteration"] % 3 == 0), r
        if "meta/loss_mtest" in r:
            assert r["meta/loss_mtest"] == 100.0 + r["iteration"]
        if "lr" in r:
            assert r["lr"] == pytest.approx(r["iteration"] / 10.0) and r["loss_basic"] == r["iteration"]
    assert [r["iteration"] for r in records if "lr" not in r] == [0, 6]


def test_metrics_log_on_resume_and_on_a_fresh_start(tmp_path):
    """A run resumed at iteration 3 keeps the records before 3 (a torn last line, left by a killed
    process, is dropped); a run from iteration 0 starts an empty log, its evaluation before training included."""
    writer = MetricsWriter(str(tmp_path), tensorboard=False)
    for it in (-1, 0, 1, 2, 3, 4):
        writer.write({"iteration": it})
    with open(writer.path, "a") as fh:
        fh.write('{"iteration": 5, "lo')
    with pytest.raises(ValueError):
        read_metrics(writer.path)
    writer.truncate_after(3)
    assert [r["iteration"] for r in read_metrics(writer.path)] == [-1, 0, 1, 2]
    writer.truncate_after(0)
    assert read_metrics(writer.path) == []


def test_evaluator_keeps_the_last_and_the_best_by_map_plus_rank1(tmp_path):
    """Evaluations before training and after each of 4 epochs, scores (mAP + Rank-1)/2 = 10, 25, 25, 15:
    best is the earlier of the two 25s, model_best.pth is written when the best improves and never becomes
    the resume checkpoint; results.json and the table list untrained / last / best with their iterations."""
    from reid.engine.hooks import Evaluator
    from reid.evaluation import format_rows_table
    scripted = iter([(1.0, 2.0), (10.0, 10.0), (30.0, 20.0), (20.0, 30.0), (15.0, 15.0)])

    def evaluate_fn(model):
        assert model == "model"
        mAP, rank1 = next(scripted)
        return {"SynthD": {"mAP": mAP, "Rank-1": rank1, "Rank-5": 50.0, "Rank-10": 60.0, "mINP": 1.0}}

    from reid.engine.hooks import MetricsLogger
    loop = ScriptedLoop(tmp_path, max_iter=8, iters_per_epoch=2)
    reference = {"name": "reference", "iteration": None, "results": {"SynthD": {"mAP": 5.0, "Rank-1": 6.0}}}
    evaluator = Evaluator(evaluate_fn, period_epochs=1, at_start=True, extra_rows=[reference])
    writer = MetricsWriter(str(tmp_path), tensorboard=False)
    # LOG_PERIOD 5 does not meet the evaluations: the log is also written after each of them
    loop.register_hooks([evaluator, MetricsLogger(writer, period=5, flush_at=evaluator.due)])
    loop.train(0, 8)
    logged = [(r["iteration"], r["SynthD/mAP"]) for r in read_metrics(writer.path) if "SynthD/mAP" in r]
    assert logged == [(-1, 1.0), (1, 10.0), (3, 30.0), (5, 20.0), (7, 15.0)]
    assert [(r["name"], r["iteration"], r["epoch"]) for r in evaluator.rows() if r is not reference] == [
        ("untrained", -1, 0), ("last", 7, 4), ("best", 3, 2)]
    assert evaluator.rows()[1] is reference
    assert evaluator.best["score"] == 25.0 and evaluator.best["weights"] == "model_best.pth"
    assert evaluator.last["weights"] == "model_final.pth" and evaluator.last["results"]["SynthD"]["mAP"] == 15.0
    assert loop.saved == [(1, "model_best.pth", False), (3, "model_best.pth", False)]
    assert not (tmp_path / "last_checkpoint").exists()
    saved = __import__("compat").checkpoint.load(str(tmp_path / "model_best.pth"))
    assert saved["iteration"] == 3 and saved["hooks"]["Evaluator"]["best"]["iteration"] == 3
    assert loop.storage.latest()["SynthD/mAP"] == (15.0, 7)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["iteration"] == 7 and data["results"]["SynthD"]["mAP"] == 15.0
    assert [(r["name"], r["iteration"]) for r in data["rows"]] == [
        ("untrained", -1), ("reference", None), ("last", 7), ("best", 3)]
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in format_rows_table(data["rows"]).splitlines()]
    assert table[0] == ["Model", "Iteration", "Dataset", "Rank-1", "Rank-5", "Rank-10", "mAP", "mINP"]
    assert table[2:] == [["untrained", "-", "SynthD", "2.0", "50.0", "60.0", "1.0", "1.0"],
                         ["reference", "-", "SynthD", "6.0", "-", "-", "5.0", "-"],
                         ["last", "7", "SynthD", "15.0", "50.0", "60.0", "15.0", "1.0"],
                         ["best", "3", "SynthD", "20.0", "50.0", "60.0", "30.0", "1.0"]]

    restored = Evaluator(evaluate_fn, period_epochs=1)
    restored.load_state_dict(saved["hooks"]["Evaluator"])
    assert restored.best == saved["hooks"]["Evaluator"]["best"] and restored.best["score"] == 25.0


def test_checkpoint_schedule_epochs_iterations_and_final(tmp_path):
    """CHECKPOINT_PERIOD 1 epoch of 4 iterations, CHECKPOINT_ITERS 3, 10 iterations: each save becomes the
    resume checkpoint, and only the newest iteration checkpoint is kept."""
    from reid.engine.hooks import PeriodicCheckpointer
    loop = ScriptedLoop(tmp_path, max_iter=10, iters_per_epoch=4)
    loop.register_hooks([PeriodicCheckpointer(period_epochs=1, period_iters=3)])
    loop.train(0, 10)
    assert [(it, name) for it, name, _ in loop.saved] == [
        (2, "model_iter_0000003.pth"), (3, "model_0001.pth"), (5, "model_iter_0000006.pth"), (7, "model_0002.pth"),
        (8, "model_iter_0000009.pth"), (9, "model_final.pth")]
    assert sorted(p.name for p in tmp_path.glob("model_*.pth")) == [
        "model_0001.pth", "model_0002.pth", "model_final.pth", "model_iter_0000009.pth"]
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"


def test_hooks_run_in_order_and_after_train_runs_after_an_error(tmp_path):
    calls = []

    class Recorder(HookBase):
        def __init__(self, tag):
            self.tag = tag

        def before_train(self):
            calls.append((self.tag, "before_train", self.trainer.iter))

        def after_step(self):
            calls.append((self.tag, "after_step", self.trainer.iter))

        def after_train(self):
            calls.append((self.tag, "after_train", self.trainer.iter))

    class Failing(ScriptedLoop):
        def run_step(self):
            if self.iter == 2:
                raise RuntimeError("boom")

    loop = Failing(tmp_path, max_iter=5, iters_per_epoch=5)
    loop.register_hooks([Recorder("a"), None, Recorder("b")])
    with pytest.raises(RuntimeError, match="boom"):
        loop.train(1, 5)
    assert calls == [("a", "before_train", 1), ("b", "before_train", 1), ("a", "after_step", 1),
                     ("b", "after_step", 1), ("a", "after_train", 2), ("b", "after_train", 2)]
    with pytest.raises(TypeError):
        loop.register_hooks([object()])


# ----------------------------------------------------------------------------- supervisor
# A stand-in training process: appends its arguments to runs.jsonl, then follows the plan for its run number:
# "ckpt+X" writes a last_checkpoint pointer first, then X is an exit status or a signal to kill itself with.
CHILD = r"""
import json, os, signal, sys
out, plan = sys.argv[1], sys.argv[2].split(",")
runs = os.path.join(out, "runs.jsonl")
n = sum(1 for _ in open(runs)) if os.path.exists(runs) else 0
with open(runs, "a") as fh:
    fh.write(json.dumps(sys.argv[3:]) + "\n")
action = plan[n]
if action.startswith("ckpt+"):
    with open(os.path.join(out, "last_checkpoint"), "w") as fh:
        fh.write("model_iter_%07d.pth\n" % n)
    action = action[len("ckpt+"):]
if action.startswith("SIG"):
    os.kill(os.getpid(), getattr(signal, action))
sys.exit(int(action))
"""


def _supervise(tmp_path, plan, max_restarts=3, resume=False):
    from reid.engine.supervisor import supervise
    messages = []
    rc = supervise([sys.executable, "-c", CHILD, str(tmp_path), plan], str(tmp_path), max_restarts, resume=resume,
                   log=messages.append)
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    return rc, runs, messages


def test_supervisor_restarts_after_crash_signals_and_resumes_once_a_checkpoint_exists(tmp_path):
    rc, runs, messages = _supervise(tmp_path, "SIGKILL,ckpt+SIGSEGV,SIGABRT,0")
    assert rc == 0
    assert runs == [[], [], ["--resume"], ["--resume"]]  # the first crash came before any checkpoint
    assert messages == [
        "training process killed by SIGKILL; restarting from the start (no checkpoint yet) (restart 1 of 3)",
        "training process killed by SIGSEGV; restarting from %s (restart 2 of 3)"
        % os.path.join(str(tmp_path), "model_iter_0000001.pth"),
        "training process killed by SIGABRT; restarting from %s (restart 3 of 3)"
        % os.path.join(str(tmp_path), "model_iter_0000001.pth")]


def test_supervisor_gives_up_after_max_restarts(tmp_path):
    rc, runs, messages = _supervise(tmp_path, "ckpt+SIGSEGV,SIGSEGV,0", max_restarts=1)
    assert rc == 128 + signal.SIGSEGV and len(runs) == 2
    assert messages[-1] == "training process killed by SIGSEGV; not restarted (--max-restarts 1 used up)"


@pytest.mark.parametrize("plan,rc", [("2,0", 2), ("SIGTERM,0", 128 + signal.SIGTERM),
                                     ("SIGINT,0", 128 + signal.SIGINT)])
def test_supervisor_does_not_restart_errors_or_requested_stops(tmp_path, plan, rc):
    got, runs, messages = _supervise(tmp_path, plan)
    assert got == rc and len(runs) == 1 and messages == []


def test_supervisor_never_resumes_from_an_earlier_runs_checkpoint(tmp_path):
    """A fresh run (no --resume) into an OUTPUT_DIR holding an older run's last_checkpoint restarts from the
    start after a crash that came before its own first checkpoint; with --resume it resumes."""
    (tmp_path / "last_checkpoint").write_text("model_old.pth\n")
    rc, runs, _ = _supervise(tmp_path, "SIGSEGV,0")
    assert rc == 0 and runs == [[], []]
    (tmp_path / "runs.jsonl").unlink()
    rc, runs, _ = _supervise(tmp_path, "SIGSEGV,0", resume=True)
    assert rc == 0 and runs == [["--resume"], ["--resume"]]


def test_rows_table_with_several_targets_adds_their_average():
    from reid.evaluation import format_rows_table
    metrics = lambda v: {"Rank-1": v, "Rank-5": v, "Rank-10": v, "mAP": v / 2, "mINP": 1.0}  # noqa: E731
    text = format_rows_table([{"name": "last", "iteration": 12, "results": {"A": metrics(10.0), "B": metrics(20.0)}}])
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines()[2:]]
    assert table == [["last", "12", "A", "10.0", "10.0", "10.0", "5.0", "1.0"],
                     ["last", "12", "B", "20.0", "20.0", "20.0", "10.0", "1.0"],
                     ["last", "12", "Average", "15.0", "15.0", "15.0", "7.5", "1.0"]]


def test_supervisor_passes_sigterm_on_and_does_not_restart(tmp_path):
    """SIGTERM sent to the supervising process (a scheduler stopping the job) reaches the training process,
    which ends, and nothing is restarted."""
    import subprocess
    import time
    from tests.crossenv import ROOT, child_env
    child = "import os, sys, time; open(sys.argv[1], 'a').write('%d\\n' % os.getpid()); time.sleep(120)"
    started = tmp_path / "started"
    script = ("import sys; from reid.engine.supervisor import supervise; "
              "sys.exit(supervise([sys.executable, '-c', %r, %r], %r, 3))" % (child, str(started), str(tmp_path)))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=str(ROOT), env=child_env())
    try:
        deadline = time.time() + 60
        while not (started.exists() and started.read_text().endswith("\n")):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    (pid,) = [int(line) for line in started.read_text().split()]  # started once, never again
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
