"""Gradients without `loss.backward()`.

`value_and_grad(fn, params)(*args)` runs `fn(*args)` once, which returns a scalar loss or `(loss, aux)`, and
returns `(loss, aux, grads)`: the detached loss, the detached aux structure and one gradient per parameter
(in `params` order), itself without a graph (torch: `autograd.grad` without `create_graph`), so callers need
not detach it (compat/jit.py's compiled counterpart returns graph outputs, plain values too). MindSpore
differentiates with `mindspore.value_and_grad`; torch with autograd.

Parameters that the loss does not reach get a zero gradient on both backends (MindSpore cannot tell "unused"
from "zero"); callers that need torch's "None = skip" semantics track usage themselves.
Side effects inside `fn` (running-statistics updates) happen exactly once per call on both backends.

Speed on MindSpore PyNative: the grad executor caches the backward graph of a differentiated function
under the function's name/qualname. When one name is seen with a different op sequence, it switches the whole
process to its slower "dynamic shape" path for good (every later backward, of any function). So the wrapper
below carries `fn`'s name, and callers give functions that build different graphs different names (e.g. one
per training-step kind); a closure created afresh each step under the same name is fine.
The same switch happens when the op sequence of one function changes between its first and second call
because some code runs MindSpore ops once, lazily, on first use, e.g. `compat.norm.probe_kernel` (a one-off
batch norm on two values) inside the first recorded forward: every later op-by-op training step would then
rebuild and recompile its backward graph. Such probes therefore run
before the first recorded call (`_eager_probes`; tests/test_compat_norm.py checks the first calls record the
same ops).
"""
import functools

import compat as _c
from compat.tensor import detach_tree


def _split(out):
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], out[1]
    return out, None


def value_and_grad(fn, params):
    params = list(params)
    if _c.IS_MINDSPORE:
        return _ms_value_and_grad(fn, params)
    return _torch_value_and_grad(fn, params)


def _torch_value_and_grad(fn, params):
    torch = _c.torch

    def run(*args, **kwargs):
        with torch.enable_grad():
            loss, aux = _split(fn(*args, **kwargs))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))
        return loss.detach(), detach_tree(aux), grads

    return run


def _ms_value_and_grad(fn, params):
    import mindspore
    torch = _c.torch
    weights = list(params)  # a ParameterTuple would demand unique names; free-standing Parameters share one
    box = {}

    # aux leaves through a side channel: mindspore's has_aux rejects nested outputs, and PyNative runs the
    # forward exactly once per call, so the closure sees the values of this call.
    @functools.wraps(fn)  # MindSpore keys its grad-graph cache by this name (see the module docstring)
    def loss_only(*args, **kwargs):
        loss, aux = _split(fn(*args, **kwargs))
        box["aux"] = aux
        return loss

    grad_fn = mindspore.value_and_grad(loss_only, None, weights)
    _eager_probes()
    index = {id(p): i for i, p in enumerate(weights)}

    def run(*args, **kwargs):
        box.clear()
        try:
            loss, grads = differentiate(args, kwargs)
        except BaseException:
            _stop_recording()
            raise
        grads = tuple(torch.cast_to_adapter_tensor(g) for g in grads)
        return torch.cast_to_adapter_tensor(loss), detach_tree(box.get("aux")), grads

    def differentiate(args, kwargs):
        as_args = [(pos, index[id(a)]) for pos, a in enumerate(args) if id(a) in index]
        if as_args and _param_argument_is_an_input():
            # MindSpore 2.7 differentiates a Parameter passed as an argument as that input (all its uses, also
            # captured ones) and gives the weight 0: take the input's gradient for it
            positions = tuple(pos for pos, _ in as_args)
            loss, (input_grads, grads) = mindspore.value_and_grad(loss_only, positions, weights)(*args, **kwargs)
            grads = list(grads)
            if not isinstance(input_grads, tuple):  # one position: a bare tensor
                input_grads = (input_grads,)
            for (_, i), g in zip(as_args, input_grads):
                grads[i] = g
        else:
            loss, grads = grad_fn(*args, **kwargs)
        return loss, grads

    return run


def _stop_recording():
    """Reset MindSpore's op-by-op gradient recorder after an exception inside a recorded forward.

    MindSpore switches recording on when a differentiated call starts and off when it ends normally; an
    exception in between (an input check's UserError, a KeyboardInterrupt) leaves it on for the rest of the
    process. Then every later compiled call is taken for part of a gradient being recorded, and a compiled
    training step can fail ("Jit does not support dynamic shape input yet"; tests/test_compiled.py checks the
    reset). MindSpore's own reset after a failed compile is the same call."""
    from mindspore.common.api import _pynative_executor
    _pynative_executor.clear_res()


_PROBED = {}


def _eager_probes():
    """Run the framework's once-per-process probes now, outside any recorded forward (module docstring)."""
    from compat.norm import probe_kernel
    probe_kernel()


def _param_argument_is_an_input():
    """True where MindSpore credits a Parameter passed as an argument of the differentiated function to that argument
    and not to the weight (MindSpore 2.7 does; earlier releases credited the weight). Asked once, on one scalar."""
    if "arg" not in _PROBED:
        import mindspore
        import numpy as np
        p = mindspore.Parameter(mindspore.Tensor(np.ones(1, np.float32)), name="compat_grad_probe")
        _, (g,) = mindspore.value_and_grad(lambda x: (x * x).sum(), None, [p])(p)
        _PROBED["arg"] = not bool(g.asnumpy()[0])
    return _PROBED["arg"]
