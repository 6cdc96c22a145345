"""Hooks around the training loop (detectron2/fast-reid style): progress, logs, checkpoints, evaluation,
plots. Each sees the trainer after every iteration and at the end."""
import json
import os

from tqdm import tqdm

from reid.engine.events import MetricsWriter, plot_curves


class HookBase:
    def before_train(self, trainer):
        pass

    def after_step(self, trainer):
        pass

    def after_train(self, trainer):
        pass

    def close(self, trainer):
        pass


def epoch_ended(trainer):
    return (trainer.iter + 1) % trainer.iters_per_epoch == 0


def completed_epochs(trainer):
    return (trainer.iter + 1) // trainer.iters_per_epoch


class ProgressBar(HookBase):
    def before_train(self, trainer):
        self.bar = tqdm(total=trainer.max_iter, initial=trainer.start_iter, desc="train", unit="it",
                        dynamic_ncols=True, mininterval=1.0)

    def after_step(self, trainer):
        t = trainer.last_terms
        postfix = {"loss": "%.3f" % t.get("loss_basic", float("nan")), "lr": "%.2e" % t.get("lr", 0.0)}
        if "meta/loss_mtest" in t:
            postfix["meta"] = "%.3f" % (t["meta/loss_mtrain"] + t["meta/loss_mtest"])
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self, trainer):
        if hasattr(self, "bar"):
            self.bar.close()


class MetricsLogger(HookBase):
    """One metrics.json record (and TensorBoard scalars) every LOG_PERIOD iterations and at the last one."""

    def __init__(self, writer, period):
        self.writer, self.period = writer, max(int(period), 1)

    def before_train(self, trainer):
        self.writer.truncate_after(trainer.start_iter)

    def after_step(self, trainer):
        if (trainer.iter + 1) % self.period and trainer.iter + 1 != trainer.max_iter:
            return
        record = {"iteration": trainer.iter, "epoch": trainer.epoch}
        record.update(trainer.last_terms)
        self.writer.write(record)

    def close(self, trainer):
        self.writer.close()


class PeriodicCheckpointer(HookBase):
    """`model_XXXX.pth` every CHECKPOINT_PERIOD epochs (XXXX = epochs done) and `model_final.pth` at the end."""

    def __init__(self, period_epochs):
        self.period = max(int(period_epochs), 0)

    def after_step(self, trainer):
        if trainer.iter + 1 == trainer.max_iter or not epoch_ended(trainer) or not self.period:
            return
        if completed_epochs(trainer) % self.period == 0:
            trainer.save_checkpoint("model_%04d.pth" % completed_epochs(trainer))

    def after_train(self, trainer):
        if trainer.iter + 1 == trainer.max_iter:
            trainer.save_checkpoint("model_final.pth")


class Evaluator(HookBase):
    """Evaluates on DATASETS.TESTS every EVAL_PERIOD epochs and at the end; `results.json` keeps the last."""

    def __init__(self, evaluate_fn, period_epochs, writer, at_start=False):
        self.evaluate_fn, self.period, self.writer = evaluate_fn, max(int(period_epochs), 0), writer
        self.at_start = at_start
        self.history = []

    def _evaluate(self, trainer, iteration, epoch):
        """Evaluate and log one metrics.json record ("<dataset>/<metric>" keys); returns (results, record)."""
        results = self.evaluate_fn(trainer.model)
        record = {"iteration": iteration, "epoch": epoch}
        for dataset, metrics in results.items():
            record.update({"%s/%s" % (dataset, k): v for k, v in metrics.items()})
        self.writer.write(record)
        return results, record

    def before_train(self, trainer):
        if self.at_start and trainer.start_iter == 0:
            trainer.initial_results = self._evaluate(trainer, -1, 0)[0]

    def _run(self, trainer):
        results, record = self._evaluate(trainer, trainer.iter, completed_epochs(trainer))
        self.history.append(record)
        path = os.path.join(trainer.output_dir, "results.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"iteration": trainer.iter, "epoch": completed_epochs(trainer), "results": results}, fh,
                      indent=2, sort_keys=True)
        os.replace(tmp, path)
        trainer.last_results = results
        return results

    def after_step(self, trainer):
        if trainer.iter + 1 == trainer.max_iter or not epoch_ended(trainer) or not self.period:
            return
        if completed_epochs(trainer) % self.period == 0:
            self._run(trainer)

    def after_train(self, trainer):
        if trainer.iter + 1 == trainer.max_iter:
            self._run(trainer)


class CurvePlotter(HookBase):
    def __init__(self, metrics_path, out_png):
        self.metrics_path, self.out_png = metrics_path, out_png

    def after_train(self, trainer):
        if os.path.exists(self.metrics_path):
            plot_curves(self.metrics_path, self.out_png)


def default_hooks(trainer, evaluate_fn=None, progress=True):
    cfg = trainer.cfg
    writer = MetricsWriter(cfg.OUTPUT_DIR)
    hooks = [MetricsLogger(writer, cfg.LOG_PERIOD), PeriodicCheckpointer(cfg.SOLVER.CHECKPOINT_PERIOD)]
    if evaluate_fn is not None:
        hooks.append(Evaluator(evaluate_fn, cfg.TEST.EVAL_PERIOD, writer, at_start=cfg.TEST.EVAL_AT_START))
    hooks.append(CurvePlotter(writer.path, os.path.join(cfg.OUTPUT_DIR, "curves.png")))
    if progress:
        hooks.insert(0, ProgressBar())
    return hooks
