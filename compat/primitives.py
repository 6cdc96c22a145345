"""MindSpore primitives in torch's signatures, for code MindSpore parses while it builds a graph: conv2d,
linear, relu and softmax as one primitive each (built once per configuration in Python, outside the graph:
one constant node per call site). Layer-neutral: they take and return MindSpore tensors and serve the
layers' graph forms (compat/layers/ms27/graph.py) and compat's own compiled code.
"""
import compat as _c

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


def graph_conv2d(input, weight, bias, stride, padding, dilation, groups):
    """conv2d in a graph: the Conv2D primitive of this configuration (int / pair arguments), then the bias."""
    shape = weight.shape
    y = _conv_prim_c(shape[0], (shape[2], shape[3]), stride, padding, dilation, groups)(input, weight)
    if bias is not None:
        y = _BIAS_ADD(y, bias)
    return y


def graph_linear(input, weight, bias):
    """linear of a 2-D input in a graph: input @ weight.T (MatMul with the weight transposed), then the bias."""
    y = _MATMUL_NT(input, weight)
    if bias is not None:
        y = _BIAS_ADD(y, bias)
    return y


def graph_relu(input):
    return RELU(input)


def _softmax_prim(dim):
    key = ("softmax", dim)
    if key not in _PRIMS:
        _PRIMS[key] = _P.Softmax(dim)
    return _PRIMS[key]


def graph_softmax(input, dim):
    return _softmax_prim_c(dim)(input)


if _c.IS_MINDSPORE:
    from mindspore import ops as _ops
    from mindspore.ops import operations as _P
    RELU = _P.ReLU()
    _BIAS_ADD = _P.BiasAdd()
    _MATMUL_NT = _P.MatMul(False, True)
    # evaluated in Python while the graph is built: each call site becomes one constant node
    _conv_prim_c = _ops.constexpr(_conv_prim, check=False)
    _softmax_prim_c = _ops.constexpr(_softmax_prim, check=False)
