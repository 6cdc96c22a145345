"""tests/crossenv.py: a missing reference environment fails the test run (pytest exits non-zero) unless
REID_ALLOW_MISSING_BACKEND=1 asks for skips; run in a child pytest so the exit status itself is checked."""
import collections
import os
import shlex
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


def _make_n(*args):
    # (PYTEST_ARGS cleared: a caller's own, e.g. `make test PYTEST_ARGS=...` running this test, reach make -n)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_ARGS")}
    proc = subprocess.run(["make", "-n"] + list(args) + ["PY311=python3", "PYTEST_ARGS="], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60, env=dict(env, **{ALLOW_MISSING: "1"}))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _pytest_runs(text):
    """(interpreter, selections, ignored files, deselected ids, -m expression) of each pytest run of a `make -n`."""
    runs = []
    for line in text.replace("\\\n", " ").splitlines():
        if " -m pytest" not in line:
            continue
        python = line.split(" -m pytest")[0].split()[-1]
        args = shlex.split(line.split(" -m pytest")[1].split("||")[0])
        picks, ignored, deselected, marks = [], [], [], None
        k = 0
        while k < len(args):
            arg = args[k]
            if arg.startswith("--ignore="):
                ignored.append(arg[len("--ignore="):])
            elif arg in ("--deselect", "-m", "-o", "-p"):
                k += 1
                if arg == "--deselect":
                    deselected.append(args[k])
                elif arg == "-m":
                    marks = args[k]
            elif not arg.startswith("-"):
                picks.append(arg)
            k += 1
        runs.append((python, picks, ignored, deselected, marks))
    return runs


def _selected(ids, picks, ignored, deselected):
    def under(test, prefix):
        return test == prefix or test.startswith(prefix.rstrip("/") + ("/" if "::" not in prefix and
                                                                         not prefix.endswith(".py") else "::"))
    return [t for t in ids if any(under(t, p) for p in picks) and not any(under(t, f) for f in ignored)
            and not any(under(t, d) for d in deselected)]


def test_make_test_runs_every_test_of_the_default_stack_exactly_once():
    """`make test` is what CI runs: it clears REID_ALLOW_MISSING_BACKEND for every pytest run; the default stack's
    suite is cut into several runs (balanced across the make jobs), which together select every test pytest
    collects in that environment exactly once; the torch run leaves none out."""
    planned = _make_n("test")
    runs = _pytest_runs(planned)
    text = planned.replace("\\\n", " ")
    assert all(("%s= " % ALLOW_MISSING) in line for line in text.splitlines() if " -m pytest" in line), text
    ms = [run for run in runs if run[0] == ".venv/bin/python"]
    torch_runs = [run for run in runs if run[0] == ".venv-torch/bin/python"]
    assert len(ms) >= 2 and len(torch_runs) == 1 and len(runs) == len(ms) + 1, runs
    assert torch_runs[0][1:4] == (["tests"], [], []) and torch_runs[0][4] == "not parity", torch_runs
    assert all(run[4] is None for run in ms), ms
    require_backend("mindspore")
    collected = subprocess.run([str(PYTHONS["mindspore"]), "-m", "pytest", "--collect-only", "-q", "-p",
                                "no:cacheprovider", "tests"], cwd=str(ROOT), capture_output=True, text=True,
                               timeout=600, env=dict(os.environ, REID_BACKEND="mindspore"))
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = [line.strip() for line in collected.stdout.splitlines() if "::" in line]
    assert len(ids) > 500, collected.stdout[-2000:]
    counts = collections.Counter(t for _, picks, ignored, deselected, _ in ms
                                 for t in _selected(ids, picks, ignored, deselected))
    missing = [t for t in ids if counts[t] == 0]
    twice = [t for t in ids if counts[t] > 1]
    assert not missing and not twice, (missing[:10], twice[:10])
    # the model of pytest's selection above is itself checked on the runs' shapes: a file, a node id, a folder
    assert _selected(["tests/a.py::x", "tests/a.py::y[1]", "tests/ab.py::z"], ["tests/a.py"], [], []) == \
        ["tests/a.py::x", "tests/a.py::y[1]"]
    assert _selected(["tests/a.py::y[1]", "tests/a.py::y[2]"], ["tests"], [], ["tests/a.py::y[1]"]) == \
        ["tests/a.py::y[2]"]


def test_make_demo_runs_the_default_stack_and_the_retired_one_is_one_line():
    """`make demo` trains on the MindSpore 2.7 stack (.venv); STACK=msadapter, the retired legacy stack, and its
    old targets are one line saying so and what to use."""
    demo = [line for line in _make_n("demo").splitlines() if "train.py" in line]
    assert demo == ["REID_BACKEND=mindspore .venv/bin/python train.py --config-file configs/synthetic/acl.yml"]
    for args in (["-n", "demo", "STACK=msadapter"], ["test-msadapter"], ["setup-msadapter"]):
        proc = subprocess.run(["make"] + args, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        said = [line for line in proc.stderr.splitlines() if "retired" in line]
        assert proc.returncode == 2 and len(said) == 1, (args, proc.stderr)
        assert "use the default stack" in said[0] and "make demo" in said[0], said


def case_pid(fail=False):
    if fail:
        raise ValueError("a case that fails on purpose")
    return {"pid": os.getpid(), "backend": os.environ["REID_BACKEND"]}


def _other(active):
    return "torch" if active == "mindspore" else "mindspore"


def test_the_other_backends_cases_of_one_module_share_one_process():
    """The cases of one module run in one worker of the other backend (its start-up paid once); a case that
    fails is that case's RuntimeError, with its traceback, and the worker goes on; a case of another module
    gets a worker of its own, and `fresh` a process of its own."""
    from tests import crossenv
    other = _other(crossenv.active_backend())
    require_backend(other)
    first = crossenv.run_case(other, "tests.test_crossenv:case_pid")
    assert first["backend"] == other and first["pid"] != os.getpid()
    try:
        crossenv.run_case(other, "tests.test_crossenv:case_pid", fail=True)
    except RuntimeError as exc:
        assert "a case that fails on purpose" in str(exc) and "ValueError" in str(exc), exc
    else:
        raise AssertionError("the failing case did not raise")
    assert crossenv.run_case(other, "tests.test_crossenv:case_pid") == first      # the same process
    elsewhere = crossenv.run_case(other, "os:getpid")
    assert elsewhere not in (first["pid"], os.getpid())
    fresh = crossenv.run_cases(other, [("tests.test_crossenv:case_pid", {})], fresh=True)[0]
    assert fresh["pid"] not in (first["pid"], elsewhere)


def test_a_worker_that_dies_is_reported_and_replaced():
    from tests import crossenv
    other = _other(crossenv.active_backend())
    require_backend(other)
    pid = crossenv.run_case(other, "tests.test_crossenv:case_pid")["pid"]
    try:
        crossenv.run_case(other, "os:_exit", status=3)   # the module's worker ends mid-case
    except RuntimeError as exc:
        assert "the process ended" in str(exc) and "rc 3" in str(exc), exc
    else:
        raise AssertionError("a dead worker was not reported")
    again = crossenv.run_case(other, "tests.test_crossenv:case_pid")["pid"]
    assert again != pid
