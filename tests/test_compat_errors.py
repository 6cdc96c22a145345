"""Bad input reaches the user as one line `error: ...` with exit status 2 (compat.errors.UserError)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.crossenv import child_env

ROOT = Path(__file__).resolve().parents[1]


def _run(args, backend=None, **env):
    full_env = child_env(**env)
    if backend is not None:
        full_env["REID_BACKEND"] = backend
    return subprocess.run([sys.executable] + args, cwd=str(ROOT), env=full_env, capture_output=True, text=True,
                          timeout=120)


def test_unknown_backend_exits_2_with_one_line():
    proc = _run(["-m", "compat"], backend="foo")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: unknown backend 'foo'")
    assert "mindspore, torch" in proc.stderr


def test_unavailable_device_is_a_user_error():
    import compat
    # a device this environment lacks: 'gpu' in our CPU-only builds (MindSpore CPU wheel, torch +cpu), 'ascend' for
    # torch on a GPU machine (where set_device('gpu') succeeds and would leave every later test on the GPU)
    missing = "ascend" if not compat.IS_MINDSPORE and compat.torch.cuda.is_available() else "gpu"
    try:
        with pytest.raises(compat.UserError, match="device '%s'" % missing):
            compat.set_device(missing)
        with pytest.raises(compat.UserError, match="unknown device 'tpu'"):
            compat.set_device("tpu")
    finally:
        assert compat.set_device("cpu") == "cpu" and compat.current_device() == "cpu"


def test_corrupt_checkpoint_prints_one_line(tmp_path):
    import compat
    bad = tmp_path / "model_final.pth"
    bad.write_bytes(b"PK\x03\x04 this is not really a zip file")
    proc = _run(["-c", "import sys, compat; compat.checkpoint.load(sys.argv[1])", str(bad)], backend=compat.BACKEND)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and str(bad) in proc.stderr


def test_error_type_imports_without_loading_a_framework():
    """`from compat.errors import UserError` (and the config, the synthetic generator, the transforms that
    raise it) must not import MindSpore or torch; the first use of the torch API does."""
    code = ("import sys\n"
            "from compat.errors import UserError\n"
            "import compat, reid.config, reid.data.synthetic, reid.data.transforms\n"
            "reid.config.load_cfg(None, ['SOLVER.BASE_LR', '0.1'])\n"
            "loaded = sorted(m for m in ('mindspore', 'torch', 'mindtorch') if m in sys.modules)\n"
            "assert not loaded, loaded\n"
            "assert compat.UserError is UserError\n"
            "compat.as_tensor\n"
            "print(compat.BACKEND, 'mindspore' in sys.modules, 'torch' in sys.modules)\n")
    backend = os.environ.get("REID_BACKEND", "mindspore")   # the one this interpreter's environment holds
    proc = _run(["-c", code], backend=backend)
    assert proc.returncode == 0, proc.stderr
    # ... and the first use of a compat name loads it
    assert proc.stdout.split()[0] == backend
    assert proc.stdout.split()[1 if backend == "mindspore" else 2] == "True"
