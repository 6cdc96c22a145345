"""Hooks registered on the training loop: progress, metrics logs, evaluation (last and best), checkpoints,
plots. Each reads what the steps measured from `trainer.storage` and keeps what it produces itself.

Order matters within one iteration (`default_hooks`): the evaluator runs first, so that the metrics log
written next holds its scalars and the checkpoint written last holds its state. A checkpoint therefore never
lacks an evaluation or a log record that an uninterrupted run would have made before that point, which is
what lets a resumed run (`--resume`, or a restart after a crash) end with the same logs and results.
"""
import contextlib
import glob
import json
import math
import os

import numpy as np
from tqdm import tqdm

import compat
from reid.errors import UserError

from reid.engine.events import MetricsWriter, plot_curves
from reid.engine.train_loop import HookBase

BEST_CHECKPOINT = "model_best.pth"
FINAL_CHECKPOINT = "model_final.pth"

__all__ = ["HookBase", "ProgressBar", "MetricsLogger", "PeriodicCheckpointer", "Evaluator", "CurvePlotter",
           "WeightAverage", "default_hooks", "selection_score", "BEST_CHECKPOINT", "FINAL_CHECKPOINT"]


def epoch_ended(trainer):
    return (trainer.iter + 1) % trainer.iters_per_epoch == 0


def completed_epochs(trainer):
    return (trainer.iter + 1) // trainer.iters_per_epoch


def is_last_iteration(trainer):
    return trainer.iter + 1 == trainer.max_iter


class ProgressBar(HookBase):
    def before_train(self):
        self.bar = tqdm(total=self.trainer.max_iter, initial=self.trainer.start_iter, desc="train", unit="it",
                        dynamic_ncols=True, mininterval=1.0)

    def after_step(self):
        latest = self.trainer.storage.latest()
        value = lambda name, default: latest[name][0] if name in latest else default  # noqa: E731
        postfix = {"loss": "%.3f" % value("loss_basic", float("nan")), "lr": "%.2e" % value("lr", 0.0)}
        if "meta/loss_mtest" in latest:  # the newest meta step's loss (meta steps run every META.PERIOD)
            postfix["meta"] = "%.3f" % (value("meta/loss_mtrain", 0.0) + value("meta/loss_mtest", 0.0))
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def after_train(self):
        if hasattr(self, "bar"):
            self.bar.close()


class MetricsLogger(HookBase):
    """metrics.json records (and TensorBoard scalars) every LOG_PERIOD iterations, after the last one, and
    where `flush_at(iteration)` says so (after evaluations, whose values the next one would replace, and
    before checkpoints): one record per iteration, holding the newest value of each scalar put for that
    iteration and not yet written, so a record holds only what happened in its own iteration (a meta step's
    terms appear under the iteration of that meta step)."""

    def __init__(self, writer, period, flush_at=None):
        self.writer, self.period = writer, max(int(period), 1)
        self.flush_at = flush_at or (lambda iteration: False)
        self.written = None  # iteration up to which records were written (None: nothing yet)

    def before_train(self):
        self.writer.truncate_after(self.trainer.start_iter)
        self.write(upto=self.trainer.start_iter - 1)  # the evaluation before training (hooks before this one)

    def write(self, upto=None):
        """Write the records of the iterations after the last written one, up to `upto` (default: the
        current iteration)."""
        t = self.trainer
        upto = t.iter if upto is None else upto
        for iteration, scalars in sorted(t.storage.since(self.written).items()):
            if iteration > upto:
                continue
            record = {"iteration": iteration, "epoch": max(iteration, 0) // t.iters_per_epoch,
                      "world_size": getattr(getattr(t, "dist", None), "world_size", 1)}  # data-parallel ranks
            record.update(scalars)
            self.writer.write(record)
        self.written = upto

    def after_step(self):
        t = self.trainer
        if (t.iter + 1) % self.period == 0 or is_last_iteration(t) or self.flush_at(t.iter):
            self.write()

    def after_train(self):
        self.write()  # what is left after an error (the iteration that failed): useful for a diagnosis
        self.writer.close()


