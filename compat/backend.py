"""Backend selection: the one place that decides which framework sits under the torch API.

`REID_BACKEND` picks it (``mindspore``, the default, or ``torch``). Under MindSpore the torch-API layer is the
one installed in the environment, in the order of `compat.layers.ORDER`: today the ms27 stack (the top-level
``mindtorch`` of the mindnlp 0.5.1 wheel on stable MindSpore 2.7, `.venv`). Everything a layer needs is in its
package under compat/layers/; this module only calls the names every layer package has. Entry points set the
variable from ``--backend`` before anything imports ``compat``.
"""
import importlib
import multiprocessing
import os
import sys
import warnings

from compat import layers as _layers
from compat.errors import UserError

BACKENDS = ("mindspore", "torch")
# The torch-API modules on MindSpore, in the order they are tried, and the stack each one is (the Makefile's
# STACK names). An environment holds one of them; the order only matters where several are installed.
LAYERS = tuple(_layers.get(stack).MODULE for stack in _layers.ORDER)
STACKS = dict({_layers.get(stack).MODULE: stack for stack in _layers.ORDER}, torch="torch")


def requested_backend():
    name = os.environ.get("REID_BACKEND", "mindspore").strip().lower() or "mindspore"
    if name not in BACKENDS:
        raise UserError(
            "unknown backend %r (from REID_BACKEND or --backend); use one of: %s" % (name, ", ".join(BACKENDS)))
    return name


def installed_layers():
    """The torch-API modules installed here, in `LAYERS` order, found from their files without importing them
    (each layer's `probe`)."""
    return [_layers.get(stack).MODULE for stack in _layers.installed()]


PROTOBUF_VARIABLE = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
_before_mindspore = {}


def protobuf_implementation_before_mindspore():
    """(known, value): PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION as it was before this module imported MindSpore,
    which sets it to "python" when unset (its checkpoint code is protobuf code generated in the old style, which
    protobuf's C implementation refuses); known is False where this module has not imported MindSpore. A child
    process that does not run MindSpore (the Milvus store's) gets the user's value back, and protobuf's C
    implementation with it."""
    return ("value" in _before_mindspore), _before_mindspore.get("value")


def check_protobuf_for_mindspore():
    """A one-line error, before MindSpore is imported, where protobuf's C implementation is already loaded: then
    MindSpore's import fails on its generated code ("Descriptors cannot be created directly") and the process
    crashes as it exits. What loaded it (pymilvus, onnx ...) has to come after MindSpore, or in another process."""
    if "mindspore" in sys.modules or "google.protobuf" not in sys.modules:
        return
    try:
        from google.protobuf.internal import api_implementation
        kind = api_implementation.Type()
    except Exception:   # a protobuf without the module: nothing known to refuse
        return
    if kind == "python":
        return
    users = [m for m in ("pymilvus", "onnx", "tensorboard", "grpc") if m in sys.modules]
    raise UserError("MindSpore cannot be imported in this process: protobuf's %s implementation is already loaded%s, "
                    "and MindSpore's generated protobuf code needs the pure-Python one; import compat (MindSpore) "
                    "before that, or run it in another process (reid.deploy.milvus_store.open_store does for "
                    "Milvus)" % (kind, " (by %s)" % ", ".join(users) if users else ""))


def _import_torch_api_on_mindspore():
    """Return (torch, nn, F, layer package) for the MindSpore backend."""
    # MindSpore logs every warning of its device probes to stderr; keep only errors unless the user asked.
    os.environ.setdefault("GLOG_v", "3")
    check_protobuf_for_mindspore()
    if "mindspore" not in sys.modules:
        _before_mindspore["value"] = os.environ.get(PROTOBUF_VARIABLE)
        # before MindSpore's threads allocate anything (compat/allocator.py says why)
        from compat import allocator
        allocator.tune()
    try:
        import mindspore  # noqa: F401
    except ImportError as exc:
        raise UserError(
            "backend 'mindspore' needs the MindSpore environment (%s); run 'make setup' and use "
            ".venv/bin/python, or pick --backend torch" % exc) from None
    errors = []
    found = [_layers.get(stack) for stack in _layers.installed()]
    if found:
        found[0].before_import(mindspore)
    for layer in found:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch = importlib.import_module(layer.MODULE)
                nn = importlib.import_module(layer.MODULE + ".nn")
                F = importlib.import_module(layer.MODULE + ".nn.functional")
        except Exception as exc:  # mindtorch on a MindSpore it was not written for fails in many ways
            errors.append("%s: %s: %s" % (layer.MODULE, type(exc).__name__,
                                          str(exc).splitlines()[0] if str(exc) else ""))
            continue
        layer.after_import(torch)
        return torch, nn, F, layer
    raise UserError("no torch-API layer for MindSpore imports (%s); run 'make setup' and use .venv/bin/python "
                    "(mindnlp==0.5.1 installed --no-deps: requirements-nodeps.txt)" % ("; ".join(errors) or
                                                                                      "none installed"))


def is_proxy_torch(module):
    """Whether an imported `torch` is mindnlp's mindtorch under that name: once imported, mindtorch puts an
    import hook first on `sys.meta_path` that answers `import torch` (and `torch.*`) with itself, and tells
    `importlib.metadata` that a torch distribution is installed. Real PyTorch's module lives in a `torch`
    folder and is loaded by Python's own loader."""
    spec = getattr(module, "__spec__", None)
    loader = type(getattr(spec, "loader", None))
    where = os.path.basename(os.path.dirname(getattr(module, "__file__", None) or ""))
    return loader.__module__.startswith("mindtorch") or where != "torch"


def load():
    """Import the selected backend and return a dict describing it."""
    name = requested_backend()
    if name == "torch":
        try:
            import torch
            import torch.nn as nn
            import torch.nn.functional as F
        except ImportError as exc:
            raise UserError("backend 'torch' needs PyTorch (%s); run 'make setup-torch' and use "
                            ".venv-torch/bin/python" % exc) from None
        if is_proxy_torch(torch):
            raise UserError("backend 'torch' needs PyTorch, but 'torch' here is mindnlp's mindtorch (it takes "
                            "that name once imported); run 'make setup-torch' and use .venv-torch/bin/python, "
                            "or pick --backend mindspore") from None
        return dict(name=name, torch=torch, nn=nn, F=F, layer="torch", layer_version=torch.__version__,
                    stack="torch", layer_package=None, framework="torch", framework_version=torch.__version__)

    torch, nn, F, layer = _import_torch_api_on_mindspore()
    import mindspore
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    # Fork is what the loaders (torch's and mindspore.dataset's worker processes) are written for on Linux;
    # set it whatever the layer's import chose.
    if os.name == "posix":
        try:
            multiprocessing.set_start_method("fork", force=True)
        except RuntimeError:
            pass
    # The layer warns on every in-place op ("not encouraged"); that says nothing about correctness here.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"mindtorch(\..*)?")
    warnings.filterwarnings("ignore", message=r".*inplace.*", category=UserWarning)
    return dict(name=name, torch=torch, nn=nn, F=F, layer=layer.MODULE,
                layer_version=layer.version(), stack=layer.STACK, layer_package=layer, framework="mindspore",
                framework_version=mindspore.__version__)
