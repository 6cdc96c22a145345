"""Device context: `--device cpu|gpu|ascend` (MODEL.DEVICE).

MindSpore has one global device (`set_context(device_target=...)`); torch places each tensor, so on torch
`to_device` moves modules and `as_tensor` creates tensors on the chosen device.
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
        import mindspore
        target = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}[key]
        try:
            mindspore.set_context(device_target=target)
        except (RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError("device %r is not available to this MindSpore install (%s); install the MindSpore "
                            "build for that device or use --device cpu" % (key, first)) from None
    else:
        if key == "gpu" and not _c.torch.cuda.is_available():
            raise UserError("device 'gpu' requested but torch sees no CUDA device (torch %s); use --device cpu"
                            % _c.torch.__version__)
        if key == "ascend":
            raise UserError("device 'ascend' is only supported by the mindspore backend; use --backend mindspore "
                            "or --device cpu")
    _current = key
    return key


def current_device():
    return _current


def torch_device():
    """The torch.device for the current device (torch backend only)."""
    return _c.torch.device("cuda" if _current == "gpu" else "cpu")


def to_device(obj):
    """Move a module or tensor to the current device (no-op on MindSpore, whose device is global)."""
    if _c.IS_MINDSPORE:
        return obj
    return obj.to(torch_device())
