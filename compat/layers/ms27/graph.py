"""The ms27 stack's graph forms (mindnlp's `mindtorch` on MindSpore 2.7): what the torch-API layer's code is
replaced by while MindSpore builds a graph.

MindSpore's `mindspore.jit` builds a graph by parsing the Python source of everything the compiled function
calls (compat/jit.py). Two things of this layer cannot be parsed:

- `Module.__call__` (`_wrapped_call_impl` / `_call_impl`: hooks in a `try` block, "Unsupported statement 'Try'");
- every op: a layer function goes through its dispatcher (`execute` -> `Dispatcher.dispatch`, which picks a
  device from its arguments' Python attributes and a per-device module with set comprehensions, then sets an
  attribute on the result: "Unsupported expression 'SetComp'").

So while a graph is built (`swap(True)`, from `compat.jit`'s build; `swap(False)` right after it) the layer's
`Module.__call__` calls `forward` directly, its containers iterate over their modules as a tuple, and the
layer functions the project's compiled code calls are MindSpore's own ops with torch's signature and
semantics (the `_forms` below). Op by op nothing changes: the layer's own code runs. Tensor *methods* need
no form: the layer's Tensor is `mindspore.Tensor`, whose methods compile to MindSpore's own (the keyword rules
in compat/jit.py hold).

Parameters need nothing either: the layer's `Parameter` carries MindSpore's marker (`__parameter__`) and a
`param_info`, so a graph reads it as a weight, live, as long as it is written in place (`compat.assign_`, which
is `ops.assign`): the layer's in-place methods (`add_`, `mul_`, `copy_`...) give the tensor new storage
instead, and a built graph goes on reading the old one (tests/test_compiled.py checks writes after the
build; repros/ms27_defects.py shows the layer's).

A function missing here fails the build with MindSpore's parse error pointing at the layer's `execute`:
add its form (and a case to tests/test_compiled.py).
"""
import numpy as np

import compat as _c

_SAVED = []   # (owner, name, layer's attribute) while the forms are in place


def _module_call(self, *args, **kwargs):
    return self.forward(*args, **kwargs)


def _graph_getattr(self, name):
    """Module attribute lookup while a graph is built: a ModuleList as the tuple of its modules (MindSpore's
    parser iterates and indexes tuples; the layer's container is an object it cannot iterate: "'class' object
    is not iterable"), and `_graph_children`, the tuple of a module's own submodules."""
    if name == "_graph_children":
        return tuple(m for m in self.__dict__["_modules"].values() if m is not None)
    value = _LAYER_GETATTR[0](self, name)
    if isinstance(value, _c.torch.nn.ModuleList):
        return tuple(m for m in value.__dict__["_modules"].values() if m is not None)
    return value


_LAYER_GETATTR = []


def _sequential_forward(self, input):
    for module in self._graph_children:
        input = module(input)
    return input


def _targets():
    """(owner, name, graph form) for everything swapped in while a graph is built."""
    torch = _c.torch
    nn, F = torch.nn, torch.nn.functional
    _LAYER_GETATTR[:] = [nn.Module.__getattr__]
    targets = [(nn.Module, "__call__", _module_call), (nn.Module, "__getattr__", _graph_getattr),
               (nn.Sequential, "forward", _sequential_forward)]
    forms = globals()
    targets += [(torch, name, forms["torch_" + name]) for name in TORCH]
    targets += [(F, name, forms["F_" + name]) for name in FUNCTIONAL]
    # `torch.compiler.is_compiling()` True while a graph is built: model code skips its host-side checks then,
    # as on torch under torch.compile
    targets.append((torch.compiler, "is_compiling", _compiling_c))
    return targets


def swap(graph):
    """Put the graph forms in place (graph True) or the layer's own attributes back (False)."""
    if graph:
        if _SAVED:
            return
        for owner, name, form in _targets():
            _SAVED.append((owner, name, owner.__dict__.get(name, _ABSENT)))
            setattr(owner, name, form)
        return
    while _SAVED:
        owner, name, original = _SAVED.pop()
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


