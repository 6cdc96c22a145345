"""The msadapter stack's runtime fix (MSAdapter 0.1.0 on MindSpore 2.0.0): one crash, the tensor-metaclass
row of its table (compat/layers/msadapter/__init__.py).
"""


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

