"""MSAdapter's graph forms: thin compiled forms of the layer's hot functional ops (the legacy stack).

MindSpore builds a graph by parsing and type-inferring every Python function the compiled code calls, once
per call site (compat/jit.py). Each MSAdapter op is a Python wrapper (argument casts, dtype and inplace
checks, its primitive built through MindSpore's functional layer), so a network's graph is mostly wrapper
code, and a build's time and the memory it leaves grow with that code (docs/performance.md#build-time).
`functional(F)` returns the layer's `nn.functional` with conv2d, linear, relu and softmax replaced by
functions that, while a graph is built (`compat.jit.in_graph()`), call the MindSpore primitive directly (built
once per configuration in Python, outside the graph: one constant node; compat/primitives.py) and mark the
result as a torch-API tensor; op by op they call the layer's own function unchanged. Only the argument forms the
network uses take the thin path (2-D linear, conv2d with int / pair arguments); anything else goes to the
layer's function in both modes.
"""
import sys
import types

import compat as _c
from compat.graph_mode import in_graph
from compat import primitives as _p

THIN = ("conv2d", "linear", "relu", "softmax")
MODULE_NAME = "compat.layers.msadapter.graph.functional"


def functional(layer_F):
    """A module object with everything of `layer_F` and the thin ops of this module in place of its own."""
    module = types.ModuleType(MODULE_NAME, layer_F.__doc__)
    module.__dict__.update({k: v for k, v in vars(layer_F).items() if not k.startswith("__")})
    # MindSpore's parser resolves a module's names through sys.modules[module.__name__]
    sys.modules[MODULE_NAME] = module
    _LAYER["F"] = layer_F
    for name in THIN:
        setattr(module, name, globals()[name])
    module.__compat_thin__ = THIN
    return module


_LAYER = {}


def _thin_conv_args(stride, padding, dilation):
    """Whether conv2d's arguments are of the forms the thin path takes (ints or pairs of ints)."""
    def ok(v):
        return isinstance(v, int) or (isinstance(v, (tuple, list)) and len(v) == 2
                                      and all(isinstance(i, int) for i in v))
    return ok(stride) and ok(padding) and ok(dilation)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if in_graph() and _thin_conv(stride, padding, dilation):
        return _TO_TORCH(_p.graph_conv2d(input, weight, bias, stride, padding, dilation, groups))
    return _LAYER["F"].conv2d(input, weight, bias, stride, padding, dilation, groups)


def linear(input, weight, bias=None):
    if in_graph() and len(input.shape) == 2:
        return _TO_TORCH(_p.graph_linear(input, weight, bias))
    return _LAYER["F"].linear(input, weight, bias)


def relu(input, inplace=False):
    if in_graph() and not inplace:
        return _TO_TORCH(_p.RELU(input))
    return _LAYER["F"].relu(input, inplace)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if in_graph() and isinstance(dim, int) and dtype is None:
        return _TO_TORCH(_p.graph_softmax(input, dim))
    return _LAYER["F"].softmax(input, dim, _stacklevel, dtype)


if _c.IS_MINDSPORE:
    from mindspore import ops as _ops
    from mindspore.ops.operations import _inner_ops
    # one primitive: the result is a torch-API tensor
    _TO_TORCH = getattr(_inner_ops, "convert_to_adapter_tensor", None)
    # evaluated in Python while the graph is built: each call site becomes one constant node
    _thin_conv = _ops.constexpr(_thin_conv_args, check=False)