_ABSENT = object()


# ----------------------------------------------------------------------------------------------- the forms
# torch's signatures, computed by the primitives the layer runs op by op for the same call (so a graph and
# op by op run the same kernels: MindSpore's newer functional ops, e.g. `ops.matmul`, are other kernels that
# round differently); the arguments compiled code passes must be the graph's constants where MindSpore wants
# them (dims, class counts, conv configuration)
TORCH = ("cat", "exp", "log", "log1p", "sigmoid", "sqrt", "isinf", "matmul", "bmm", "arange", "maximum", "max", "min",
         "where", "norm", "ones", "mul")
FUNCTIONAL = ("conv2d", "linear", "relu", "softmax", "log_softmax", "one_hot", "max_pool2d")


def torch_cat(tensors, dim=0):
    return _prim_c("Concat", dim)(tensors)


def torch_exp(input):
    return _EXP(input)


def torch_log(input):
    return _LOG(input)


def torch_log1p(input):
    return _LOG1P(input)


def torch_sigmoid(input):
    return _SIGMOID(input)


def torch_sqrt(input):
    return _SQRT(input)


def torch_isinf(input):
    return _ISINF(input)


def torch_matmul(input, other):
    """The layer's matmul: MatMul of 2-D operands (a batch of same-rank operands: BatchMatMul; a higher-rank
    operand against a 2-D one: flattened to 2-D and back)."""
    if len(input.shape) > 2 and len(input.shape) == len(other.shape):
        return _BATCH_MATMUL(input, other)
    if len(input.shape) > 2:
        out = _MATMUL(input.reshape(-1, input.shape[-1]), other)
        return out.reshape(input.shape[:-1] + (other.shape[-1],))
    if len(other.shape) > 2:
        out = _MATMUL(input, other.reshape(-1, other.shape[-1]))
        return out.reshape(other.shape[:-1] + (out.shape[-1],))
    return _MATMUL(input, other)


def torch_bmm(input, mat2):
    return _BATCH_MATMUL(input, mat2)


def torch_maximum(input, other):
    return _MAXIMUM(input, other)


def torch_arange(end, dtype=None, device=None):
    """int64 0..end-1 as the layer's (which takes it from numpy): a constant of the graph (MindSpore's device is
    global: `device` is not read)."""
    return _arange_c(end)


def torch_max(input, dim=None, keepdim=False):
    """torch.max(x) (the maximum) or torch.max(x, dim) -> (values, indices) from ArgMaxWithValue, the kernel the
    layer runs op by op (so the gradient goes to the same index on ties). (The layer's builds a named tuple.)"""
    if dim is None:
        return _REDUCE_MAX(input)
    out = _prim_c("ArgMaxWithValue", dim, keepdim)(input)
    return out[1], out[0]


def torch_min(input, dim=None, keepdim=False):
    """torch.min(x) or torch.min(x, dim) -> (values, indices), as torch_max."""
    if dim is None:
        return _REDUCE_MIN(input)
    out = _prim_c("ArgMinWithValue", dim, keepdim)(input)
    return out[1], out[0]


def torch_where(condition, input, other):
    """torch.where(condition, x, y) as a select (the layer's torch.where does not parse)."""
    return _ops.select(condition, input, other)


def torch_norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """torch.norm over one dim: compat.functional.vector_norm (the layer's LpNorm kernel, or reductions in an
    exported file)."""
    norm = _functional.vector_norm(input, 2.0 if p == "fro" else p, dim)
    return norm if keepdim else _ops.squeeze(norm, dim)


def torch_ones(*size, dtype=None, device=None):
    """torch.ones(*size) (or of one size tuple), float32 unless `dtype`: a Fill of a constant shape."""
    return _FILL(_mstype.float32 if dtype is None else dtype, _size_c(size), 1.0)


