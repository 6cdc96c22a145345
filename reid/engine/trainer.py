"""The ACL trainer (docs/method.md#training): basic steps plus a first-order meta step every META.PERIOD
iterations, two SGD optimizers on one warmup + cosine schedule.

Iteration i runs ``INITIAL_BASIC_STEPS`` basic steps when i == 0, else one; then, when META is enabled and
``i % PERIOD == 0``, one meta step:

1. a meta-test domain is drawn uniformly; the other sources form the meta-train batch (one per-domain batch
   each, concatenated in domain order);
2. ``L_mtr(θ)`` on the meta-train batch ('hold' BN) and its gradient g;
3. fast weights ``θ' = θ - α·r·g`` with g detached (first-order, as the original), α the meta optimizer's
   current lr, r = ADAPTOR_STEP_RATIO for parameters of `adaptor` modules, else 1;
4. ``L_mte(θ')`` on the meta-test batch ('hold' BN); its gradient w.r.t. θ equals ∇θ'L_mte because g is
   constant;
5. the meta optimizer (SGD, momentum META_MOMENTUM) steps with ∇L_mtr(θ) + ∇L_mte(θ').

Unused parameters: with MODEL.NUM_SPLITS > 1 (the original's 4-GPU DataParallel) every parameter receives a
gradient each step (DataParallel's broadcast backward materialises zeros for parameters a replica did not
use), so weight decay and momentum act on all of them; so do data-parallel runs (world size > 1), whose
ranks are DataParallel's devices (compat.distributed averages loss, terms and gradients over them). With
NUM_SPLITS = 1 (a single device) a parameter the loss does not reach gets torch's ``grad is None`` and the
optimizer leaves it untouched: the classifiers of source domains absent from a basic batch, and all
classifiers in meta steps.
"""
import math
import time

import numpy as np

import compat
from compat import torch
from reid.errors import UserError
from compat.optim import SGD
from compat.schedules import LRSchedule
from reid import modeling
from reid.config import check_supported_values
from reid.engine.checkpointer import Checkpointer, model_state_from_file
from reid.engine.distributed import local_splits
from reid.engine.hooks import default_hooks
from reid.engine.objectives import loss_settings
from reid.engine.steps import StepFunctions, chunk_domains
from reid.engine.train_loop import TrainLoop
from reid.modeling.layers import MetaBatchNorm, MetaInstanceNorm
from reid.modeling.utils import named_state


class TrainingDiverged(UserError):
    """The loss became NaN or Inf."""


def param_groups(named_params, solver, norm_names):
    """fast-reid's per-parameter lr / weight decay rules, merged into groups of equal settings.
    Returns (groups, ordered names) where names follow the optimizer's flattened parameter order."""
    buckets = {}
    for name, p in named_params:
        factor, wd = 1.0, solver.WEIGHT_DECAY
        if name.startswith("heads."):
            factor *= solver.HEADS_LR_FACTOR
        if name.endswith(".bias"):
            factor *= solver.BIAS_LR_FACTOR
            wd = solver.WEIGHT_DECAY_BIAS
        if name in norm_names:
            wd = solver.WEIGHT_DECAY_NORM
        buckets.setdefault((factor, wd), []).append((name, p))
    groups, names = [], []
    for (factor, wd), members in buckets.items():
        groups.append({"params": [p for _, p in members], "lr_factor": factor, "weight_decay": wd,
                       "lr": solver.BASE_LR * factor})
        names.extend(n for n, _ in members)
    return groups, names


