"""The differentiated functions of the ACL training steps, built once from the config (docs/method.md#training).

`StepFunctions(...)(kind, batch, present, fast=None) -> (loss, terms, grads)` for the step kinds 'basic'
(batch-statistics BN that updates the running statistics), 'mtrain' and 'mtest' ('hold' BN: batch statistics,
running statistics untouched). `present` is, per DataParallel chunk, the tuple of domain ids the chunk holds,
computed by the caller in numpy (`chunk_domains`), so the differentiated function reads no labels on the host.
`fast` (mtest only) is the detached fast-weight step α·r·g: the loss is taken at θ' = θ - fast.

Functions are built on first use and cached (`self.cache`, by `StepKey`): op by op one per (step kind,
per-chunk domains), compiled one per step kind (the basic step's losses weigh every source domain by whether
the chunk holds it; meta batches always hold the same number of domains per chunk: `StepFunctions.key`), or
with `shared_graph` one for the basic and meta-train steps together and one for the meta-test step.
What a function captures is fixed then: the model, the loss settings (plain Python values from
`loss_settings`, never the yacs config), the label offsets, the chunk count and, op by op, `present`. Two
ways to run them:

- op by op (`compiled=False`, and always on torch): `compat.value_and_grad`; fast weights enter as
  arguments of the differentiated function (`fast_weights`), each function has its own name (MindSpore's
  PyNative grad cache, compat/autograd.py). With `chunk_forwards` (MODEL.CHUNK_FORWARDS) and num_splits > 1
  the model runs once per chunk, as DataParallel's replicas (docs/method.md#dataparallel).
- compiled (`compiled=True`, MODEL.JIT on MindSpore): `compat.jit.value_and_grad`, one static graph per
  cache entry (compile time logged once). Python state is baked into a graph when it is built, so the BN
  mode is set around the call, outside the graph. With `shared_graph` (MODEL.JIT_SHARED_GRAPH) the basic
  and meta-train steps run one graph: it computes both objectives on the batch it is given, each weighted by
  a tensor argument (1 for the step's own, 0 for the other: the total, its terms and its gradients are the
  step's own, x * 1 + y * 0 = x, up to the order in which the graph adds up gradient contributions), and it
  is built in BN mode 'general', its running-statistics update left out in a meta-train step ('hold':
  `update_state=False`, compat.jit.value_and_grad). A graph holds memory of its own for its lifetime (each convolution's
  buffers, docs/performance.md#ratios), so one graph fewer is that much less memory and one build fewer, for
  computing the other step's loss terms on the features (a few dozen small kernels per step). The meta-test
  graph is the plain forward: because the fast-weight step is detached (first-order ACL),
  ∇_θ L(θ - fast) = ∇_θ' L(θ'), so θ' is written into the parameters before the call and θ restored after it
  (`compat.jit.swap_in` / `restore`), and the same kind of graph serves every meta step.
  (Equal to the op-by-op result: tests/test_training.py.)

Gradients come back for every parameter (zeros where the loss does not reach); the trainer applies
single-device "None" semantics afterwards (`Trainer._drop_unused`), outside any graph.
"""
import contextlib
import enum
from typing import NamedTuple

import numpy as np

import compat
from compat import torch
from reid.errors import UserError
from reid.engine.objectives import step_objective
from reid.modeling import bn_mode, fast_weights
from reid.modeling.heads import train_dict

BN_MODES = {"basic": "general", "mtrain": "hold", "mtest": "hold"}
SHARED_KINDS = ("basic", "mtrain")  # compiled with shared_graph: one graph, SHARED_GRAPH, built in mode 'general'
SHARED_GRAPH = "basic+mtrain"


class _Domains(enum.Enum):
    ALL = "all domains"

    def __str__(self):
        return self.value


# `StepKey.domains` of the compiled graphs that take every source domain in every chunk, each weighted inside
# the graph by whether the chunk holds it (the basic step's and the shared one)
ALL_DOMAINS = _Domains.ALL


class StepKey(NamedTuple):
    """A cached step function (`StepFunctions.key`). `graph`: the step kind it computes, or SHARED_GRAPH.
    `domains`: what its structure depends on in the domains the chunks hold: op by op the domain ids per chunk
    (constants of the function), compiled meta steps the number of domains per chunk (the ids are tensor
    arguments, `_id_args`), the compiled basic and shared graphs ALL_DOMAINS."""
    graph: str
    domains: object


def chunk_domains(domains, num_splits):
    """Per contiguous chunk of the batch, the sorted tuple of domain ids it holds (numpy `domains` (N,))."""
    domains = np.asarray(domains).reshape(-1)
    if len(domains) % num_splits:
        raise UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch sizes "
                        "multiples of NUM_SPLITS" % (len(domains), num_splits))
    return tuple(tuple(int(d) for d in np.unique(c)) for c in np.split(domains, num_splits))


