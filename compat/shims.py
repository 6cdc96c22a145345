"""Runtime shims: one crash fix for MSAdapter 0.1.0 on MindSpore 2.0.0 (`fix_tensor_metaclass`), and what lets
PyPI `mindtorch` 0.4.0 import on the MindSpore 2.6 pre-release.

mindtorch 0.4.0 was written against MindSpore 2.3/2.4; PyPI serves no stable MindSpore 2.1-2.6, only the
`mindspore-dev` 2.6.0.dev builds, where two things it uses at import time were renamed or removed. Each shim
checks for the gap first, so on a MindSpore that still has the old name (or on MSAdapter's 2.0.0) nothing is
touched. `apply()` must run after `import mindspore` and before `import mindtorch`; `apply_after_import()`
right after it.
"""
import inspect


def _alias_tensor_class():
    """MindSpore 2.6 renamed the C++ tensor class `mindspore._c_expression.Tensor` to `TensorPy`
    (`mindspore.Tensor` is now a Python subclass of it); mindtorch imports it under the old name."""
    from mindspore import _c_expression
    if hasattr(_c_expression, "Tensor") or not hasattr(_c_expression, "TensorPy"):
        return None
    _c_expression.Tensor = _c_expression.TensorPy
    return "mindspore._c_expression.Tensor = TensorPy"


def _pow_sequence_overloads():
    """MindSpore 2.6 dropped the (Tuple|List, Tensor) and (Tensor, Tuple|List) overloads of the `**` operator
    table (`multitype_ops.pow_`); mindtorch looks them up to wrap them and fails at import without them.
    Registered again with the rule the other arithmetic tables (`mod`, `add`, ...) still use: the sequence
    becomes a tensor of the other operand's dtype."""
    from mindspore import dtype as mstype
    from mindspore.ops import functional as ms_F
    from mindspore.ops.composite.multitype_ops import _compile_utils
    from mindspore.ops.composite.multitype_ops.pow_impl import pow_

    wanted = [("Tuple", "Tensor"), ("Tensor", "Tuple"), ("List", "Tensor"), ("Tensor", "List")]
    have = set()
    for sigs, _ in pow_.entries:
        for names in wanted:
            if len(sigs) == 2 and all(mstype._issubclass_(mstype.typing.str_to_type(n), s)
                                      for n, s in zip(names, sigs)):
                have.add(names)
    missing = [names for names in wanted if names not in have]

    def seq_pow_tensor(x, y):
        return ms_F.tensor_pow(_compile_utils.sequence_to_tensor(x, y.dtype), y)

    def tensor_pow_seq(x, y):
        return ms_F.tensor_pow(x, _compile_utils.sequence_to_tensor(y, x.dtype))

    for names in missing:
        pow_.register(*names)(seq_pow_tensor if names[1] == "Tensor" else tensor_pow_seq)
    return "pow_ overloads %s" % ", ".join("(%s)" % ", ".join(n) for n in missing) if missing else None


def apply():
    """Apply the shims this MindSpore needs; return the list of what was done (empty when none)."""
    done = []
    for shim in (_alias_tensor_class, _pow_sequence_overloads):
        what = shim()
        if what:
            done.append(what)
    return done


# Torch-API methods a Parameter must not take from mindtorch's Tensor: identity/hashing (parameters are dict
# keys and set members) and the in-place ones (a Parameter updates its own storage through MindSpore's).
_KEEP_ON_PARAMETER = ("__hash__", "__eq__", "__ne__", "__format__")


def _parameter_tensor_methods(torch):
    """mindtorch 0.4's Parameter is a `mindspore.Parameter`, i.e. a `mindspore.Tensor`, and relied on
    MindSpore <= 2.4 routing `Tensor` operators and methods through operator tables that mindtorch re-registers
    to return its own tensors. MindSpore 2.6 binds `Tensor`'s methods directly (generated C++ bindings), so
    `param - x`, `param.reshape(...)`, `param[0]` ... return plain `mindspore.Tensor`s with MindSpore's method
    set (no `.detach()`, MindSpore's `repeat`, ...). Give mindtorch's Parameter the out-of-place methods of
    mindtorch's own Tensor (they convert `self` and return torch-API tensors)."""
    import mindspore
    from mindtorch.torch.nn.parameter import Parameter

    probe = torch.nn.Parameter(torch.zeros(1))
    if isinstance(probe - probe, torch.Tensor) and type(probe - probe) is not mindspore.Tensor:
        return None
    grafted = []
    for name, member in vars(torch.Tensor).items():
        in_place = name.endswith("_") and not name.endswith("__") or name.startswith("__i")
        if (not inspect.isfunction(member) or in_place or name in _KEEP_ON_PARAMETER
                or (name.startswith("_") and not name.startswith("__"))):
            continue
        owner = next((c for c in Parameter.__mro__ if name in vars(c)), None)
        if owner is not None and owner.__module__.startswith("mindtorch"):
            continue  # mindtorch's Parameter defines it itself
        setattr(Parameter, name, member)
        grafted.append(name)
    return "Parameter takes %d torch-API methods of mindtorch's Tensor" % len(grafted)


def apply_after_import(torch):
    """The shims that patch mindtorch itself (`torch` = `mindtorch.torch`); returns what was done."""
    what = _parameter_tensor_methods(torch)
    return [what] if what else []


def fix_tensor_metaclass(torch):
    """Stop the torch-API layer's tensor constructor from reading past the end of every tensor it creates
    (`torch` = the layer's torch module); returns what was done, or None where nothing needs it.

    MSAdapter 0.1.0's `Tensor` is a plain Python object of 32 bytes (it derives from MindSpore 2.0's pure-Python
    `StubTensor`), but its metaclass derives from pybind11's, whose `__call__` (`pybind11_meta_call`) treats
    the object it just created as a pybind11 instance and reads that struct's flags byte at offset 0x30: 16
    bytes past the object. Inside pymalloc that byte is usually another block; when the object is the last
    block of a pool that ends an arena, and the page after the arena is not mapped, the read is a SIGSEGV.
    So a process dies now and then, at whichever op's output conversion (msadapter's `Tensor(...,
    cast_tensor=True)`) meets that layout: the read hits `Tensor` objects (basic size 32) at object + 0x30, and
    the crashes seen were at that one instruction, on page-aligned addresses (the first byte past a mapping;
    docs/limitations.md).
    `type.__call__` does what pybind11's does before that check (`__new__`, then `__init__`); the check itself
    (that a pybind11 base's `__init__` ran) has nothing to check on such objects."""
    tensor = getattr(torch, "Tensor", None)
    meta = type(tensor) if tensor is not None else None
    if meta is None or meta.__call__ is type.__call__:
        return None
    pybind11_meta = any(k.__name__ == "pybind11_type" for k in meta.__mro__)
    pybind11_instances = any(k.__name__ == "pybind11_object" for k in tensor.__mro__)
    if not pybind11_meta or pybind11_instances:
        return None
    meta.__call__ = type.__call__
    return "%s.%s.__call__ = type.__call__" % (meta.__module__, meta.__name__)

