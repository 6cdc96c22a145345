"""glibc malloc's settings in a MindSpore process (compat/allocator.py), each case in a fresh interpreter of this
environment, since they must be set before MindSpore is imported: with compat's settings the process has at most
two malloc arenas however many threads allocate, and a block above 128 KiB is mapped on its own even after a
bigger one was freed (glibc's default raises its threshold then); REID_MALLOC_TUNING=0 leaves glibc's defaults,
which show the opposite on both counts. And a graph build ends by handing the heap's free pages back."""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.crossenv import ROOT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mindspore") is None,
                                reason="compat sets glibc's malloc only for MindSpore")

# After compat has loaded MindSpore: eight threads that each allocate (a thread's first malloc gets it an arena
# of its own, up to the limit), the arenas counted from malloc_info's XML; then a 4 MiB block freed (which
# raises glibc's dynamic mmap threshold to its size) and whether a 512 KiB block is then mapped on its own
# (mallinfo2's count of mapped blocks).
PROBE = r"""
import ctypes, os, tempfile, threading
import compat
print(compat.info()["malloc"])
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
held, go = [], threading.Barrier(8)
def allocate():
    go.wait()
    held.append(libc.malloc(4096))
threads = [threading.Thread(target=allocate) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print("arenas", open(path).read().count("<heap nr="))
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(512 << 10)
print("mapped", libc.mallinfo2().hblks - before)
libc.free(block)
"""


def probe(**env):
    environ = dict(os.environ, REID_BACKEND="mindspore", **env)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=str(ROOT), env=environ, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return lines[-3], int(lines[-2].split()[1]), int(lines[-1].split()[1])


def test_mindspore_processes_keep_two_arenas_and_map_big_blocks_on_their_own():
    said, arenas, mapped = probe()
    assert said.startswith("arenas at most 2, mmap threshold 128 KiB"), said
    assert arenas <= 2 and mapped == 1, (arenas, mapped)


def test_the_switch_leaves_glibc_defaults():
    said, arenas, mapped = probe(REID_MALLOC_TUNING="0")
    assert said == "glibc's defaults (REID_MALLOC_TUNING=0)", said
    assert arenas > 2 and mapped == 0, (arenas, mapped)


def _affine(x):
    return (x * 2.0 + 1.0,)


def test_a_graph_build_hands_free_heap_pages_back(monkeypatch):
    """Once per build, not on the built graph's calls."""
    import compat
    from compat import allocator
    calls = []
    monkeypatch.setattr(allocator, "give_back_free_pages", lambda always=False: calls.append(always))
    fn = compat.jit.compiled(_affine, "allocator_probe")
    x = compat.as_tensor([[1.0, 2.0], [3.0, 4.0]])
    for _ in range(3):
        out = fn(x)
    assert compat.to_numpy(out[0]).tolist() == [[3.0, 5.0], [7.0, 9.0]]
    assert calls == [False], calls
