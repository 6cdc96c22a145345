"""Learning rate as a pure function of the iteration (plain python floats, identical on both backends).

This reproduces what fast-reid's trainer does with torch schedulers, as ACL runs it:

* `build_lr_scheduler` builds the main scheduler first (`CosineAnnealingLR(T_max=MAX_EPOCH - warmup_epochs,
  eta_min)` or `MultiStepLR(milestones, gamma)`), then `WarmupLR` (closed form: base_lr * factor(k), factor
  from `warmup_factor` to 1 over warmup_iters = warmup_epochs * iters_per_epoch).
* The `LRScheduler` hook steps the warmup after every iteration while `iter + 1 <= warmup_iters`, and at the
  end of every epoch steps the main scheduler: MultiStepLR always, CosineAnnealingLR only once
  `iter + 1 > warmup_iters` (with the iteration counter already past the epoch, so the first cosine step
  comes at the end of the last warmup epoch).

Consequences reproduced here: the first post-warmup epoch already runs at cosine step 1, the last epoch at
eta_min; a multistep milestone that falls inside the warmup is overwritten by the next warmup step (it only
affects the first iteration of that epoch); milestones count from the epoch the warmup ends.
`lr_at(i)` is the lr in effect while iteration i (0-based, global) runs.
"""
import math
from bisect import bisect_right
from collections import Counter

from compat.errors import UserError

WARMUP_METHODS = ("linear", "constant", "exp")
_SCHED_ALIASES = {"cosineannealinglr": "cosine", "cosine": "cosine", "multisteplr": "multistep",
                  "multistep": "multistep"}


def warmup_factor_at(k, warmup_iters, warmup_factor, method="linear"):
    """fast-reid's `_get_warmup_factor_at_iter`: factor after k warmup steps (1.0 from k >= warmup_iters)."""
    if k >= warmup_iters:
        return 1.0
    if method == "constant":
        return warmup_factor
    if method == "linear":
        alpha = k / warmup_iters
        return warmup_factor * (1 - alpha) + alpha
    if method == "exp":
        return warmup_factor ** (1 - k / warmup_iters)
    raise UserError("unknown warmup method %r; use one of: %s" % (method, ", ".join(WARMUP_METHODS)))


def cosine_lr(base_lr, step, t_max, eta_min=0.0):
    """CosineAnnealingLR after `step` steps (closed form)."""
    return eta_min + (base_lr - eta_min) * (1 + math.cos(math.pi * step / t_max)) / 2


def multistep_lr(base_lr, step, milestones, gamma):
    """MultiStepLR after `step` steps: one factor gamma per milestone <= step (repeated milestones count twice)."""
    return base_lr * gamma ** bisect_right(sorted(milestones), step)


def _int(name, value, minimum):
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise UserError("LRSchedule %s must be an integer >= %d, got %r" % (name, minimum, value))
    return int(value)


class LRSchedule:
    def __init__(self, base_lr, iters_per_epoch, max_epoch, warmup_epochs=0, warmup_factor=0.1,
                 warmup_method="linear", sched="CosineAnnealingLR", eta_min=0.0, milestones=(), gamma=0.1):
        self.base_lr = float(base_lr)
        self.iters_per_epoch = _int("iters_per_epoch", iters_per_epoch, 1)
        self.max_epoch = _int("max_epoch", max_epoch, 1)
        self.warmup_epochs = _int("warmup_epochs", warmup_epochs, 0)
        self.warmup_factor = float(warmup_factor)
        self.warmup_method = str(warmup_method).lower()
        if self.warmup_method not in WARMUP_METHODS:
            raise UserError("unknown warmup method %r (SOLVER.WARMUP_METHOD); use one of: %s"
                            % (warmup_method, ", ".join(WARMUP_METHODS)))
        key = str(sched).replace("_", "").lower()
        if key not in _SCHED_ALIASES:
            raise UserError("unknown lr schedule %r (SOLVER.SCHED); use CosineAnnealingLR or MultiStepLR" % (sched,))
        self.sched = _SCHED_ALIASES[key]
        self.eta_min = float(eta_min)
        self.milestones = tuple(_int("milestone", m, 1) for m in milestones)
        self.gamma = float(gamma)
        self.warmup_iters = self.warmup_epochs * self.iters_per_epoch
        self.t_max = self.max_epoch - self.warmup_epochs
        if self.sched == "cosine" and self.t_max < 1:
            raise UserError("cosine schedule needs MAX_EPOCH (%d) > warmup epochs (%d)"
                            % (self.max_epoch, self.warmup_epochs))
        self._milestone_count = Counter(self.milestones)
        # Main-scheduler steps happen at the end of epochs; the cosine one only from the last warmup epoch on.
        self._first_cosine_epoch = max(self.warmup_epochs - 1, 0)

    def main_steps_before(self, epoch):
        """How many times the main scheduler has stepped when `epoch` starts."""
        if self.sched == "cosine":
            return max(epoch - self._first_cosine_epoch, 0)
        return epoch

    def lr_at(self, iteration):
        it = _int("iteration", iteration, 0)
        epoch, within = divmod(it, self.iters_per_epoch)
        if it < self.warmup_iters:
            lr = self.base_lr * warmup_factor_at(it, self.warmup_iters, self.warmup_factor, self.warmup_method)
            # MultiStepLR's end-of-epoch step scales the current lr; the next warmup step overwrites it again.
            if self.sched == "multistep" and within == 0 and epoch >= 1:
                lr *= self.gamma ** self._milestone_count[epoch]
            return lr
        if self.sched == "cosine":
            return cosine_lr(self.base_lr, self.main_steps_before(epoch), self.t_max, self.eta_min)
        # Decays from milestones inside the warmup were overwritten by the warmup's own steps.
        count = sum(n for m, n in self._milestone_count.items() if self.warmup_epochs <= m <= epoch)
        return self.base_lr * self.gamma ** count

    def lrs(self, iterations):
        return [self.lr_at(i) for i in iterations]

    @classmethod
    def from_config(cls, solver, base_lr, iters_per_epoch):
        """Build from a yacs SOLVER node (BASE_LR given separately: the two ACL optimizers share it)."""
        return cls(base_lr=base_lr, iters_per_epoch=iters_per_epoch, max_epoch=solver.MAX_EPOCH,
                   warmup_epochs=solver.WARMUP_EPOCHS, warmup_factor=solver.WARMUP_FACTOR,
                   warmup_method=solver.WARMUP_METHOD, sched=solver.SCHED, eta_min=solver.ETA_MIN_LR,
                   milestones=solver.STEPS, gamma=solver.GAMMA)
