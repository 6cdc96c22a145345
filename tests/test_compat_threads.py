"""MODEL.NUM_THREADS reaches MindSpore's CPU kernel pool, and MODEL.COMPILE_CACHE names the compile cache, through
the entry points' configure_runtime."""
import os

import pytest

import compat
from compat.errors import UserError


def _cfg(num_threads):
    from reid.config import get_cfg
    cfg = get_cfg()
    cfg.MODEL.NUM_THREADS = num_threads
    return cfg


@pytest.fixture
def restore_threads():
    before = compat.jit.set_threads()   # the default the rest of the session runs with
    cache = compat.jit.cache_dir()      # configure_runtime also names a compile cache: none for the session
    yield
    compat.jit.set_threads(before)
    compat.jit.set_cache_dir(cache)


def test_compile_cache_folder_follows_the_config(restore_threads, tmp_path):
    """MODEL.COMPILE_CACHE: "" keeps graphs under OUTPUT_DIR/compile_cache, "off" nowhere, else that folder."""
    from reid.runtime import compile_cache_dir, configure_runtime
    cfg = _cfg(0)
    cfg.OUTPUT_DIR = str(tmp_path / "run")
    assert compile_cache_dir(cfg) == str(tmp_path / "run" / "compile_cache")
    configure_runtime(cfg)
    assert compat.jit.cache_dir() == str(tmp_path / "run" / "compile_cache")
    cfg.MODEL.COMPILE_CACHE = "off"
    configure_runtime(cfg)
    assert compat.jit.cache_dir() is None
    cfg.MODEL.COMPILE_CACHE = str(tmp_path / "graphs")
    configure_runtime(cfg)
    assert compat.jit.cache_dir() == str(tmp_path / "graphs")


def test_num_threads_reaches_mindspore(monkeypatch, restore_threads):
    from reid.runtime import configure_runtime
    if not compat.IS_MINDSPORE:
        assert configure_runtime(_cfg(3)) is None   # torch keeps its own setting
        return
    import mindspore
    monkeypatch.delenv("REID_NUM_THREADS", raising=False)
    assert configure_runtime(_cfg(3)) == 3
    assert mindspore.get_context("runtime_num_threads") == 3
    cores = len(os.sched_getaffinity(0))
    assert configure_runtime(_cfg(0)) == cores           # 0: one per core
    assert mindspore.get_context("runtime_num_threads") == cores
    monkeypatch.setenv("REID_NUM_THREADS", "5")          # 0 defers to the environment variable
    assert configure_runtime(_cfg(0)) == 5
    assert mindspore.get_context("runtime_num_threads") == 5
    assert configure_runtime(_cfg(1)) == 1               # the config wins over the environment
    assert mindspore.get_context("runtime_num_threads") == 1


def test_bad_thread_counts_are_user_errors(monkeypatch, restore_threads):
    from reid.runtime import configure_runtime
    if not compat.IS_MINDSPORE:
        pytest.skip("torch keeps its own thread setting")
    with pytest.raises(UserError, match="MODEL.NUM_THREADS"):
        configure_runtime(_cfg(-2))
    monkeypatch.setenv("REID_NUM_THREADS", "many")
    with pytest.raises(UserError, match="REID_NUM_THREADS"):
        configure_runtime(_cfg(0))


def test_helper_thread_setting_reaches_compat(restore_threads):
    """MODEL.JIT_HELPER_THREAD: where built graphs run (compat.jit's helper thread, or the calling thread)."""
    from reid.runtime import configure_runtime
    cfg = _cfg(0)
    try:
        cfg.MODEL.JIT_HELPER_THREAD = False
        configure_runtime(cfg)
        assert compat.jit._state["helper_thread"] is False
        cfg.MODEL.JIT_HELPER_THREAD = True
        configure_runtime(cfg)
        assert compat.jit._state["helper_thread"] is True
    finally:
        compat.jit.set_helper_thread(True)
