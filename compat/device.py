"""Device context: `--device cpu|gpu|ascend` (MODEL.DEVICE).

MindSpore has one global device: `mindspore.set_device(...)` (which deprecates the context keyword
`device_target`, and refuses any change once an op has run, so a request for the device already set is not
passed on). torch places each tensor, so on torch `to_device` moves modules and
`as_tensor` creates tensors on the chosen device. mindnlp's mindtorch (the MindSpore 2.7 stack) also labels
each tensor with a torch-style device ('cpu', 'cuda', 'npu') and picks its kernels by that label: there the
layer's default device follows the choice, so tensors made afterwards (parameters of models built then,
`as_tensor`) run on it.
"""
import compat as _c
from compat.errors import UserError

DEVICES = ("cpu", "gpu", "ascend")
_ALIASES = {"cuda": "gpu", "npu": "ascend"}
_current = "cpu"


def set_device(name):
    global _current
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in DEVICES:
        raise UserError("unknown device %r; use one of: %s" % (name, ", ".join(DEVICES)))
    if _c.IS_MINDSPORE:
        _set_mindspore_device(key)
    else:
        if key == "gpu" and not _c.torch.cuda.is_available():
            raise UserError("device 'gpu' requested but torch sees no CUDA device (torch %s); use --device cpu"
                            % _c.torch.__version__)
        if key == "ascend":
            raise UserError("device 'ascend' is only supported by the mindspore backend; use --backend mindspore "
                            "or --device cpu")
    _current = key
    return key


# MindSpore's device_target per device (the layer's own label: its `set_device`, compat/layers/)
_MINDSPORE_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


def _set_mindspore_device(key):
    import mindspore
    target = _MINDSPORE_TARGETS[key]
    target_before = mindspore.get_context("device_target")
    try:
        if target_before != target:
            mindspore.set_device(target)
    except (RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "runtime has been initialized" in first:  # 2.7: an op ran before
            raise UserError("device %r requested after MindSpore ran its first op on %s (%s); choose the device "
                            "(--device, MODEL.DEVICE) before anything runs" % (key, target_before, first)) from None
        raise UserError("device %r is not available to this MindSpore install (%s); install the MindSpore "
                        "build for that device or use --device cpu" % (key, first)) from None
    _c.layer.set_device(key)


def current_device():
    return _current


def torch_device():
    """The torch.device for the current device (torch backend only)."""
    return _c.torch.device("cuda" if _current == "gpu" else "cpu")


def synchronize():
    """Wait until every kernel queued so far has run. MindSpore can queue op-by-op kernels and return at
    once; torch on a GPU queues on its stream. Timers around a piece of work
    call this at both ends, or the piece's kernels are counted in whatever waits next."""
    if _c.IS_MINDSPORE:
        from mindspore.common import api
        sync = getattr(api._pynative_executor, "sync", None)
        if sync is not None:
            sync()
    elif _current == "gpu":
        _c.torch.cuda.synchronize()


def to_device(obj):
    """Move a module or tensor to the current device (no-op on MindSpore, whose device is global)."""
    if _c.IS_MINDSPORE:
        return obj
    return obj.to(torch_device())
