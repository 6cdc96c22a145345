"""glibc's malloc settings for a MindSpore process, and the hand-back of freed heap pages after a graph build.

MindSpore's C++ side allocates its build structures and its runtime's host buffers with malloc from many
threads. With glibc's defaults that memory stays resident after it is freed: each thread that allocates gets
an arena of its own (up to eight per core), and a freed block above the mmap threshold raises the threshold,
so later blocks of that size come from the heap and leave holes in it instead of going back to the system when
they are freed. So before MindSpore is imported (`compat.backend`), `tune()` caps the arenas at two and fixes
the mmap threshold at glibc's initial 128 KiB, and after every graph build `compat.jit` calls
`give_back_free_pages()` (`malloc_trim`: the free pages anywhere in the heap, not only at its top). Neither
changes a value any kernel computes; what they save is in docs/performance.md#allocator.

`REID_MALLOC_TUNING=0` in the environment leaves glibc's defaults (the build's hand-back included). Elsewhere
than glibc (no `mallopt` in the C library) both are no-ops. torch processes are left alone: compat calls
`tune()` only on the way to importing MindSpore.
"""
import ctypes
import ctypes.util
import os

# mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
SETTINGS = ((M_ARENA_MAX, 2), (M_MMAP_THRESHOLD, 128 * 1024))
VARIABLE = "REID_MALLOC_TUNING"
_state = {"libc": None, "tuned": False}


def enabled():
    """Whether the settings apply: not switched off by REID_MALLOC_TUNING=0."""
    return os.environ.get(VARIABLE, "1").strip() != "0"


def _libc():
    """glibc's C library, or None where the C library is another (no mallopt / malloc_trim)."""
    if _state["libc"] is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _state["libc"] = libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else False
        except OSError:
            _state["libc"] = False
    return _state["libc"] or None


def tune():
    """Apply SETTINGS (once per process) unless switched off; whether they are in force."""
    libc = _libc()
    if libc is None or not enabled():
        return False
    if not _state["tuned"]:
        _state["tuned"] = all(libc.mallopt(param, value) == 1 for param, value in SETTINGS)
    return _state["tuned"]


def tuned():
    """Whether tune() put the settings in force in this process."""
    return _state["tuned"]


def give_back_free_pages(always=False):
    """Hand the heap's free pages back to the system (`malloc_trim(0)`), where the settings are on or `always`
    (a caller that has just freed a large amount itself)."""
    libc = _libc()
    if libc is not None and (always or enabled()):
        libc.malloc_trim(0)


def describe():
    """One line for `python -m compat`: the settings in force, or why glibc's defaults are."""
    if tuned():
        return "arenas at most %d, mmap threshold %d KiB (compat/allocator.py; %s=0: glibc's defaults)" % (
            dict(SETTINGS)[M_ARENA_MAX], dict(SETTINGS)[M_MMAP_THRESHOLD] // 1024, VARIABLE)
    if _libc() is None:
        return "not glibc: its defaults"
    if not enabled():
        return "glibc's defaults (%s=0)" % VARIABLE
    return "glibc's defaults (set only for MindSpore)"
