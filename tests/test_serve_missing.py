"""Without the web modules (an environment installed without them) the server is a one-line error naming
what to install, whichever of them is missing."""
import builtins
import subprocess
import sys

import pytest

from compat.errors import UserError
from tests.crossenv import ROOT


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn", "python_multipart"])
def test_the_server_without_its_web_modules_is_one_line(monkeypatch, missing):
    from reid.deploy.server import WEB_MODULES, require_web
    real = builtins.__import__
    absent = set()
    for module, package in WEB_MODULES:
        try:
            real(module)
        except ImportError:
            absent.add(package)       # not installed in this environment
    absent.add(dict(WEB_MODULES)[missing])

    def without(name, *args, **kwargs):
        if name.split(".")[0] == missing:
            raise ImportError("No module named %r" % name, name=name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without)
    with pytest.raises(UserError) as info:
        require_web()
    named = [package for _, package in WEB_MODULES if package in absent]
    assert str(info.value) == ("the search server needs %s, not installed here; pip install fastapi==0.163.2 "
                               "uvicorn==0.54.0 python-multipart==0.0.34 (they are in requirements-torch.txt and "
                               "requirements.txt)" % " and ".join(named))


def test_the_command_says_what_to_install_where_they_are_missing(tmp_path):
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "serve.py"), "--index", str(tmp_path / "g.npz")],
                              capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1
        assert lines[0].startswith("error: the search server needs fastapi")
        assert "pip install fastapi==" in lines[0]
        return
    # installed here: the command goes on to check its arguments (one line too)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "serve.py"), "--index", str(tmp_path / "g.npz")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: index file %s does not exist; write it with tools/index.py --gallery DIR --output %s"
        % (tmp_path / "g.npz", tmp_path / "g.npz")]