def with_class_counts(cfg, num_classes):
    """A frozen copy of `cfg` whose MODEL.HEADS.NUM_CLASSES are the training data's per-domain class counts."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.HEADS.NUM_CLASSES = list(num_classes)
    cfg.freeze()
    return cfg


def _finite(value):
    return math.isfinite(float(value))


def _scalar(t):
    return float(t)


def _host(t):
    """A tensor (or an array) as a numpy array on the host."""
    return t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)


class Trainer(TrainLoop):
    """Builds everything from a frozen config (which it leaves as it is: `self.cfg` is a copy that also
    carries the class counts of the training data) and runs the ACL iterations in a `TrainLoop`.

    Each part comes from a `build_*` method that a subclass may override, as fast-reid's DefaultTrainer
    does: `build_data`, `build_model`, `build_optimizers`, `build_schedule`, `build_step_functions` and
    `build_hooks` (the last is called by the caller, `reid.engine.launch.train`, once the evaluation is known).
    They are called in that order, and the order is part of the behaviour: the model draws its initial weights
    from numpy's global RNG after the data is built.

    Steps put what they measured into `self.storage` (loss terms `loss_*`; for meta steps `meta/loss_mtrain`,
    `meta/loss_mtest`, `meta/test_domain` and the terms of each as `meta/mtrain/loss_*`, `meta/mtest/loss_*`; `lr`,
    `time`), tagged with the iteration; `step_log` keeps (iteration, kind, total loss) of every step."""

    def __init__(self, cfg, resume=False, data=None, quiet=False):
        super().__init__()
        check_supported_values(cfg)
        self.quiet = quiet
        self.output_dir = cfg.OUTPUT_DIR
        self.checkpointer = Checkpointer(self.output_dir)
        state_path, state = self.checkpointer.load_last() if resume else (None, None)

        compat.set_device(cfg.MODEL.DEVICE)
        torch.manual_seed(int(cfg.SEED))
        np.random.seed(cfg.SEED)
        self.dist = compat.distributed.group()  # data-parallel ranks (world size 1 without a launcher)

        self.data = data if data is not None else self.build_data(cfg, state)
        self.cfg = cfg = with_class_counts(cfg, self.data.num_classes)
        self.meta = bool(cfg.META.ENABLED)
        if self.meta and len(self.data.num_classes) < 2:
            raise UserError("meta steps need at least 2 source domains (DATASETS.NAMES has %d); add sources or set "
                            "META.ENABLED False" % len(self.data.num_classes))

        self.model = self.build_model(cfg)
        if cfg.MODEL.WEIGHTS and state is None:
            compat.checkpoint.load_state_dict(self.model, model_state_from_file(cfg.MODEL.WEIGHTS))
        self.model.train()
        # data parallel: every rank starts from rank 0's weights and running statistics, and emulates its
        # share of the MODEL.NUM_SPLITS devices (docs/method.md#dataparallel)
        self.dist.broadcast_(list(named_state(self.model).values()))
        self.num_splits = local_splits(int(cfg.MODEL.NUM_SPLITS), self.dist.world_size)
        self.compiled = compat.jit.enabled(cfg.MODEL.JIT)
        # MODEL.CHUNK_FORWARDS: one forward per chunk (the step functions split the batch; the batch norms see
        # one chunk), else one forward with per-chunk batch-norm statistics (always so in compiled steps)
        self.chunk_forwards = bool(cfg.MODEL.CHUNK_FORWARDS) and not self.compiled
        self.model.num_splits = 1 if self.chunk_forwards else self.num_splits

        self.optimizer, self.optimizer_meta, self.param_names = self.build_optimizers(cfg)
        self.params = self.optimizer.params
        self.step_ratio = [cfg.MODEL.BACKBONE.ADAPTOR_STEP_RATIO if "adaptor" in n else 1.0 for n in self.param_names]
        self.classifier_index = self._classifier_index()

        self.iters_per_epoch = self.data.iters_per_epoch(cfg)
        self.max_iter = int(cfg.SOLVER.MAX_EPOCH) * self.iters_per_epoch
        self.schedule = self.build_schedule(cfg)
        self.meta_rng = np.random.RandomState(int(cfg.SEED) + 1)   # the meta-test draws, apart from numpy's global RNG
        self.offsets = list(self.data.offsets)
        self.steps = self.build_step_functions(cfg)
        self.start_iter = 0
        self.iter = 0
        self.step_log = []       # (iteration, kind, total loss) of every step: the loss trajectory
        self._hook_states = {}   # hook class name -> state from the resumed checkpoint
        if state is not None:
            self._restore(state, state_path)

    # ------------------------------------------------------------------ building
    def build_data(self, cfg, state=None):
        """The training streams (`reid.data.build.TrainData`): the combined stream of the basic steps and one
        stream per source domain for the meta steps, this rank's shard, continued from a resumed `state`."""
        from reid.data.build import TrainData
        return TrainData(cfg, consumed=state.get("data") if state else None,
                         shard=(self.dist.rank, self.dist.world_size))

    def build_model(self, cfg):
        """The network of `cfg` on the configured device (its initial weights drawn from numpy's global RNG);
        `__init__` then loads MODEL.WEIGHTS unless resuming."""
        return compat.to_device(modeling.build_model(cfg))

    def build_optimizers(self, cfg):
        """(basic-step SGD, meta-step SGD with momentum META_MOMENTUM, parameter names in the optimizers' flat
        order): fast-reid's per-parameter lr and weight-decay groups over the trainable parameters, the same
        groups for both."""
        norm_names = {"%s.%s" % (mod_name, p_name) if mod_name else p_name
                      for mod_name, mod in self.model.named_modules()
                      if isinstance(mod, (MetaBatchNorm, MetaInstanceNorm))
                      for p_name, _ in mod.named_parameters(recurse=False)}
        trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        groups, names = param_groups(trainable, cfg.SOLVER, norm_names)
        optimizer = SGD(groups, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM, nesterov=cfg.SOLVER.NESTEROV)
        meta_groups, _ = param_groups(trainable, cfg.SOLVER, norm_names)   # its own group dicts, the same values
        optimizer_meta = SGD(meta_groups, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.META_MOMENTUM)
        return optimizer, optimizer_meta, names

    def build_schedule(self, cfg):
        """The learning rate as a function of the iteration, shared by both optimizers (warmup, then cosine or
        multistep per epoch)."""
        return LRSchedule.from_config(cfg.SOLVER, cfg.SOLVER.BASE_LR, self.iters_per_epoch)

    def build_step_functions(self, cfg):
        """The differentiated step functions (reid/engine/steps.py), built once from the config: compiled with
        MODEL.JIT on MindSpore. The basic step shares its graph with the meta-train step only where there are
        meta steps: without them the meta objective would be computed in every basic step for nothing."""
        shared_graph = bool(cfg.MODEL.JIT_SHARED_GRAPH) and self.meta
        if self.compiled:
            compat.jit.set_step_graph_layout(shared_graph)
        return StepFunctions(self.model, self.param_names, self.params, loss_settings(cfg), self.offsets,
                             self.num_splits, self.compiled, self.chunk_forwards, shared_graph)

    def build_hooks(self, evaluate_fn=None, progress=True):
        """The standard hooks (reid/engine/hooks.py `default_hooks`): progress bar, weight average, evaluator
        (with `evaluate_fn`), metrics log, checkpointer, curve plot; register them with `register_hooks`."""
        return default_hooks(self, evaluate_fn, progress=progress)

    # ------------------------------------------------------------------ parameters
    def _classifier_index(self):
        """{domain: [positions in self.params of that domain's classifier parameters]}."""
        out = {}
        for i, name in enumerate(self.param_names):
            if name.startswith("heads.classifiers."):
                out.setdefault(int(name.split(".")[2]), []).append(i)
        return out

    def _drop_unused(self, grads, absent_domains):
        """torch's None gradient for classifiers the loss did not reach (single-device semantics only)."""
        if self.num_splits > 1 or self.dist.world_size > 1:
            return list(grads)
        grads = list(grads)
        for d in absent_domains:
            for i in self.classifier_index.get(d, []):
                grads[i] = None
        return grads

    # ------------------------------------------------------------------ steps
    def _run_step_function(self, kind, batch, domains, fast=None):
        """(loss, terms, grads) of one step kind on `batch` (`fast`: the fast-weight steps of a meta-test step).
        `domains`: the batch's domain ids in numpy, read once per batch, so that the step functions read no
        labels on the host."""
        return self.steps(kind, batch, chunk_domains(domains, self.num_splits), fast)

    def _check(self, loss, kind):
        if not _finite(loss):
            last = self.checkpointer.last()
            raise TrainingDiverged(
                "loss became %s in the %s step of iteration %d; stopped without saving (last good checkpoint: %s); "
                "lower SOLVER.BASE_LR or enable SOLVER.CLIP_GRADIENTS" % (float(loss), kind, self.iter, last or "none"))

    def _clip(self, grads):
        clip = self.cfg.SOLVER.CLIP_GRADIENTS
        if not clip.ENABLED:
            return grads
        return list(compat.clip_grad_norm(grads, clip.MAX_NORM)[0])

    def basic_step(self):
        batch = next(self.data.combined)
        domains = _host(batch["domains"])
        loss, terms, grads = self._run_step_function("basic", batch, domains)
        loss, terms, grads = self.dist.average_step(loss, terms, grads)  # data parallel: mean over ranks
        self._check(loss, "basic")
        absent = [d for d in range(len(self.offsets)) if d not in set(domains.tolist())]
        self.optimizer.step(self._clip(self._drop_unused(grads, absent)))
        self.step_log.append((self.iter, "basic", _scalar(loss)))
        self.storage.put_scalars({k: _scalar(v) for k, v in terms.items()})
        self.storage.put_scalar("loss_basic", _scalar(loss))

    def fast_weight_steps(self, grads):
        """α·r·g per parameter, α the meta optimizer's lr of this iteration. First-order without a `.detach()`:
        the gradients come without a graph (compat/autograd.py), and on MindSpore a detach before the product
        costs several times the product itself (docs/performance.md#step-profile)."""
        alpha = self.schedule.lr_at(self.iter)
        return [g * (alpha * r) for g, r in zip(grads, self.step_ratio)]

    def meta_step(self):
        num_domains = len(self.offsets)
        test_domain = int(self.meta_rng.choice(num_domains))
        train_domains = [d for d in range(num_domains) if d != test_domain]
        parts = [next(self.data.domains[d]) for d in train_domains]
        mtr = {k: torch.cat([p[k] for p in parts], 0) for k in ("images", "targets", "domains")}
        mte = next(self.data.domains[test_domain])
        mtr, mte = self.dist.chunk(mtr), self.dist.chunk(mte)  # data parallel: this rank's chunks
        # each per-domain stream holds its own domain only: the domain ids follow from the batch sizes
        mtr_domains = np.concatenate([np.full(int(p["domains"].shape[0]), d) for p, d in zip(parts, train_domains)])
        mte_domains = np.full(int(mte["domains"].shape[0]), test_domain)
        mtr_domains, mte_domains = self.dist.chunk_array(mtr_domains), self.dist.chunk_array(mte_domains)

        loss_mtr, terms_mtr, g_mtr = self._run_step_function("mtrain", mtr, mtr_domains)
        loss_mtr, terms_mtr, g_mtr = self.dist.average_step(loss_mtr, terms_mtr, g_mtr)
        self._check(loss_mtr, "meta-train")
        steps = self.fast_weight_steps(g_mtr)
        loss_mte, terms_mte, g_mte = self._run_step_function("mtest", mte, mte_domains, fast=steps)
        loss_mte, terms_mte, g_mte = self.dist.average_step(loss_mte, terms_mte, g_mte)
        self._check(loss_mte, "meta-test")
        grads = [a + b for a, b in zip(g_mtr, g_mte)]
        # every domain counts as absent: no classifier is reached by the meta losses (single-device semantics)
        self.optimizer_meta.step(self._clip(self._drop_unused(grads, range(num_domains))))
        self.step_log.append((self.iter, "meta", _scalar(loss_mtr) + _scalar(loss_mte)))
        # each step's terms under its own prefix: both have cluster terms (loss_intra, loss_inter) of the same name
        self.storage.put_scalars({"meta/mtrain/" + k: _scalar(v) for k, v in terms_mtr.items()})
        self.storage.put_scalars({"meta/mtest/" + k: _scalar(v) for k, v in terms_mte.items()})
        self.storage.put_scalars({"meta/loss_mtrain": _scalar(loss_mtr), "meta/loss_mtest": _scalar(loss_mte),
                                  "meta/test_domain": test_domain})

    def iteration_plan(self, iteration):
        """The steps iteration `iteration` runs: INITIAL_BASIC_STEPS basic steps at 0, else one, then a meta
        step every META.PERIOD iterations."""
        plan = ["basic"] * (int(self.cfg.META.INITIAL_BASIC_STEPS) if iteration == 0 else 1)
        if self.meta and iteration % int(self.cfg.META.PERIOD) == 0:
            plan.append("meta")
        return plan

    def set_lr(self, iteration):
        lr = self.schedule.lr_at(iteration)
        self.optimizer.set_lr(lr)
        self.optimizer_meta.set_lr(lr)
        self.storage.put_scalar("lr", lr)
        return lr

    def run_iteration(self):
        self.set_lr(self.iter)
        for kind in self.iteration_plan(self.iter):
            self.basic_step() if kind == "basic" else self.meta_step()

    # ------------------------------------------------------------------ loop
    def run_step(self):
        t0 = time.perf_counter()
        self.run_iteration()
        self.storage.put_scalar("time", time.perf_counter() - t0)

    def train(self, max_iter=None):
        """Run iterations start_iter .. max_iter-1 (default: to the end of the schedule) with the registered
        hooks; returns self."""
        end = self.max_iter if max_iter is None else min(int(max_iter), self.max_iter)
        super().train(self.start_iter, end)
        return self

    def register_hooks(self, hooks):
        """Register hooks; a hook with `load_state_dict` gets the state it had in the resumed checkpoint."""
        super().register_hooks(hooks)
        for hook in self.hooks:
            saved = self._hook_states.pop(type(hook).__name__, None)
            if saved is not None and hasattr(hook, "load_state_dict"):
                hook.load_state_dict(saved)

    @property
    def epoch(self):
        return self.iter // self.iters_per_epoch

    # ------------------------------------------------------------------ state
    def state_dict(self):
        rng = self.meta_rng.get_state()
        return {
            "model": compat.checkpoint.state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_meta": self.optimizer_meta.state_dict(),
            "iteration": int(self.iter),
            "data": self.data.consumed(),
            "meta_rng": {"keys": np.asarray(rng[1], np.int64), "pos": int(rng[2]), "has_gauss": int(rng[3]),
                         "cached_gaussian": float(rng[4])},
            "backend": compat.BACKEND,
            "config": self.cfg.dump(),
            # what hooks must carry over a resume (the evaluator's last and best evaluations)
            "hooks": {type(h).__name__: h.state_dict() for h in self.hooks if hasattr(h, "state_dict")},
        }

    def _restore(self, state, path):
        compat.checkpoint.load_state_dict(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer_meta.load_state_dict(state["optimizer_meta"])
        r = state["meta_rng"]
        self.meta_rng.set_state(("MT19937", np.asarray(r["keys"], np.uint32), int(r["pos"]), int(r["has_gauss"]),
                                 float(r["cached_gaussian"])))
        self._hook_states = dict(state.get("hooks") or {})
        self.start_iter = int(state["iteration"]) + 1
        self.iter = self.start_iter
        if not self.quiet:
            print("resumed from %s (iteration %d, saved by the %s backend)" % (
                path, self.start_iter, state.get("backend", "?")))

    def save_checkpoint(self, name, point=True):
        """Save the training state as OUTPUT_DIR/name; `point`: make it the one --resume continues from."""
        return self.checkpointer.save(name, self.state_dict(), point=point)
