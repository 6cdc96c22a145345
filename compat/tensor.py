"""Tensor plumbing that differs between real torch and MindSpore's torch-API layer."""
import contextlib

import numpy as np

import compat as _c


def _is_ms():
    return _c.IS_MINDSPORE


def is_tensor(obj):
    if _is_ms():
        import mindspore
        return isinstance(obj, mindspore.Tensor)  # adapter tensors and Parameters subclass it
    return isinstance(obj, _c.torch.Tensor)


def as_tensor(array, dtype=None):
    """numpy (or nested list / scalar) -> backend tensor on the current device. dtype: numpy dtype or None."""
    array = np.array(array, dtype=dtype, order="C")  # a copy: 0-d stays 0-d (ascontiguousarray makes it 1-d)
    if _is_ms():
        return _c.torch.tensor(array)
    from compat.device import torch_device
    return _c.torch.from_numpy(array.copy()).to(torch_device())


def to_numpy(t):
    """Backend tensor (or MindSpore tensor, or numpy) -> numpy array, detached, on the host."""
    if isinstance(t, np.ndarray):
        return t
    if _is_ms():
        return t.asnumpy() if hasattr(t, "asnumpy") else t.numpy()
    return t.detach().cpu().numpy()


def ms_tensor(t):
    """The plain `mindspore.Tensor` behind a torch-API tensor, for MindSpore code paths that take no other
    kind (a Cell's `bprop` results). mindnlp mindtorch's tensors are `mindspore.Tensor`s
    already; an op output MindSpore has not yet synchronised (a `StubTensor`, where this MindSpore still has
    the class) is made a Tensor, which the grad executor takes ("Unreasonable data type" otherwise)."""
    from mindspore.common._stub_tensor import StubTensor
    return t.stub_sync() if isinstance(t, StubTensor) else t


def zeros_like(t):
    return _c.torch.zeros_like(t)


def manual_seed(seed):
    """Seed the backend's global RNGs (parameter init, dropout, torch.randn ...)."""
    if _is_ms():
        import mindspore
        mindspore.set_seed(int(seed))
    _c.torch.manual_seed(int(seed))


def no_grad():
    """`torch.no_grad()`; on MindSpore nothing records gradients outside `value_and_grad`, so it is a no-op."""
    if _is_ms():
        return contextlib.nullcontext()
    return _c.torch.no_grad()


def assign_(target, value):
    """Write `value` into a parameter or buffer in place (no gradient): optimizer steps, running stats."""
    if _is_ms():
        import mindspore
        mindspore.ops.assign(target, value)
        return target
    with _c.torch.no_grad():
        target.copy_(value)
    return target


def _map(obj, fn):
    if isinstance(obj, dict):
        return type(obj)((k, _map(v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        out = [_map(v, fn) for v in obj]
        return type(obj)(*out) if hasattr(obj, "_fields") else type(obj)(out)
    return fn(obj)


def detach_tree(obj):
    """Detach every tensor in a nested dict/list/tuple."""
    return _map(obj, lambda v: v.detach() if is_tensor(v) else v)
