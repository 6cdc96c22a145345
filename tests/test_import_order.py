"""Imports whose order changes what a process can do, each order in a fresh interpreter of this environment
(docs/limitations.md#import-order): protobuf's C implementation (loaded by pymilvus) before MindSpore is a
one-line error from compat instead of a failed import and a crash at exit; MindSpore first leaves pymilvus on
protobuf's pure-Python implementation (why the tools keep a Milvus collection in a process of their own,
which gets the C implementation back)."""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.crossenv import ROOT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mindspore") is None or
                                importlib.util.find_spec("pymilvus") is None,
                                reason="the MindSpore environments' fault: MindSpore and pymilvus both installed")


def fresh(code, **env):
    """(exit status, stdout, stderr) of `code` in a new interpreter on the MindSpore backend."""
    env = dict(os.environ, REID_BACKEND="mindspore", **env)
    env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_mindspore_after_pymilvus_is_a_one_line_error():
    rc, out, err = fresh("import pymilvus\nimport compat\ncompat.torch\nprint('imported')")
    assert rc == 2 and "imported" not in out, (rc, err[-2000:])
    assert err.startswith("error: MindSpore cannot be imported in this process: protobuf's") and \
        err.count("\n") == 1 and "(by pymilvus" in err, err[-2000:]


def test_pymilvus_after_mindspore_is_pure_python_and_the_store_process_is_not():
    """MindSpore first: pymilvus works in the process, on the pure-Python protobuf MindSpore asked for; the
    child that open_store starts there (milvus_store.child_environment) has protobuf's C implementation."""
    code = ("import subprocess, sys\nimport compat\ncompat.torch\nimport pymilvus\n"
            "from google.protobuf.internal import api_implementation\nprint(api_implementation.Type())\n"
            "from reid.deploy.milvus_store import child_environment\n"
            "print(subprocess.run([sys.executable, '-c', 'import pymilvus; from google.protobuf.internal import "
            "api_implementation as a; print(a.Type())'], env=child_environment(), capture_output=True, "
            "text=True).stdout.strip())\n")
    rc, out, err = fresh(code)
    assert rc == 0, err[-2000:]
    here, child = out.split()[-2:]
    assert here == "python" and child not in ("python", ""), out
