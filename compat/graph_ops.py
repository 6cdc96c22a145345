"""Thin compiled forms of the torch-API layer's hot functional ops (MSAdapter on MindSpore 2.0).

MindSpore builds a graph by parsing and type-inferring every Python function the compiled code calls, once
per call site (compat/jit.py). Each MSAdapter op is a Python wrapper (argument casts, dtype and inplace
checks, its primitive built through MindSpore's functional layer), so a network's graph is mostly wrapper
code, and a build's time and the memory it leaves grow with that code (docs/performance.md#build-time).
`functional(F)` returns the layer's `nn.functional` with conv2d, linear, relu and softmax replaced by
functions that, while a graph is built (`compat.jit.in_graph()`), call the MindSpore primitive directly (built
once per configuration in Python, outside the graph: one constant node) and mark the result as a torch-API
tensor; op by op they call the layer's own function unchanged. Only the argument forms the network uses take
the thin path (2-D linear, conv2d with int / pair arguments); anything else goes to the layer's function in
both modes.
"""
import sys
import types

import compat as _c
from compat.graph_mode import in_graph

THIN = ("conv2d", "linear", "relu", "softmax")
MODULE_NAME = "compat.graph_ops.functional"


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
_PRIMS = {}


def _pair(v):
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(i) for i in v)


def _conv_prim(out_channels, kernel, stride, padding, dilation, groups):
    """The Conv2D primitive for one configuration (a compile-time constant), made once per process."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    key = ("conv2d", int(out_channels), tuple(kernel), stride, padding, dilation, int(groups))
    if key not in _PRIMS:
        ph, pw = padding
        _PRIMS[key] = _P.Conv2D(int(out_channels), tuple(kernel), pad_mode="pad" if ph or pw else "valid",
                                pad=(ph, ph, pw, pw), stride=stride, dilation=dilation, group=int(groups))
    return _PRIMS[key]


def _thin_conv_args(stride, padding, dilation):
    """Whether conv2d's arguments are of the forms the thin path takes (ints or pairs of ints)."""
    def ok(v):
        return isinstance(v, int) or (isinstance(v, (tuple, list)) and len(v) == 2
                                      and all(isinstance(i, int) for i in v))
    return ok(stride) and ok(padding) and ok(dilation)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if in_graph() and _thin_conv(stride, padding, dilation):
        return _TO_TORCH(graph_conv2d(input, weight, bias, stride, padding, dilation, groups))
    return _LAYER["F"].conv2d(input, weight, bias, stride, padding, dilation, groups)


def graph_conv2d(input, weight, bias, stride, padding, dilation, groups):
    """conv2d in a graph: the Conv2D primitive of this configuration (int / pair arguments), then the bias."""
    shape = weight.shape
    y = _conv_prim_c(shape[0], (shape[2], shape[3]), stride, padding, dilation, groups)(input, weight)
    if bias is not None:
        y = _BIAS_ADD(y, bias)
    return y


def linear(input, weight, bias=None):
    if in_graph() and len(input.shape) == 2:
        return _TO_TORCH(graph_linear(input, weight, bias))
    return _LAYER["F"].linear(input, weight, bias)


def graph_linear(input, weight, bias):
    """linear of a 2-D input in a graph: input @ weight.T (MatMul with the weight transposed), then the bias."""
    y = _MATMUL_NT(input, weight)
    if bias is not None:
        y = _BIAS_ADD(y, bias)
    return y


def relu(input, inplace=False):
    if in_graph() and not inplace:
        return _TO_TORCH(_RELU(input))
    return _LAYER["F"].relu(input, inplace)


def _softmax_prim(dim):
    key = ("softmax", dim)
    if key not in _PRIMS:
        _PRIMS[key] = _P.Softmax(dim)
    return _PRIMS[key]


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if in_graph() and isinstance(dim, int) and dtype is None:
        return _TO_TORCH(graph_softmax(input, dim))
    return _LAYER["F"].softmax(input, dim, _stacklevel, dtype)


def graph_softmax(input, dim):
    return _softmax_prim_c(dim)(input)


if _c.IS_MINDSPORE:
    from mindspore import ops as _ops
    from mindspore.ops import operations as _P
    from mindspore.ops.operations import _inner_ops
    # one primitive: the result is a torch-API tensor (MindSpore 2.7 has none: mindnlp's mindtorch takes
    # MindSpore's tensors as they are, and compat/graph_ms27.py calls the graph_* functions alone)
    _TO_TORCH = getattr(_inner_ops, "convert_to_adapter_tensor", None)
    _RELU = _P.ReLU()
    _BIAS_ADD = _P.BiasAdd()
    _MATMUL_NT = _P.MatMul(False, True)
    # evaluated in Python while the graph is built: each call site becomes one constant node
    _conv_prim_c = _ops.constexpr(_conv_prim, check=False)
    _softmax_prim_c = _ops.constexpr(_softmax_prim, check=False)
    _thin_conv = _ops.constexpr(_thin_conv_args, check=False)
