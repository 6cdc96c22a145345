"""Run the same code under both backends and bring the numbers back for comparison.

A *case* is a module-level function ``f(**kwargs) -> dict`` whose result holds numpy arrays, numbers, strings
and nested dicts/lists of them. ``run_case("torch", "tests.test_x:case_y", seed=0)`` runs it with the torch
backend, in this process when it is the active backend, otherwise in that backend's virtual environment
(``.venv`` / ``.venv-torch``) through ``tests/_crossenv_child.py``, exchanging pickles (protocol 4; numpy<2 on
both sides) through a temporary directory. An interpreter that has MindSpore is itself the MindSpore side.

The other backend's cases of one test module share one child process (`_Worker`), started by the module's
first case and ended when a case of another module arrives (or this process exits): the start-up (the
framework's import) is paid once per module rather than once per case. Cases seed what they draw, so they
give the same numbers wherever they run; a case that needs a process of its own (its subject is the process's
state: an export's effect on later graphs) asks for `fresh=True`.
"""
import atexit
import importlib
import importlib.util
import os
import pickle
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOW_MISSING = "REID_ALLOW_MISSING_BACKEND"
# an interpreter that has MindSpore (.venv) is itself the MindSpore side of parity runs; one
# without it but with torch is the torch side where .venv-torch is missing (a GPU machine's own torch)
_HAS_MINDSPORE = importlib.util.find_spec("mindspore") is not None
_TORCH_VENV = ROOT / ".venv-torch" / "bin" / "python"
_OWN_TORCH = not _HAS_MINDSPORE and not _TORCH_VENV.exists() and importlib.util.find_spec("torch") is not None
PYTHONS = {"mindspore": Path(sys.executable) if _HAS_MINDSPORE else ROOT / ".venv" / "bin" / "python",
           "torch": Path(sys.executable) if _OWN_TORCH else _TORCH_VENV}


def active_backend():
    import compat
    return compat.BACKEND


def backend_available(backend):
    return backend == active_backend() or PYTHONS[backend].exists()


def require_backend(backend):
    """Fail the calling test if that backend's environment is missing: a parity test that cannot run has not
    passed, and `make test` must not exit 0 without its reference numbers. Set REID_ALLOW_MISSING_BACKEND=1
    to skip such tests instead (e.g. a machine with only one of the two environments)."""
    if backend_available(backend):
        return
    msg = "%s environment %s is missing; run 'make setup'" % (backend, PYTHONS[backend])
    if os.environ.get(ALLOW_MISSING) == "1":
        pytest.skip(msg + " (skipped: %s=1)" % ALLOW_MISSING)
    pytest.fail(msg + ", or set %s=1 to skip the tests that need it" % ALLOW_MISSING, pytrace=False)


def call(target, kwargs):
    module_name, func_name = target.split(":")
    return getattr(importlib.import_module(module_name), func_name)(**kwargs)


def child_env(**extra):
    """os.environ for a child process of this interpreter: the repo first on PYTHONPATH, the caller's entries kept
    after it (a machine whose packages come through PYTHONPATH still finds them), plus `extra`."""
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **extra)


class _Worker:
    """A child process of `backend`'s environment that runs pickled case calls until its stdin closes
    (tests/_crossenv_child.py --serve): one request line (input and output pickle paths) in, one answer line
    ("ok" or "error") out, on a protocol descriptor of its own so that what the cases print cannot mix in."""

    def __init__(self, backend, module):
        self.backend, self.module = backend, module
        self.log = tempfile.TemporaryFile(mode="w+")
        read_answers, self._answers = os.pipe()
        env = dict(os.environ, REID_BACKEND=backend, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [str(PYTHONS[backend]), str(ROOT / "tests" / "_crossenv_child.py"), "--serve", str(self._answers)],
            cwd=str(ROOT), env=env, stdin=subprocess.PIPE, stdout=self.log, stderr=self.log, text=True,
            pass_fds=(self._answers,))
        os.close(self._answers)
        self._read = os.fdopen(read_answers, "r")

    def run(self, calls, timeout):
        with tempfile.TemporaryDirectory(prefix="crossenv-") as tmp:
            src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
            with open(src, "wb") as fh:
                pickle.dump(list(calls), fh, protocol=4)
            try:
                self.proc.stdin.write("%s\t%s\n" % (src, dst))
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass   # it died: the read below says so
            ready, _, _ = select.select([self._read], [], [], timeout)
            answer = self._read.readline().strip() if ready else "timeout"
            if answer not in ("ok", "error"):
                tail = self.tail()
                self.close()
                raise RuntimeError("%s backend run of %s failed (%s, rc %s):\n%s" % (
                    self.backend, [t for t, _ in calls], answer or "the process ended", self.proc.returncode,
                    tail))
            with open(dst, "rb") as fh:
                result = pickle.load(fh)
        if answer == "error":
            raise RuntimeError("%s backend run of %s failed:\n%s" % (self.backend, [t for t, _ in calls], result))
        return result

    def tail(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self):
        try:
            self.proc.stdin.close()   # the child's loop ends with its stdin
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._read.close()
        self.log.close()


_WORKERS = {}   # backend -> the _Worker of the test module that ran last


def _worker(backend, module):
    worker = _WORKERS.get(backend)
    if worker is not None and (worker.module != module or worker.proc.poll() is not None):
        worker.close()
        worker = None
    if worker is None:
        worker = _WORKERS[backend] = _Worker(backend, module)
    return worker


@atexit.register
def close_workers():
    for worker in _WORKERS.values():
        worker.close()
    _WORKERS.clear()


def run_cases(backend, calls, timeout=900, fresh=False):
    """Run [(target, kwargs), ...] under `backend`; return their results in order. The active backend runs them
    in this process unless `fresh` asks for a new one; the other backend in its module's worker (module
    docstring), or with `fresh` in a new process of its own."""
    require_backend(backend)
    if backend == active_backend() and not fresh:
        return [call(t, kw) for t, kw in calls]
    if not fresh:
        return _worker(backend, calls[0][0].split(":")[0]).run(calls, timeout)
    worker = _Worker(backend, None)   # a process of its own, for these calls only
    try:
        return worker.run(calls, timeout)
    finally:
        worker.close()


def run_case(backend, target, **kwargs):
    return run_cases(backend, [(target, kwargs)])[0]


def both(target, **kwargs):
    """(mindspore result, torch result) of one case."""
    return run_case("mindspore", target, **kwargs), run_case("torch", target, **kwargs)
