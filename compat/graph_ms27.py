"""Compiled execution on mindnlp's `mindtorch` (the ms27 stack, MindSpore 2.7): what the torch-API layer's code
is replaced by while MindSpore builds a graph.

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
build; tools/ms27_defects.py shows the layer's).

A function missing here fails the build with MindSpore's parse error pointing at the layer's `execute`:
add its form (and a case to tests/test_compiled.py).
"""
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
# torch's signatures; the arguments compiled code passes must be the graph's constants where MindSpore wants
# them (dims, class counts, conv configuration)
TORCH = ("cat", "exp", "log", "log1p", "sigmoid", "sqrt", "isinf", "matmul", "bmm", "arange")
FUNCTIONAL = ("conv2d", "linear", "relu", "softmax", "log_softmax", "one_hot", "max_pool2d")


def torch_cat(tensors, dim=0):
    return _ops.concat(tensors, dim)


def torch_exp(input):
    return _ops.exp(input)


def torch_log(input):
    return _ops.log(input)


def torch_log1p(input):
    return _ops.log1p(input)


def torch_sigmoid(input):
    return _ops.sigmoid(input)


def torch_sqrt(input):
    return _ops.sqrt(input)


def torch_isinf(input):
    return _ops.isinf(input)


def torch_matmul(input, other):
    return _ops.matmul(input, other)


def torch_bmm(input, mat2):
    return _ops.bmm(input, mat2)


def torch_arange(end):
    return _ops.arange(end)


def F_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _g.graph_conv2d(input, weight, bias, stride, padding, dilation, groups)


def F_linear(input, weight, bias=None):
    if len(input.shape) == 2:
        return _g.graph_linear(input, weight, bias)
    y = _ops.matmul(input, weight.T)
    if bias is not None:
        y = y + bias
    return y


def F_relu(input, inplace=False):
    return _g._RELU(input)


def F_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _g.graph_softmax(input, dim)


def F_log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _ops.log_softmax(input, dim)


def F_one_hot(tensor, num_classes=-1):
    """int64 as torch's (callers cast)."""
    hot = _ops.one_hot(tensor, num_classes, _ONE, _ZERO)
    return _ops.cast(hot, _mstype.int64)


def F_max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool_c(kernel_size, stride, padding)(input)


def _max_pool(kernel_size, stride, padding):
    """MaxPool of one configuration (floor mode, no indices; padding 0 only: what the exported network runs)."""
    return _P.MaxPool(kernel_size=kernel_size, strides=stride if stride is not None else kernel_size,
                      pad_mode="valid")


if _c.IS_MINDSPORE:
    from mindspore import ops as _ops
    from mindspore.common import dtype as _mstype
    from mindspore.ops import operations as _P
    from compat import graph_ops as _g
    _ONE, _ZERO = 1.0, 0.0
    _max_pool_c = _ops.constexpr(_max_pool, check=False)
