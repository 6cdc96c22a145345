"""Compiled (static-graph) execution on MindSpore; plain eager calls on torch.

    fwd = compat.jit.compiled(fn, name)               # fwd(*tensors) -> fn(*tensors), one graph per input signature
    vg = compat.jit.value_and_grad(fn, params, name)  # vg(*tensors) -> (loss, aux, grads), like compat.value_and_grad
    compat.jit.prepare(model)                         # once per model, before its first compiled call

On MindSpore `compiled` wraps `fn` in `mindspore.jit`, and `value_and_grad` compiles loss, gradients and the
aux outputs into one graph. MindSpore builds the graph by *parsing* the Python source of `fn` and of everything
it calls (modules' forward included), not by tracing it. So code reachable from a compiled function follows
these rules (tests/test_compiled.py compares every module type, tests/test_compiled_steps.py every step kind,
against op-by-op execution):

- no in-place tensor ops (`add_`, `inplace=True`, `out=`): compiled, they give wrong values without an error;
- no device->host reads (`.asnumpy()`, `float(t)`, numpy on tensors): compiled, they read garbage;
- no `raise` of the project's exception classes, no `with`, no function-local `import` (parse errors), even
  in branches that are not taken. Input checks and bookkeeping that need Python go into functions decorated
  with `eager_only`: they run as usual op by op and are skipped inside a compiled function (where tensor
  values do not exist yet);
- containers are passed by value: a callee that writes into a dict it was given leaves the caller's dict
  unchanged (no error; the key is missing later), so callees return what they computed. Lists of tuples of
  tensors fail to compile in some places ("Expect tensor type"): use tuples. No `dict(key=...)`, no dict
  comprehensions, no `.detach()` (`compat.detach`), no `.eq()`;
- Python state (a module's dict attributes, `model.training`, globals) is read once, when the graph is built,
  and is baked into it. Callers therefore build one compiled function per configuration of that state (step
  kind, batch-norm mode, which domains a batch holds) and cache it; `in_graph()` is True while a graph is
  being built, so code can pick a graph-friendly formulation at that time.

Compiled training steps (reid/engine/steps.py, MODEL.JIT) follow this contract: the differentiated function
takes only tensors (images, labels, domain ids as 0-d tensors); everything else it reads (model, loss settings
as plain Python values, label offsets, chunk count, domains per chunk) is fixed when it is built, and it is
cached under that key; the batch-norm mode is set around the call; fast weights are written into the
parameters around the call (`swap_in` / `restore`) rather than passed in, which is exact for first-order
steps (the step is detached); `fn` returns (loss, dict of scalar terms); gradients come back for every
parameter (zeros where unused) and optimizer updates run outside the graph.

Every Parameter and buffer a graph touches must have a unique name: `prepare(model)` names them by their
`named_parameters()` / `named_buffers()` names (MindSpore refuses duplicates). Buffers must be Parameters
there (see `state_buffer`). Tensor *methods* compile to MindSpore's own, whose keywords differ from torch's
(`x.sum(1, keepdim=True)` fails at run time): use positional forms or compat helpers in compiled code.

The CPU kernel pool is sized to the machine's cores when compat is imported (`set_threads`; MindSpore's
default is 30 threads whatever the machine), overridable with REID_NUM_THREADS or MODEL.NUM_THREADS.
"""
import functools
import os
import time

import numpy as np

import compat as _c

_state = {"graph": False, "threads": None}
log = print  # replaced by callers that log elsewhere; the compile-time line is printed once per graph


def in_graph():
    """True while MindSpore builds a graph: a branch on it is resolved then, once, and baked into the graph."""
    return _state["graph"]


def eager_only(fn):
    """Decorator for code that needs Python: argument checks (label ranges, UserError), host-side bookkeeping.

    Op by op the function runs on every call with the real arguments and its result is returned. Inside a
    compiled function it becomes a compile-time constant op whose body is skipped and which returns None
    (tensor arguments have no values while the graph is built): the checks cost nothing there and the parser
    never sees their `raise` / `import` statements. (MindSpore parses every function a compiled function
    may call, even in branches that are never taken, so such code must sit behind this decorator.)
    """
    if not _c.IS_MINDSPORE:
        return fn

    from mindspore import ops

    def run(*args):
        if _state["graph"]:
            return None
        return fn(*args)

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return ops.constexpr(run, check=False, reuse_result=False)


def state_buffer(array):
    """A float32 buffer for module state that compiled code updates (running statistics): a tensor on torch,
    a Parameter without gradient on MindSpore (a compiled graph can only write Parameters). Register it with
    `module.register_buffer`; `prepare` gives it its unique name."""
    tensor = _c.as_tensor(np.asarray(array, np.float32))
    if not _c.IS_MINDSPORE:
        return tensor
    return _c.nn.Parameter(tensor, requires_grad=False)  # the torch-API layer's Parameter: a mindspore one


