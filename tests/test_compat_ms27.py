"""The MindSpore 2.7 stack (mindnlp 0.5.1's top-level `mindtorch`, `.venv-ms27`): compat picks the layer, never
takes it for PyTorch, and each shim of compat/shims.py (`apply_mindtorch`) fixes a defect of the layer that the
test first shows without it. The layer-free tests run on every stack; the rest where that layer is active
(tools/ms27_defects.py shows each defect without compat)."""
import subprocess
import sys
import types
from pathlib import Path

import pytest

import compat
from compat import backend
from tests.crossenv import child_env

ROOT = Path(__file__).resolve().parents[1]
# mindnlp's mindtorch is installed here (whether or not it is the active layer: a torch run never imports it)
HAS_MINDNLP_MINDTORCH = "mindtorch" in backend.installed_layers()
on_ms27 = pytest.mark.skipif(not HAS_MINDNLP_MINDTORCH, reason="needs mindnlp's mindtorch (.venv-ms27)")


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=child_env(**env), capture_output=True,
                          text=True, timeout=300)


def _stand_in_module(name, file, loader_module):
    module = types.ModuleType(name)
    module.__file__ = file
    loader = type("Loader", (), {})
    loader.__module__ = loader_module
    module.__spec__ = types.SimpleNamespace(loader=loader())
    return module


def test_a_mindtorch_import_hook_is_not_taken_for_pytorch():
    real = _stand_in_module("torch", "/venv/lib/site-packages/torch/__init__.py", "importlib._bootstrap_external")
    proxy = _stand_in_module("torch", "/venv/lib/site-packages/mindtorch/__init__.py", "mindtorch.torch_proxy")
    assert not backend.is_mindtorch_proxy(real)
    assert backend.is_mindtorch_proxy(proxy)
    # the hook's module found by its loader alone, or by its file alone
    assert backend.is_mindtorch_proxy(_stand_in_module("torch", real.__file__, "mindtorch.torch_proxy"))
    assert backend.is_mindtorch_proxy(_stand_in_module("torch", proxy.__file__, "importlib._bootstrap_external"))


def test_the_active_layer_is_the_installed_one():
    layers = backend.installed_layers()
    if compat.BACKEND == "torch":
        assert compat.LAYER == "torch" and compat.STACK == "torch"
        return
    assert layers and compat.LAYER == layers[0]
    assert compat.STACK == backend.STACKS[compat.LAYER]
    info = compat.info()
    assert info["torch_api"] == compat.LAYER and info["stack"] == compat.STACK
    if compat.LAYER == "mindtorch":
        import mindspore
        assert mindspore.__version__.startswith("2.7.")
        assert info["torch_api_version"].endswith("(mindnlp)") and info["torch_api_version"][0].isdigit()


@on_ms27
def test_python_m_compat_names_the_ms27_stack():
    proc = subprocess.run([sys.executable, "-m", "compat"], cwd=str(ROOT), env=child_env(REID_BACKEND="mindspore"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert rows["stack"] == "ms27" and rows["torch_api"] == "mindtorch"
    assert rows["torch_api_version"].startswith("0.5.1") and rows["framework_version"].startswith("2.7.")


@on_ms27
@pytest.mark.parametrize("first", ["", "import mindtorch\n"], ids=["plain", "after-import-mindtorch"])
def test_torch_backend_in_the_ms27_environment_is_a_one_line_error(first):
    """No PyTorch here: plainly `import torch` fails; after `import mindtorch` it succeeds (the layer answers for
    the name) and compat must still refuse it, naming the torch environment."""
    if first:
        probe = _run(first + "import torch, sys\nprint(type(torch.zeros(1)).__module__)\n")
        assert probe.returncode == 0, probe.stderr          # the layer answers `import torch`
    proc = _run(first + "import compat\ncompat.torch\n", REID_BACKEND="torch")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: backend 'torch'")
    assert ".venv-torch" in proc.stderr and "make setup-torch" in proc.stderr
