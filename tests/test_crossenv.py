"""tests/crossenv.py: a missing reference environment fails the test run (pytest exits non-zero) unless
REID_ALLOW_MISSING_BACKEND=1 asks for skips; run in a child pytest so the exit status itself is checked."""
import os
import subprocess
import sys

from tests.crossenv import ALLOW_MISSING, PYTHONS, ROOT, require_backend

NEEDS_MINDSPORE = '''
from pathlib import Path
from tests import crossenv

def test_parity_case_with_the_mindspore_env_missing():
    crossenv.PYTHONS["mindspore"] = Path("/nonexistent/.venv/bin/python")
    crossenv.run_case("mindspore", "tests.crossenv:active_backend")
'''


def _child_pytest(tmp_path, allow):
    """pytest on a one-test file, run by the torch environment with the MindSpore one made to look missing."""
    (tmp_path / "test_needs_other.py").write_text(NEEDS_MINDSPORE)
    env = dict(os.environ, REID_BACKEND="torch", PYTHONPATH=str(ROOT))
    env.pop(ALLOW_MISSING, None)
    if allow is not None:
        env[ALLOW_MISSING] = allow
    python = sys.executable if os.environ.get("REID_BACKEND") == "torch" else str(PYTHONS["torch"])
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_needs_other.py")], cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=300)


def test_missing_environment_fails_the_run_unless_skipping_is_asked_for(tmp_path):
    require_backend("torch")
    failed = _child_pytest(tmp_path, None)
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "1 failed" in failed.stdout and "mindspore environment" in failed.stdout
    assert ALLOW_MISSING in failed.stdout                     # the failure names the opt-out
    skipped = _child_pytest(tmp_path, "1")
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]


def test_make_test_does_not_inherit_the_opt_out():
    """`make test` is what CI runs: it clears REID_ALLOW_MISSING_BACKEND for its pytest runs (the default
    MindSpore 2.7 stack, its step comparisons run apart, torch and the legacy MSAdapter quick list), what it
    leaves out of the default stack's main run is what it runs apart on that stack, so that partition drops
    nothing, and no other run leaves out a single test."""
    proc = subprocess.run(["make", "-n", "test", "PY39=python3", "PY311=python3"], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, **{ALLOW_MISSING: "1"}))
    runs = [line for line in proc.stdout.splitlines() if "-m pytest" in line]
    assert len(runs) == 4, proc.stdout + proc.stderr
    assert all(("%s= " % ALLOW_MISSING) in line for line in runs), runs
    lines = [line for line in proc.stdout.replace("\\\n", " ").splitlines() if "-m pytest" in line]

    def left_out(line):
        args = line.split(" -m pytest")[1].split()
        return ([arg.split("'")[1] for arg in line.split("--deselect ")[1:]]
                + [arg[len("--ignore="):] for arg in args if arg.startswith("--ignore=")])
    by_python = {}
    for line in lines:
        by_python.setdefault(line.split(" -m pytest")[0].split()[-1], []).append(line)
    dropped = {python: [t for line in runs_of for t in left_out(line)] for python, runs_of in by_python.items()}
    assert {python for python, tests in dropped.items() if tests} == {".venv/bin/python"}, dropped
    assert len(by_python[".venv/bin/python"]) == 2, lines
    main, apart = sorted(by_python[".venv/bin/python"], key=lambda line: -len(left_out(line)))
    assert " tests " in main and len(left_out(main)) == 2 and not left_out(apart), lines
    assert all(test in apart for test in left_out(main)), (left_out(main), apart)


def test_make_demo_runs_the_default_stack_and_the_legacy_one_on_request():
    """`make demo` trains on the MindSpore 2.7 stack (.venv); STACK=msadapter on the legacy one."""
    def demo(*extra):
        proc = subprocess.run(["make", "-n", "demo", "PY39=python3", "PY311=python3"] + list(extra), cwd=str(ROOT),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if "train.py" in line]
    assert demo() == ["REID_BACKEND=mindspore .venv/bin/python train.py --config-file configs/synthetic/acl.yml"]
    assert [line.split()[1] for line in demo("STACK=msadapter")] == [".venv-msadapter/bin/python"]
