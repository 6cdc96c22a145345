"""compat/layers/msadapter/defects.py: the tensor-metaclass fix (MSAdapter's out-of-bounds read in pybind11's
metaclass call)."""
import numpy as np

import compat
from compat.layers.msadapter.defects import fix_tensor_metaclass


def _stand_ins(instances_are_pybind11):
    """A torch-like module whose Tensor has a metaclass derived from a class named like pybind11's (its
    `__call__` counts its calls), and instances that are (or are not) pybind11 objects."""
    calls = []
    pybind11_type = type("pybind11_type", (type,), {"__call__": lambda cls, *a, **k: calls.append(cls) or
                                                    type.__call__(cls, *a, **k)})
    meta = type("_TensorMeta", (pybind11_type,), {})
    bases = (type("pybind11_object", (), {}),) if instances_are_pybind11 else ()
    tensor = meta("Tensor", bases, {"__init__": lambda self, value: setattr(self, "value", value)})
    return type("torch", (), {"Tensor": tensor}), calls


def test_the_fix_bypasses_the_pybind11_metaclass_call_only_for_non_pybind11_instances():
    torch, calls = _stand_ins(instances_are_pybind11=False)
    assert torch.Tensor(1).value == 1 and len(calls) == 1        # through the pybind11-like __call__
    assert fix_tensor_metaclass(torch) == "%s._TensorMeta.__call__ = type.__call__" % __name__
    assert torch.Tensor(2).value == 2 and len(calls) == 1        # __new__ + __init__, without it
    assert fix_tensor_metaclass(torch) is None                    # once
    torch, calls = _stand_ins(instances_are_pybind11=True)
    assert fix_tensor_metaclass(torch) is None                    # real pybind11 instances keep the check
    torch.Tensor(3)
    assert len(calls) == 1


def test_the_active_layer_builds_tensors_without_the_out_of_bounds_read():
    """On MSAdapter (a 32-byte Tensor object under pybind11's metaclass) the fix is in place after import;
    torch and mindtorch need none."""
    if compat.STACK != "msadapter":
        assert fix_tensor_metaclass(compat.torch) is None
        return
    tensor = compat.torch.Tensor
    assert type(tensor).__call__ is type.__call__
    assert tensor.__basicsize__ < 0x31     # why: pybind11 reads its flags byte at offset 0x30
    a = compat.as_tensor(np.arange(3, dtype=np.float32))
    b = a + a
    assert isinstance(b, tensor) and np.array_equal(compat.to_numpy(b), [0, 2, 4])
