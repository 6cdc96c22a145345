"""The only package that knows which framework runs underneath ``reid/``.

``reid`` code writes ordinary PyTorch (``nn.Module``, ``forward``, ``F.conv2d`` ...) against the names exported
here, and calls the helpers below wherever MindSpore's torch-API layer differs from PyTorch: gradients,
optimizers, schedules, norm layers with correct running statistics, custom backward, checkpoint I/O, loaders.
"""
from compat.errors import UserError
from compat import backend as _backend

_info = _backend.load()
BACKEND = _info["name"]                 # 'mindspore' | 'torch'
torch = _info["torch"]                  # torch API module (real torch, msadapter.pytorch or mindtorch.torch)
nn = _info["nn"]
F = _info["F"]
IS_MINDSPORE = BACKEND == "mindspore"

from compat.tensor import (as_tensor, to_numpy, manual_seed, no_grad, assign_, is_tensor, zeros_like,  # noqa: E402
                           detach_tree, numpy_tree, tensor_tree)
from compat.device import set_device, current_device, to_device  # noqa: E402
from compat.autograd import value_and_grad  # noqa: E402
from compat.norm import batch_norm, instance_norm  # noqa: E402
from compat import jit  # noqa: E402,F401
from compat.jit import eager_only, state_buffer  # noqa: E402
jit.set_threads()
from compat.clip import clip_grad_norm  # noqa: E402
from compat.custom_op import custom_op  # noqa: E402
from compat import optim, schedules, checkpoint, data  # noqa: E402,F401
from compat.functional import normalize, vector_norm, max_values, min_values, where  # noqa: E402


def info():
    """What is active: backend, torch-API layer and version, framework version, device."""
    return dict(backend=BACKEND, torch_api=_info["layer"], torch_api_version=_info["layer_version"],
                framework=_info["framework"], framework_version=_info["framework_version"],
                device=current_device())


__all__ = ["BACKEND", "IS_MINDSPORE", "torch", "nn", "F", "UserError", "info", "as_tensor", "to_numpy",
           "manual_seed", "no_grad", "assign_", "is_tensor", "zeros_like", "detach_tree", "numpy_tree",
           "tensor_tree", "set_device", "current_device", "to_device", "value_and_grad", "batch_norm",
           "instance_norm", "normalize", "clip_grad_norm", "custom_op", "optim", "schedules", "checkpoint", "data"]
