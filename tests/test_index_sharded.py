"""tools/index.py --nproc 2 on the active backend's launcher (torchrun on torch, MindSpore's scheduler + workers
on MindSpore), as tests/test_distributed.py runs data-parallel training: the sharded update of an index equals
the single-process update (same paths, ids, sizes, times; features to 1e-6), and a rank that dies fails the
run with one line naming it, the previous index intact and no shard left behind.

Each run starts 2 ranks (and MindSpore's scheduler) that import the framework: tens of seconds on a loaded
2-core machine, more on MindSpore."""
import os
import shutil

import numpy as np
import pytest

from compat.errors import UserError
from tests.test_distributed import _free_port, one_cluster_at_a_time
from tests.test_retrieval import DEMO, _one_torch_thread, opts_for  # noqa: F401
from tests.test_retrieval_milvus import acl_index, world  # noqa: F401
from tests.test_retrieval_tools import tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "_index_child.py")


def _args(world, folder, output, *extra):  # noqa: F811
    return ["--gallery", folder, "--output", output, "--config-file", DEMO, "--engine", "eager", "--no-progress"] \
        + list(extra) + opts_for(world, "acl")


@pytest.fixture
def changed(world, acl_index, tmp_path):  # noqa: F811
    """The gallery copied (times kept) with the acl index beside it as the previous index; then 40 images
    touched (to extract again: a full batch for rank 0, 8 images for rank 1) and 2 removed."""
    folder = tmp_path / "g"
    shutil.copytree(world["gallery"], str(folder), copy_function=shutil.copy2)
    names = sorted(os.listdir(str(folder)))
    for name in names[10:50]:
        os.utime(str(folder / name), ns=(10 ** 18, 10 ** 18))
    for name in names[60:62]:
        os.remove(str(folder / name))
    return str(folder)


def test_sharded_update_equals_the_single_process_update(world, acl_index, changed, tmp_path, capfd):  # noqa: F811
    from reid.deploy.gallery import load_index
    single, sharded = str(tmp_path / "single.npz"), str(tmp_path / "sharded.npz")
    for path in (single, sharded):
        shutil.copy(acl_index, path)
    tool("index").main(_args(world, changed, single))
    with one_cluster_at_a_time():
        tool("index").main(_args(world, changed, sharded, "--nproc", "2", "--master-port", str(_free_port())))
    a, b = load_index(single), load_index(sharded)
    assert a.paths == b.paths and len(b) == 67
    for key in ("pids", "camids", "sizes", "mtimes"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key
    gap = np.abs(a.features - b.features).max()
    print("sharded against single process: features within %.1e" % gap)
    assert gap <= 1e-6
    assert b.meta["model"]["weights_sha256"] == a.meta["model"]["weights_sha256"]
    assert sorted(os.listdir(str(tmp_path))) == ["g", "sharded.npz", "single.npz"]      # no shard folder left
    printed = capfd.readouterr().out       # the ranks print to the same file descriptors
    assert printed.count("40 extracted, 27 unchanged, 2 removed") == 2, printed


def test_a_dead_rank_fails_the_run_with_one_line_and_the_index_intact(world, acl_index, changed, tmp_path,  # noqa: F811
                                                                       monkeypatch):
    from reid.deploy.sharded import launch_index, shard_folder
    output = str(tmp_path / "g.npz")
    shutil.copy(acl_index, output)
    before = open(output, "rb").read()
    monkeypatch.setenv("REID_TEST_DIE_RANK", "1")
    index = tool("index")
    with one_cluster_at_a_time():
        argv = _args(world, changed, output, "--nproc", "2", "--master-port", str(_free_port()))
        args = index.build_parser().parse_intermixed_args(argv)
        spec = index.store_of(args)
        with pytest.raises(UserError) as err:
            launch_index(CHILD, argv, args, shard_folder(output, spec), lambda: index.unchanged(args, spec))
    message = str(err.value)
    assert "\n" not in message and message.startswith("distributed extraction failed: rank 1 of 2 died"), message
    assert "%s is as it was" % output in message
    assert open(output, "rb").read() == before
    assert sorted(os.listdir(str(tmp_path))) == ["g", "g.npz"]


@pytest.mark.skipif(os.environ.get("REID_BACKEND", "mindspore") != "torch",
                    reason="torch's init_process_group wraps the error hook (compat.distributed keeps it working)")
def test_a_ranks_bad_input_is_its_one_line_error(world, acl_index, changed, tmp_path, capfd):  # noqa: F811
    """--strict with a truncated image in rank 1's shard: rank 1 prints its one-line error, the run fails
    naming rank 1, the index is as it was."""
    output = str(tmp_path / "g.npz")
    shutil.copy(acl_index, output)
    before = open(output, "rb").read()
    bad = os.path.join(changed, sorted(os.listdir(changed))[45])         # rank 1 extracts images 42..49
    data = open(bad, "rb").read()
    open(bad, "wb").write(data[:len(data) // 2])
    with pytest.raises(UserError, match="distributed extraction failed: rank 1 of 2 died"), one_cluster_at_a_time():
        tool("index").main(_args(world, changed, output, "--strict", "--nproc", "2", "--master-port",
                                 str(_free_port())))
    assert "error: cannot read image %s: truncated JPEG" % bad in capfd.readouterr().err
    assert open(output, "rb").read() == before
