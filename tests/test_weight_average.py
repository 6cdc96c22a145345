"""SOLVER.EMA (reid/engine/hooks.py WeightAverage): the average's known values on a toy module, the
evaluator scoring the average and getting the trained weights back, and an exact --resume of the average
through a real checkpoint file."""
import numpy as np
import pytest

from reid.engine.train_loop import HookBase, TrainLoop


def _toy_module():
    """One parameter, one float buffer (a running statistic) and one integer buffer (a batch count)."""
    from compat import nn, torch

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(2, 3))
            self.register_buffer("running_mean", torch.zeros(3))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.int64))
    return Toy()


class ToyLoop(TrainLoop):
    """Each iteration i sets the weight to i, the running mean to 10 i and the count to i (no gradients:
    the average only reads the state)."""

    def __init__(self, output_dir, max_iter):
        super().__init__()
        self.output_dir, self.max_iter, self.iters_per_epoch = str(output_dir), max_iter, max_iter
        self.model = _toy_module()

    def run_step(self):
        import compat
        state = {"weight": np.full((2, 3), float(self.iter), np.float32),
                 "running_mean": np.full(3, 10.0 * self.iter, np.float32),
                 "num_batches_tracked": np.array(self.iter, np.int64)}
        compat.checkpoint.load_state_dict(self.model, state)

    def save_checkpoint(self, name, point=True):
        from reid.engine.checkpointer import Checkpointer
        state = {"iteration": self.iter, "model": {}, "optimizer": {},
                 "hooks": {type(h).__name__: h.state_dict() for h in self.hooks if hasattr(h, "state_dict")}}
        return Checkpointer(self.output_dir).save(name, state, point=point)


def _weight(model):
    import compat
    return compat.checkpoint.state_dict(model)


def test_average_known_values_period_and_last_iteration(tmp_path):
    """decay 0.5 per iteration from iteration 1, every 2nd iteration, 6 iterations: updates after 1 (a copy:
    1), 3 (keep 0.5^2: 0.25 * 1 + 0.75 * 3 = 2.5) and 5 (the last: 0.25 * 2.5 + 0.75 * 5 = 4.375); the running
    mean is averaged the same way (x10), the integer count copied."""
    from reid.engine.hooks import WeightAverage
    loop = ToyLoop(tmp_path, max_iter=6)
    average = WeightAverage(0.5, start_iter=1, period=2)
    seen = []

    class Record(HookBase):  # the average after each iteration
        def after_step(self):
            seen.append(None if average.average is None else float(average.average["weight"][0, 0]))
    loop.register_hooks([average, Record()])
    loop.train(0, 6)
    assert seen == [None, 1.0, 1.0, 2.5, 2.5, 4.375]
    np.testing.assert_allclose(average.average["weight"], np.full((2, 3), 4.375), rtol=1e-6)
    np.testing.assert_allclose(average.average["running_mean"], np.full(3, 43.75), rtol=1e-6)
    assert average.average["num_batches_tracked"] == 5 and average.updated == 5
    # applied(): the model holds the average inside the block, its own weights after it
    with average.applied(loop.model):
        np.testing.assert_allclose(_weight(loop.model)["weight"], np.full((2, 3), 4.375), rtol=1e-6)
    np.testing.assert_array_equal(_weight(loop.model)["weight"], np.full((2, 3), 5.0))
    assert int(_weight(loop.model)["num_batches_tracked"]) == 5


def test_evaluator_scores_the_average_and_marks_its_rows(tmp_path):
    """The evaluation after the last iteration sees the averaged weight (decay 0 with period 1: the last
    weights themselves, so use decay 0.5: 0.5 * 2 + 0.5 * 3 = 2.5 after iterations 2 and 3); the evaluation
    before training (no average yet) sees the untrained weights and is not marked."""
    from reid.engine.hooks import Evaluator, WeightAverage
    loop = ToyLoop(tmp_path, max_iter=4)
    average = WeightAverage(0.5, start_iter=2)
    scored = []

    def evaluate_fn(model):
        value = float(_weight(model)["weight"][0, 0])
        scored.append(value)
        return {"Toy": {"mAP": value, "Rank-1": value, "mINP": value}}
    evaluator = Evaluator(evaluate_fn, period_epochs=0, at_start=True, average=average)
    loop.register_hooks([average, evaluator])
    loop.train(0, 4)
    assert scored == [0.0, 2.5]
    assert "averaged" not in evaluator.initial and evaluator.last["averaged"] is True
    assert float(_weight(loop.model)["weight"][0, 0]) == 3.0  # the trained weights are back


def test_average_resumes_exactly_from_a_checkpoint(tmp_path):
    """8 iterations straight vs 5, a checkpoint file, and a fresh hook loaded from it for iterations 5-7: the
    same average, and model_state_from_file (test.py / MODEL.WEIGHTS) returns it."""
    from reid.engine.checkpointer import load_training_state, model_state_from_file
    from reid.engine.hooks import WeightAverage
    full = ToyLoop(tmp_path / "full", max_iter=8)
    full_avg = WeightAverage(0.7, start_iter=1, period=3)
    full.register_hooks([full_avg])
    full.train(0, 8)

    part = ToyLoop(tmp_path / "part", max_iter=8)
    part_avg = WeightAverage(0.7, start_iter=1, period=3)
    part.register_hooks([part_avg])
    part.train(0, 5)
    path = part.save_checkpoint("model_0000005.pth")
    resumed = ToyLoop(tmp_path / "part", max_iter=8)
    resumed_avg = WeightAverage(0.7, start_iter=1, period=3)
    resumed_avg.load_state_dict(load_training_state(path)["hooks"]["WeightAverage"])
    resumed.register_hooks([resumed_avg])
    resumed.train(5, 8)
    assert resumed_avg.updated == full_avg.updated == 7
    for name, value in full_avg.average.items():
        np.testing.assert_array_equal(resumed_avg.average[name], value, err_msg=name)
    # updates after 1 (copy 1), 4 (keep 0.343: 0.343 + 0.657 * 4 = 2.971) and 7 (last: 0.343 * 2.971 + 0.657 * 7)
    assert float(full_avg.average["weight"][0, 0]) == pytest.approx(0.343 * (0.343 + 0.657 * 4) + 0.657 * 7,
                                                                   rel=1e-6)
    saved = model_state_from_file(path)
    np.testing.assert_array_equal(saved["weight"], part_avg.average["weight"])


def test_decay_outside_zero_one_is_one_clear_error():
    from compat.errors import UserError
    from reid.engine.hooks import WeightAverage
    with pytest.raises(UserError, match="SOLVER.EMA.DECAY must be in"):
        WeightAverage(1.0)