def signature(present):
    """'012_01' for ((0, 1, 2), (0, 1)): part of each step function's name."""
    return "_".join("".join(str(d) for d in chunk) for chunk in present)


def _regroup(ids, counts):
    """The flat domain-id arguments back into per-chunk groups (`counts` ids each)."""
    out = ()
    start = 0
    for k in counts:
        out = out + (ids[start:start + k],)
        start = start + k
    return out


def _concatenated(outputs):
    """The train-mode output dicts of consecutive chunks as one dict (dim 0; lists element-wise; None stays)."""
    cat = torch.cat
    merged = {}
    for key, value in outputs[0].items():
        if value is None:
            merged[key] = None
        elif isinstance(value, (list, tuple)):
            merged[key] = [cat([out[key][j] for out in outputs], 0) for j in range(len(value))]
        else:
            merged[key] = cat([out[key] for out in outputs], 0)
    return merged


class StepFunctions:
    """Builds and caches the step functions of one model (see the module docstring)."""

    def __init__(self, model, param_names, params, settings, offsets, num_splits, compiled, chunk_forwards=False,
                 shared_graph=True):
        self.model, self.names, self.params = model, list(param_names), list(params)
        self.settings, self.offsets, self.num_splits = dict(settings), tuple(int(o) for o in offsets), int(num_splits)
        self.compiled = compat.jit.enabled(compiled)  # compiled steps build on MindSpore only
        self.shared_graph = bool(shared_graph) and self.compiled
        # what a graph built in BN mode 'general' updates (the running statistics): compat.jit.value_and_grad's
        # state, left as it was in the shared graph's meta-train calls
        self.buffers = [b for _, b in model.named_buffers()] if self.compiled else []
        # op by op with num_splits > 1: one forward per chunk (the caller then sets model.num_splits 1, so that
        # the batch norms take each chunk's statistics); compiled steps always run one forward
        self.chunk_forwards = bool(chunk_forwards) and not self.compiled
        self.cache = {}
        if self.compiled:
            compat.jit.prepare(model)

    def __call__(self, kind, batch, present, fast=None):
        if (fast is not None) != (kind == "mtest"):
            raise ValueError("fast-weight steps go with the meta-test step only")
        key = self.key(kind, present)
        fn = self._cached(key)
        args = (batch["images"], batch["targets"], batch["domains"]) + self._id_args(key, present)
        if key.graph == SHARED_GRAPH:
            return self._call_shared(fn, kind, args)
        with bn_mode(self.model, BN_MODES[kind]):  # op by op read on every call; compiled, baked when built
            if not self.compiled:
                return fn(*(args + tuple(fast or ())))
            if fast is None:
                return fn(*args)
            saved = compat.jit.swap_in(self.params, fast)
            try:
                return fn(*args)
            finally:
                compat.jit.restore(self.params, saved)

    def _call_shared(self, fn, kind, args):
        """The shared basic / meta-train graph as step `kind`: its objective weighted 1, the other's 0, running
        statistics updated in basic steps only; returns the step's own terms."""
        basic = kind == "basic"
        weights = tuple(torch.tensor(np.array(w, np.float32)) for w in ((1.0, 0.0) if basic else (0.0, 1.0)))
        with bn_mode(self.model, BN_MODES["basic"]):  # meta-train ('hold'): the statistics' update left out
            loss, (terms_basic, terms_mtrain), grads = fn(*(args + weights), update_state=basic)
        return loss, terms_basic if basic else terms_mtrain, grads

    def function(self, kind, present):
        """The cached differentiated function of (kind, present): called with (images, targets, domains), then
        op by op in meta-test the fast-weight steps, compiled in meta steps the domain ids (`_id_args`)."""
        return self._cached(self.key(kind, present))

    def key(self, kind, present):
        """The StepKey of step `kind` on a batch whose chunks hold the domain ids `present`.

        Compiled, one graph per step kind (or one SHARED_GRAPH for the basic and meta-train steps). The basic
        step's losses take every source domain in every chunk, each weighted by whether the chunk holds it
        (reid/losses: an absent domain weighs 0), and so do the meta-train step's in the shared graph, so the
        domains a batch holds are read from its labels inside the graph (keyed by the domains per chunk
        instead, the 4-chunk recipes' basic steps would build a graph, of minutes and gigabytes at full size,
        for each of the many combinations their chunks meet). A meta batch is built domain by domain, so its
        chunks always hold the same number of domains: there the ids travel as tensor arguments (`_id_args`)
        and the key is that number per chunk, one key per configuration (the every-domain form would compute
        the absent domains' terms too, a longer build and step: docs/performance.md#graph-keys). Op by op the
        ids are constants of the function (one name per structure, compat/autograd.py)."""
        present = tuple(tuple(int(d) for d in c) for c in present)
        if not self.compiled:
            return StepKey(kind, present)
        if self.shared_graph and kind in SHARED_KINDS:
            return StepKey(SHARED_GRAPH, ALL_DOMAINS)
        if kind == "basic":
            return StepKey(kind, ALL_DOMAINS)
        return StepKey(kind, tuple(len(c) for c in present))

    def _cached(self, key):
        if key not in self.cache:
            self.cache[key] = self._build(key)
        return self.cache[key]

    def _id_args(self, key, present):
        """The domain ids as 0-d tensor arguments, for the compiled graphs keyed by domains per chunk."""
        if self.compiled and key.domains is not ALL_DOMAINS:
            return tuple(torch.tensor(np.array(d, np.int64)) for c in present for d in c)
        return ()

    def _build(self, key):
        if not self.compiled:
            return self._build_op_by_op(key.graph, key.domains)
        if key.graph == SHARED_GRAPH:
            return self._build_shared_graph()
        return self._build_step_graph(key.graph, key.domains)

    def _every_domain(self):
        """`present` of the graphs keyed ALL_DOMAINS: every source domain in every chunk."""
        return (tuple(range(len(self.offsets))),) * self.num_splits

    # The names given to compat below name the graph structures (MindSpore caches grad graphs by function
    # name, compat/autograd.py): one name per structure, unchanged while the structure is.
    def _build_shared_graph(self):
        """The compiled graph of the basic and meta-train steps together: both objectives on the batch, every
        domain weighted by presence inside, each objective weighted by a tensor argument (`_call_shared`)."""
        model, settings, offsets, num_splits = self.model, self.settings, self.offsets, self.num_splits
        every_domain = self._every_domain()

        def shared_loss(images, targets, domains, weight_basic, weight_mtrain):
            out = train_dict(model(images))
            batch = {"targets": targets, "domains": domains, "present": every_domain}
            total_basic, terms_basic = step_objective("basic", out, batch, settings, offsets, num_splits)
            total_mtrain, terms_mtrain = step_objective("mtrain", out, batch, settings, offsets, num_splits)
            return total_basic * weight_basic + total_mtrain * weight_mtrain, (terms_basic, terms_mtrain)
        return compat.jit.value_and_grad(shared_loss, self.params, "basic_mtrain_loss", state=self.buffers)

    def _build_step_graph(self, kind, counts):
        """The compiled graph of one step kind, in one form whatever the batch holds: the basic step takes every
        domain (weighted by presence inside), a meta step its id arguments regrouped per chunk by `counts` (the
        number of domains per chunk, its key's `domains`)."""
        model, settings, offsets, num_splits = self.model, self.settings, self.offsets, self.num_splits
        if kind == "basic":
            name = "basic_loss"
            every_domain = self._every_domain()

            def present_of(ids):
                return every_domain
        else:
            name = "%s_loss_%s" % (kind, "_".join(str(c) for c in counts))

            def present_of(ids):
                return _regroup(ids, counts)

        def compiled_loss(images, targets, domains, *ids):
            out = train_dict(model(images))  # compiled, the train-mode forward returns a tuple
            return step_objective(kind, out, {"targets": targets, "domains": domains, "present": present_of(ids)},
                                  settings, offsets, num_splits)
        state = self.buffers if BN_MODES[kind] == "general" else ()
        return compat.jit.value_and_grad(compiled_loss, self.params, name, state=state)

    def _build_op_by_op(self, kind, present):
        """The op-by-op function of one step kind on chunks that hold the domain ids `present` (constants of it:
        one function, and name, per (kind, present))."""
        model, settings, offsets, num_splits = self.model, self.settings, self.offsets, self.num_splits
        name = "%s_loss_%s" % (kind, signature(present))
        names, params = self.names, self.params
        chunk_forwards = self.chunk_forwards and num_splits > 1

        def forward_objective(images, targets, domains):
            if not chunk_forwards:  # one forward; the model's batch norms take per-chunk statistics
                out = model(images)
            else:
                # DataParallel's replicas: one forward per contiguous chunk, the running statistics from chunk
                # 0's alone (its replica's buffers are the module's); the objective then cuts the concatenated
                # outputs into the same chunks (exactly: a slice of a concatenation) and averages their losses
                size = int(images.shape[0]) // num_splits
                outs = []
                for i in range(num_splits):
                    with bn_mode(model, "hold") if i else contextlib.nullcontext():
                        outs.append(model(images[i * size:(i + 1) * size]))
                out = _concatenated(outs)
            return step_objective(kind, out, {"targets": targets, "domains": domains, "present": present},
                                  settings, offsets, num_splits)

        def loss_op_by_op(images, targets, domains, *steps):
            if not steps:
                return forward_objective(images, targets, domains)
            # steps = the detached α·r·g, so only `p - step` is recorded for differentiation
            with fast_weights(model, {n: p - s for n, p, s in zip(names, params, steps)}):
                return forward_objective(images, targets, domains)
        # One name per graph structure: MindSpore's PyNative grad cache is keyed by it (compat/autograd.py).
        loss_op_by_op.__name__ = loss_op_by_op.__qualname__ = name
        return compat.value_and_grad(loss_op_by_op, self.params)