def torch_mul(input, other):
    """torch.mul; a matrix (R, M) times a column (R, 1) (one factor per row, implicitly broadcast) as
    compat.functional.scale_rows: the column tiled (faster than MindSpore's CPU BroadcastTo), the backward
    written out, the same values and gradients as the broadcast product op by op."""
    if _scales_rows_c(input.shape, other.shape):
        return _functional.scale_rows(input, other)
    return _MUL(input, other)


def _arange(end):
    return _ms.Tensor(np.arange(int(end), dtype=np.int64))


def F_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _p.graph_conv2d(input, weight, bias, stride, padding, dilation, groups)


def F_linear(input, weight, bias=None):
    """As the layer's dense runs op by op: the weight transposed, MatMul, the bias added. (MindSpore's Dense in a
    graph is MatMul with transpose_b, which on some CPUs, AVX-512 ones, rounds otherwise than op by op.)"""
    out = torch_matmul(input, _TRANSPOSE(weight, (1, 0)))
    return out if bias is None else _ADD(out, bias)


def F_relu(input, inplace=False):
    return _p.RELU(input)


def F_softmax(input, dim=-1, dtype=None):
    return _p.graph_softmax(input, dim)


def F_log_softmax(input, dim=None, dtype=None):
    return _prim_c("LogSoftmax", dim)(input)


def F_one_hot(tensor, num_classes=-1):
    """int64 (the input's dtype) as torch's; callers cast."""
    return _prim_c("OneHot", -1)(tensor, num_classes, _ops.cast(_ON, tensor.dtype), _ops.cast(_OFF, tensor.dtype))


def F_max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """No padding or indices: floor mode (what the exported network runs), or ceil mode as
    compat.functional.max_pool2d_ceil (the plain kernel on a map padded with -inf)."""
    if ceil_mode:
        return _functional.max_pool2d_ceil(input, kernel_size, stride if stride is not None else kernel_size)
    return _prim_c("MaxPool", kernel_size, stride if stride is not None else kernel_size)(input)


def _compiling():
    return True


def _size(size):
    return tuple(int(n) for n in (size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size))


def _scales_rows(shape, other):
    return len(shape) == 2 and len(other) == 2 and int(other[1]) == 1 and int(shape[1]) != 1 \
        and int(other[0]) == int(shape[0])


def _prim(name, *attrs):
    """The primitive `name` with constructor arguments `attrs` (MaxPool: kernel and stride, valid padding),
    made once per configuration (while a graph is built: one constant node)."""
    key = (name,) + attrs
    if key not in _PRIMS:
        if name == "MaxPool":
            _PRIMS[key] = _P.MaxPool(kernel_size=attrs[0], strides=attrs[1], pad_mode="valid")
        else:
            _PRIMS[key] = getattr(_P, name)(*attrs)
    return _PRIMS[key]


_PRIMS = {}

if _c.IS_MINDSPORE:
    import mindspore as _ms
    from mindspore import ops as _ops
    from mindspore.ops import operations as _P
    from compat import primitives as _p
    _EXP, _LOG, _LOG1P, _SIGMOID, _SQRT, _ISINF = _P.Exp(), _P.Log(), _P.Log1p(), _P.Sigmoid(), _P.Sqrt(), _P.IsInf()
    _MATMUL, _BATCH_MATMUL, _MAXIMUM = _P.MatMul(), _P.BatchMatMul(), _P.Maximum()
    _TRANSPOSE, _ADD = _P.Transpose(), _P.Add()
    _ON, _OFF = _ms.Tensor(1, _ms.int64), _ms.Tensor(0, _ms.int64)
    _prim_c = _ops.constexpr(_prim, check=False)
    _size_c = _ops.constexpr(_size, check=False)
    _scales_rows_c = _ops.constexpr(_scales_rows, check=False)
    _compiling_c = _ops.constexpr(_compiling, check=False)
    _REDUCE_MAX, _REDUCE_MIN, _MUL, _FILL = _P.ReduceMax(), _P.ReduceMin(), _P.Mul(), _P.Fill()
    from mindspore.common import dtype as _mstype
    from compat import functional as _functional
    _arange_c = _ops.constexpr(_arange, check=False)