class PeriodicCheckpointer(HookBase):
    """`model_XXXX.pth` every CHECKPOINT_PERIOD epochs (XXXX = epochs done), `model_iter_XXXXXXX.pth` every
    CHECKPOINT_ITERS iterations (XXXXXXX = iterations done; only the newest is kept: it exists so that a
    crash in a long epoch loses little) and `model_final.pth` after the last iteration. Each becomes the
    checkpoint --resume continues from."""

    def __init__(self, period_epochs, period_iters=0):
        self.period = max(int(period_epochs), 0)
        self.period_iters = max(int(period_iters), 0)

    def due(self, iteration):
        """Name of the checkpoint written after `iteration`, or None."""
        t = self.trainer
        done = iteration + 1
        if done == t.max_iter:
            return FINAL_CHECKPOINT
        if self.period and done % t.iters_per_epoch == 0 and (done // t.iters_per_epoch) % self.period == 0:
            return "model_%04d.pth" % (done // t.iters_per_epoch)
        if self.period_iters and done % self.period_iters == 0:
            return "model_iter_%07d.pth" % done
        return None

    def after_step(self):
        name = self.due(self.trainer.iter)
        if name is None:
            return
        path = self.trainer.save_checkpoint(name)
        if name.startswith("model_iter_"):  # the pointer has moved to the new one: older ones are not needed
            for old in glob.glob(os.path.join(os.path.dirname(path), "model_iter_*.pth")):
                if os.path.basename(old) != name:
                    os.remove(old)


class WeightAverage(HookBase):
    """SOLVER.EMA: an exponential moving average of the weights and of the batch-norm running statistics
    (timm's ModelEmaV2; SWAD, Cha et al. 2021, for why an average of the weights along the trajectory
    generalises better to unseen domains than the last weights). The evaluator scores the average.

    From iteration `start_iter` on, after every `period`-th iteration (and after the last one), each
    floating-point tensor of the model's state becomes ``a = d**k * a + (1 - d**k) * w`` with d = `decay` per
    iteration and k the iterations since the previous update (so `period` thins the updates without changing
    the horizon, about 1 / (1 - d) iterations); the first update copies the weights. Integer buffers
    (num_batches_tracked) are copied. The average lives in numpy on the host: one host read per tensor per
    update, no framework ops (the same cost on both backends, nothing for MindSpore to record or compile).

    Its state (`state_dict`: the average and the iteration of its last update) is saved in every checkpoint
    with the other hooks' states, so --resume continues the same average; `model_state_from_file` (test.py,
    MODEL.WEIGHTS) takes the average from a checkpoint that has one, i.e. the weights its evaluations scored."""

    def __init__(self, decay, start_iter=0, period=1):
        if not 0.0 <= float(decay) < 1.0:
            raise UserError("SOLVER.EMA.DECAY must be in [0, 1), got %r; e.g. 0.98 averages over about the last "
                            "50 iterations" % (decay,))
        self.decay, self.start_iter, self.period = float(decay), int(start_iter), max(int(period), 1)
        self.average = None   # {state-dict name: numpy array}
        self.updated = None   # iteration of the last update

    def state_dict(self):
        return {"average": self.average, "updated": self.updated}

    def load_state_dict(self, state):
        average = state.get("average")
        self.average = None if average is None else {k: np.array(v) for k, v in average.items()}
        self.updated = state.get("updated")

    def due(self, iteration):
        t = self.trainer
        return iteration >= self.start_iter and ((iteration - self.start_iter) % self.period == 0
                                                 or iteration + 1 == t.max_iter)

    def update(self, iteration):
        current = self.trainer.model.state_dict()
        if self.average is None:
            self.average = {k: np.array(v.detach().cpu().numpy()) for k, v in current.items()}
        else:
            keep = self.decay ** (iteration - self.updated)
            for name, value in current.items():
                value, average = value.detach().cpu().numpy(), self.average[name]
                if np.issubdtype(average.dtype, np.floating):
                    average *= keep
                    average += (1.0 - keep) * value
                else:
                    average[...] = value
        self.updated = int(iteration)

    def after_step(self):
        if self.due(self.trainer.iter):
            self.update(self.trainer.iter)

    @contextlib.contextmanager
    def applied(self, model):
        """Within the block the model holds the average (unchanged before the first update); the trained
        weights are put back after it."""
        if self.average is None:
            yield
            return
        trained = compat.checkpoint.state_dict(model)
        compat.checkpoint.load_state_dict(model, self.average)
        try:
            yield
        finally:
            compat.checkpoint.load_state_dict(model, trained)


def selection_score(results):
    """What model_best is chosen by (as the original): (mAP + Rank-1) / 2 on the target dataset, averaged
    over the targets when there are several."""
    scores = [(m["mAP"] + m["Rank-1"]) / 2.0 for m in results.values()]
    return sum(scores) / len(scores)


class Evaluator(HookBase):
    """Evaluates on DATASETS.TESTS every EVAL_PERIOD epochs and after the last iteration (and, with
    `at_start`, before training). Keeps the last evaluation and the best one by `selection_score` (the
    earliest of equals), saves the weights of the best as model_best.pth, and writes results.json.

    An evaluation is a row: {"name", "iteration", "epoch", "results": {dataset: metrics}} plus "weights"
    (a file in OUTPUT_DIR) where the evaluated weights were saved. `rows()` lists "untrained" (with
    at_start), the `extra_rows` given (rows of references that are not training iterations, e.g.
    {"name": "colour histogram", "iteration": None, "results": ...}; the caller supplies them on every run),
    "last" and "best"."""

    def __init__(self, evaluate_fn, period_epochs, at_start=False, extra_rows=(), average=None):
        self.evaluate_fn, self.period, self.at_start = evaluate_fn, max(int(period_epochs), 0), at_start
        self.extra_rows = list(extra_rows)
        self.average = average  # a WeightAverage hook registered before this one: its average is evaluated
        self.initial = self.last = self.best = None

    def state_dict(self):
        return {"initial": self.initial, "last": self.last, "best": self.best}

    def load_state_dict(self, state):
        self.initial, self.last, self.best = state.get("initial"), state.get("last"), state.get("best")

    def _evaluate(self, name, iteration, epoch):
        t = self.trainer
        averaged = self.average is not None and self.average.average is not None
        with self.average.applied(t.model) if averaged else contextlib.nullcontext():
            results = self.evaluate_fn(t.model)
        for dataset, metrics in results.items():
            t.storage.put_scalars({"%s/%s" % (dataset, k): v for k, v in metrics.items()}, iteration=iteration)
        row = {"name": name, "iteration": iteration, "epoch": epoch, "results": results}
        if averaged:
            row["averaged"] = True  # the weight average (SOLVER.EMA), not the weights of that iteration
        return row

    def before_train(self):
        if self.at_start and self.trainer.start_iter == 0:
            self.initial = self._evaluate("untrained", -1, 0)

    def due(self, iteration):
        """Whether an evaluation follows `iteration`."""
        t, done = self.trainer, iteration + 1
        return done == t.max_iter or bool(self.period and done % t.iters_per_epoch == 0
                                          and (done // t.iters_per_epoch) % self.period == 0)

    def after_step(self):
        if not self.due(self.trainer.iter):
            return
        t = self.trainer
        self.last = self._evaluate("last", t.iter, completed_epochs(t))
        if is_last_iteration(t):
            self.last["weights"] = FINAL_CHECKPOINT  # written by the checkpointer in this same iteration
        score = selection_score(self.last["results"])
        if self.best is None or score > self.best["score"]:
            self.best = dict(self.last, name="best", score=score, weights=BEST_CHECKPOINT)
            t.save_checkpoint(BEST_CHECKPOINT, point=False)
        self.write_results()

    def rows(self):
        return [row for row in [self.initial] + self.extra_rows + [self.last, self.best] if row is not None]

    def write_results(self):
        """results.json: `rows` (see the class), and the last evaluation's iteration, epoch and results at
        the top level (the layout before model_best existed)."""
        path = os.path.join(self.trainer.output_dir, "results.json")
        data = {"iteration": self.last["iteration"], "epoch": self.last["epoch"], "results": self.last["results"],
                "rows": self.rows()}
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)


def classification_chance(cfg):
    """loss_cls of uniform predictions: CE.SCALE * ln(classes), averaged over the source domains' classifiers
    (exact when they have equal class counts; label smoothing keeps it, its targets sum to 1)."""
    classes = [int(n) for n in cfg.MODEL.HEADS.NUM_CLASSES]
    return float(cfg.MODEL.LOSSES.CE.SCALE) * sum(math.log(n) for n in classes) / len(classes)


class CurvePlotter(HookBase):
    def __init__(self, metrics_path, out_png, cls_chance=None):
        self.metrics_path, self.out_png, self.cls_chance = metrics_path, out_png, cls_chance

    def after_train(self):
        if is_last_iteration(self.trainer) and os.path.exists(self.metrics_path):
            plot_curves(self.metrics_path, self.out_png, self.cls_chance)


def default_hooks(trainer, evaluate_fn=None, progress=True):
    """[progress bar], [weight average], [evaluator], metrics log, checkpointer, curve plot, in this order (see
    the module)."""
    cfg = trainer.cfg
    writer = MetricsWriter(cfg.OUTPUT_DIR)
    checkpointer = PeriodicCheckpointer(cfg.SOLVER.CHECKPOINT_PERIOD, cfg.SOLVER.CHECKPOINT_ITERS)
    ema = cfg.SOLVER.EMA
    average = WeightAverage(ema.DECAY, ema.START_ITER, ema.PERIOD) if ema.ENABLED else None
    evaluator = Evaluator(evaluate_fn, cfg.TEST.EVAL_PERIOD, at_start=cfg.TEST.EVAL_AT_START,
                          average=average) if evaluate_fn else None

    def flush_at(iteration):
        return checkpointer.due(iteration) is not None or (evaluator is not None and evaluator.due(iteration))

    hooks = [ProgressBar() if progress else None,
             average,    # before the evaluator, which scores the average, and the checkpointer, which saves it
             evaluator,
             MetricsLogger(writer, cfg.LOG_PERIOD, flush_at=flush_at),
             checkpointer,
             CurvePlotter(writer.path, os.path.join(cfg.OUTPUT_DIR, "curves.png"), classification_chance(cfg))]
    return [h for h in hooks if h is not None]