def prepare(model):
    """Give every parameter and buffer of `model` its full name (MindSpore graphs need unique names) and
    ask the batch-norm kernel what it saves (compat.norm.probe_kernel). Idempotent; a no-op on torch."""
    if not _c.IS_MINDSPORE:
        return model
    import mindspore
    from compat.norm import probe_kernel
    probe_kernel()  # eager, before any graph: compiled batch norm bakes its answer in
    for name, p in model.named_parameters():
        if isinstance(p, mindspore.Parameter) and p.name != name:
            p.name = name
    for name, b in model.named_buffers():
        if isinstance(b, mindspore.Parameter) and b.name != name:
            b.name = name
    return model


def enabled(flag):
    """Whether a MODEL.JIT setting means compiled execution here (MindSpore only; torch runs eagerly)."""
    return bool(flag) and _c.IS_MINDSPORE


def swap_in(params, steps):
    """Write p - step into every parameter (no gradient) and return copies of the old values for `restore`."""
    saved = [_copy(p) for p in params]
    for p, step in zip(params, steps):
        _c.assign_(p, p - step)
    return saved


def restore(params, saved):
    for p, value in zip(params, saved):
        _c.assign_(p, value)


def _copy(t):
    if _c.IS_MINDSPORE:
        return _c.torch.cast_to_adapter_tensor(_ms_ops.deepcopy(t))
    return t.detach().clone()


def default_threads():
    """REID_NUM_THREADS if set, else the CPU cores this process may use."""
    env = os.environ.get("REID_NUM_THREADS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise _c.UserError("REID_NUM_THREADS must be a positive integer, got %r" % env) from None
        if value < 1:
            raise _c.UserError("REID_NUM_THREADS must be a positive integer, got %r" % env)
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def set_threads(num_threads=None):
    """Size MindSpore's CPU kernel pool: `num_threads`, or (0/None) `default_threads()`. Runs at import of
    compat with the default; MODEL.NUM_THREADS > 0 calls it again. Returns the count (None on torch, which
    keeps its own setting)."""
    if not _c.IS_MINDSPORE:
        return None
    n = int(num_threads) if num_threads else default_threads()
    if n < 1:
        raise _c.UserError("MODEL.NUM_THREADS must be >= 0 (0 = one per core), got %r" % (num_threads,))
    if _state["threads"] != n:
        import mindspore
        mindspore.set_context(runtime_num_threads=n)
        _state["threads"] = n
    return n


def _split(out):
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], out[1]
    return out, None


class _Timed:
    """Calls a mindspore.jit function; the first call builds the graph and logs how long that took."""

    def __init__(self, jitted, name):
        self.jitted, self.name, self.compile_seconds = jitted, name, None

    def __call__(self, *args):
        if self.compile_seconds is not None:
            return self.jitted(*args)
        start = time.perf_counter()
        _state["graph"] = True
        try:
            out = self.jitted(*args)
        finally:
            _state["graph"] = False
        self.compile_seconds = time.perf_counter() - start
        if log is not None:
            log("compiled graph %s in %.1f s (first call included)" % (self.name, self.compile_seconds))
        return out


def compiled(fn, name):
    """`fn` (tensors in, tensors / tuples / dicts of tensors out) compiled on MindSpore; `fn` itself on torch.
    Keep the returned object: each one builds its own graph on its first call."""
    if not _c.IS_MINDSPORE:
        return fn
    import mindspore

    @functools.wraps(fn)
    def graph_fn(*args):
        return fn(*args)
    graph_fn.__name__ = graph_fn.__qualname__ = name
    run = _Timed(mindspore.jit(graph_fn), name)

    torch = _c.torch

    def call(*args):
        return _cast_tree(run(*args), torch)
    call.graph = run
    return call


def value_and_grad(fn, params, name):
    """Compiled counterpart of `compat.value_and_grad`: `fn(*args)` returns a scalar loss or (loss, aux dict of
    scalars); the call returns (loss, aux, grads), one gradient per parameter (zero where unused). On torch
    this is `compat.value_and_grad` (eager)."""
    params = list(params)
    if not _c.IS_MINDSPORE:
        return _c.value_and_grad(fn, params)
    import mindspore
    torch = _c.torch

    def loss_and_aux(*args):
        loss, aux = _split(fn(*args))
        if aux is None:  # has_aux needs an aux output: a detached copy of the loss, dropped again below
            return loss, loss
        return loss, aux

    grad_fn = mindspore.value_and_grad(loss_and_aux, None, params, has_aux=True)

    def graph_fn(*args):
        (loss, aux), grads = grad_fn(*args)
        return loss, aux, grads
    graph_fn.__name__ = graph_fn.__qualname__ = name
    run = _Timed(mindspore.jit(graph_fn), name)

    def call(*args):
        loss, aux, grads = run(*args)
        aux = None if _c.is_tensor(aux) else _cast_tree(aux, torch)
        return _cast_tree(loss, torch), aux, tuple(_cast_tree(g, torch) for g in grads)
    call.graph = run
    return call


def _cast_tree(obj, torch):
    if isinstance(obj, dict):
        return {k: _cast_tree(v, torch) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_tree(v, torch) for v in obj)
    if obj is None or isinstance(obj, (int, float, str)):
        return obj
    return torch.cast_to_adapter_tensor(obj)


if _c.IS_MINDSPORE:
    from mindspore import ops as _ms_ops
