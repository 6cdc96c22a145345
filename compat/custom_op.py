"""Ops with a hand-written gradient that work on both backends.

    op = custom_op(forward, backward)
    y = op(x1, x2, ...)

`forward(*inputs) -> tensor` (inputs are tensors; pass constants through a closure) and
`backward(inputs, output, grad_output) -> tuple` with one gradient per input (None = zero gradient).
torch runs it as an `autograd.Function`; MindSpore as a Cell whose `bprop(*inputs, out, dout)` replaces
autodiff through `forward` (the MindTorch manual-adaptation guide, "custom backward"). MindSpore cannot keep
values from the forward pass (no ctx), so `backward` gets the inputs and the output instead.
The op is a plain callable, not a module, so holding it on a model adds no submodule on either backend.
"""
import compat as _c
from compat.errors import UserError
from compat.tensor import ms_tensor


class CustomOp:
    def __init__(self, forward, backward, name=None):
        if not callable(forward) or not callable(backward):
            raise UserError("custom_op needs two callables (forward, backward), got %s and %s"
                            % (type(forward).__name__, type(backward).__name__))
        self.name = name or getattr(forward, "__name__", "custom_op")
        self._forward, self._backward = forward, backward
        self._impl = _ms_cell(forward, backward) if _c.IS_MINDSPORE else _torch_function(forward, backward)

    def __call__(self, *inputs):
        if not inputs:
            raise UserError("custom op %s called without inputs" % self.name)
        for i, x in enumerate(inputs):
            if not _c.is_tensor(x):
                raise UserError("custom op %s: input %d is a %s; pass tensors only and bind constants in the "
                                "forward/backward closures" % (self.name, i, type(x).__name__))
        return self._impl(*inputs)

    def __repr__(self):
        return "CustomOp(%s)" % self.name


def custom_op(forward, backward, name=None):
    return CustomOp(forward, backward, name)


def _check_grads(grads, n):
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    if len(grads) != n:
        raise UserError("custom op backward returned %d gradients for %d inputs; return one per input (None for "
                        "none)" % (len(grads), n))
    return tuple(grads)


def _torch_function(forward, backward):
    torch = _c.torch

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            out = forward(*inputs)
            if any(out is x for x in inputs):
                out = out.view_as(out)  # an input returned as-is must become a new autograd node
            ctx.save_for_backward(*inputs, out)
            return out

        @staticmethod
        def backward(ctx, grad_output):
            saved = ctx.saved_tensors
            return _check_grads(backward(tuple(saved[:-1]), saved[-1], grad_output), len(saved) - 1)

    return _Function.apply


def _ms_cell(forward, backward):
    """A callable that builds (once per input count) a Cell with a fixed-arity bprop and calls it."""
    cells = {}

    def call(*inputs):
        n = len(inputs)
        if n not in cells:
            cells[n] = _ms_cell_for_arity(forward, backward, n)
        return cells[n](*inputs)

    return call


def _ms_cell_for_arity(forward, backward, n):
    torch, nn = _c.torch, _c.nn
    cast = torch.cast_to_adapter_tensor

    def run_backward(args):
        # MindSpore hands over plain mindspore Tensors; the user's backward speaks the torch API.
        inputs, out, dout = tuple(cast(a) for a in args[:-2]), cast(args[-2]), cast(args[-1])
        grads = _check_grads(backward(inputs, out, dout), len(inputs))
        return tuple(ms_tensor(torch.zeros_like(x) if g is None else g) for x, g in zip(inputs, grads))

    # MindSpore matches bprop to the call by the positional-argument count of `bprop` itself
    # (inputs + out + dout), so `*args` is rejected; write the signature out for this arity.
    names = ", ".join("x%d" % i for i in range(n))
    namespace = {"run_backward": run_backward, "__name__": __name__}
    exec("def bprop(self, %s, out, dout):\n    return run_backward((%s, out, dout))\n" % (names, names), namespace)

    # A layer whose Module is a MindSpore Cell has its `bprop` run by MindSpore; mindnlp's mindtorch has a
    # Module of its own, whose `bprop` MindSpore never sees (the gradient would be autodiff's through
    # `forward`): there the op is a plain Cell.
    import mindspore
    base = nn.Module if issubclass(nn.Module, mindspore.nn.Cell) else mindspore.nn.Cell
    cell_type = type("CustomOpCell%d" % n, (base,), {
        "forward" if base is nn.Module else "construct": lambda self, *inputs: forward(*inputs),
        "bprop": namespace["bprop"],
    })
    return cell_type()
