"""The only package that knows which framework runs underneath ``reid/``.

``reid`` code writes ordinary PyTorch (``nn.Module``, ``forward``, ``F.conv2d`` ...) against the names exported
here, and calls the helpers below wherever MindSpore's torch-API layer differs from PyTorch: gradients,
optimizers, schedules, norm layers with correct running statistics, custom backward, checkpoint I/O, loaders.

The framework is loaded on first use of any of these names, not by ``import compat``: so
``from compat.errors import UserError`` (and code that only raises it, e.g. the config and the synthetic-data
generator) never pays for importing MindSpore or torch, and entry points can still choose the backend
(``REID_BACKEND``) after importing modules that import ``compat``.
"""
import importlib

from compat.errors import UserError

# public name -> submodule that defines it; the backend itself (BACKEND, torch, nn, F, IS_MINDSPORE, STACK,
# layer) comes from compat.backend
_EXPORTS = {
    "as_tensor": "tensor", "to_numpy": "tensor", "manual_seed": "tensor", "no_grad": "tensor", "assign_": "tensor",
    "is_tensor": "tensor", "zeros_like": "tensor", "detach_tree": "tensor",
    "set_device": "device", "current_device": "device", "to_device": "device", "synchronize": "device",
    "value_and_grad": "autograd", "batch_norm": "norm", "instance_norm": "norm", "clip_grad_norm": "clip",
    "custom_op": "custom_op", "normalize": "functional", "vector_norm": "functional",
    "max_pool2d_ceil": "functional", "scale_rows": "functional",
    "eager_only": "jit", "state_buffer": "jit",
}
_SUBMODULES = ("optim", "schedules", "checkpoint", "data", "jit", "distributed")
_BACKEND_NAMES = ("BACKEND", "IS_MINDSPORE", "STACK", "layer", "LAYER", "torch", "nn", "F")
_state = {"loading": False}


def _load():
    """Import the framework, then every submodule, in the order the submodules rely on (backend first)."""
    _state["loading"] = True
    try:
        from compat import backend
        info = backend.load()
        g = globals()
        g.update(_info=info, BACKEND=info["name"], torch=info["torch"], nn=info["nn"], F=info["F"],
                 IS_MINDSPORE=info["name"] == "mindspore",
                 # STACK: 'torch' | 'ms27' (the default), the stack's name;
                 # layer: its package under compat/layers/ (None on torch); LAYER: the torch module's name
                 STACK=info["stack"], layer=info["layer_package"], LAYER=info["layer"])
        if info["layer_package"] is not None:  # the layer's own compat.F (its `functional`)
            g["F"] = info["layer_package"].functional(info["F"])
        for name, module in _EXPORTS.items():
            # a submodule imported directly (`import compat.norm`) is still half-initialised when its own
            # module-level code got here: its names are bound later, on first use (__getattr__)
            value = getattr(importlib.import_module("compat." + module), name, None)
            if value is not None:
                g[name] = value
        for module in _SUBMODULES:
            g[module] = importlib.import_module("compat." + module)
        g["jit"].set_threads()  # MindSpore's CPU kernel pool: one thread per core unless told otherwise
    finally:
        _state["loading"] = False


def __getattr__(name):
    if name in _BACKEND_NAMES or name in _EXPORTS or name in _SUBMODULES:
        if not _state["loading"] and "_info" not in globals():
            _load()
        if name in globals():
            return globals()[name]
        if name in _EXPORTS and not _state["loading"]:
            value = getattr(importlib.import_module("compat." + _EXPORTS[name]), name)
            globals()[name] = value
            return value
    raise AttributeError("module 'compat' has no attribute %r" % (name,))


def info():
    """What is active: backend, stack (the Makefile's STACK name), torch-API layer and version, framework
    version, device, and glibc malloc's settings (compat/allocator.py)."""
    if "_info" not in globals():
        _load()
    i = globals()["_info"]
    from compat import allocator
    return dict(backend=i["name"], stack=i["stack"], torch_api=i["layer"], torch_api_version=i["layer_version"],
                framework=i["framework"], framework_version=i["framework_version"],
                device=globals()["current_device"](), malloc=allocator.describe())


# every public name: the backend's, this module's own and the export tables above (one list to keep in step)
__all__ = list(_BACKEND_NAMES) + ["UserError", "info"] + list(_EXPORTS) + list(_SUBMODULES)
