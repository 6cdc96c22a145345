"""compat.checkpoint: torch-format files without torch, both directions, a restricted unpickler, atomic
writes, module state dicts, and clear errors for files that are not (intact) checkpoints."""
import collections
import io
import os
import pickle
import re
import zipfile

import numpy as np
import pytest

from tests.crossenv import run_cases


def _tree(seed):
    rng = np.random.RandomState(seed)
    strided = rng.randn(4, 6).astype(np.float32)[:, ::2]          # non-contiguous on purpose
    return collections.OrderedDict([
        ("model", collections.OrderedDict([
            ("conv.weight", rng.randn(4, 3, 3, 3).astype(np.float32)),
            ("bn.num_batches_tracked", np.array(12, np.int64)),
            ("half", rng.randn(5).astype(np.float16)),
            ("double", rng.randn(2, 2)),
            ("ints", rng.randint(-9, 9, (3,)).astype(np.int32)),
            ("bytes", np.arange(5, dtype=np.uint8)),
            ("mask", np.array([True, False, True])),
            ("empty", np.zeros((0, 3), np.float32)),
            ("strided", strided),
        ])),
        ("optimizer", {"state": {0: {"momentum_buffer": rng.randn(3).astype(np.float32)}},
                       "param_groups": [{"lr": 0.04, "momentum": 0.9, "nesterov": False, "params": [0],
                                         "name": "base"}]}),
        ("epoch", 7), ("best", 0.625), ("tag", "acl"), ("none", None), ("pair", (1, "two", [3.5])),
    ])


def _assert_tree_equal(got, expected, where="root"):
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got.keys()) == list(expected.keys()), where
        for key in expected:
            _assert_tree_equal(got[key], expected[key], "%s[%r]" % (where, key))
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            _assert_tree_equal(a, b, "%s[%d]" % (where, i))
    elif isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape, where
        assert np.array_equal(got, expected), where
    else:
        assert type(got) is type(expected) and got == expected, where


# -- cases run under a given backend --------------------------------------------------------------------
def case_round_trip(tmp):
    """save/load round trip, and a module state_dict -> file -> fresh module with identical outputs."""
    import compat
    from compat import nn
    path = os.path.join(tmp, "tree-%s.pth" % compat.BACKEND)
    compat.checkpoint.save(_tree(0), path)
    back = compat.checkpoint.load(path)
    _assert_tree_equal(back, _tree(0))

    compat.manual_seed(0)
    src, dst = _Net(nn), _Net(nn)
    compat.checkpoint.export_pth(compat.checkpoint.state_dict(src), os.path.join(tmp, "net.pth"))
    result = compat.checkpoint.load_state_dict(dst, compat.checkpoint.load(os.path.join(tmp, "net.pth")))
    x = compat.as_tensor(np.random.RandomState(1).randn(2, 3, 6, 6).astype(np.float32))
    same = np.array_equal(compat.to_numpy(src(x)), compat.to_numpy(dst(x)))
    return dict(same_output=same, keys=list(compat.checkpoint.state_dict(dst)), missing=list(result.missing_keys),
                counter=int(compat.to_numpy(dst.norm.num_batches_tracked)))


def _Net(nn):
    import compat

    class Norm(nn.Module):  # the project's norm layers keep torch's buffers
        def __init__(self, c):
            super().__init__()
            self.weight = nn.Parameter(compat.torch.ones(c))
            self.bias = nn.Parameter(compat.torch.zeros(c))
            self.register_buffer("running_mean", compat.torch.zeros(c))
            self.register_buffer("running_var", compat.torch.ones(c))
            self.register_buffer("num_batches_tracked", compat.torch.tensor(0, dtype=compat.torch.long))

        def forward(self, x):
            return compat.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, "eval")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.norm = Norm(4)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.norm(self.conv(x)).mean((2, 3)))

    net = Net()
    # distinct buffer values so the copy is visible
    compat.assign_(net.norm.running_mean, compat.as_tensor(np.random.RandomState(3).randn(4).astype(np.float32)))
    compat.assign_(net.norm.num_batches_tracked, compat.as_tensor(np.array([5], np.int64)).reshape(()))
    return net


def case_module_errors():
    """load_state_dict's messages for missing / unexpected keys and shape mismatches."""
    import compat
    net = _Net(compat.nn)
    state = compat.checkpoint.state_dict(net)
    messages = {}
    bad = collections.OrderedDict(state)
    del bad["fc.bias"]
    bad["extra.weight"] = np.zeros(2, np.float32)
    bad["conv.weight"] = np.zeros((4, 3, 5, 5), np.float32)
    try:
        compat.checkpoint.load_state_dict(net, bad)
    except compat.UserError as exc:
        messages["strict"] = str(exc)
    bad["conv.weight"] = state["conv.weight"]
    result = compat.checkpoint.load_state_dict(net, bad, strict=False)
    return dict(messages=messages, nonstrict=(list(result.missing_keys), list(result.unexpected_keys)),
                keys=list(state))


def case_export_mindspore(tmp):
    import compat
    path = os.path.join(tmp, "model.ckpt")
    state = collections.OrderedDict([("conv.weight", np.arange(6, dtype=np.float32).reshape(2, 3)),
                                     ("bn.num_batches_tracked", np.array(3, np.int64))])
    try:
        compat.checkpoint.export_mindspore_ckpt(state, path)
    except compat.UserError as exc:
        return dict(error=str(exc))
    import mindspore
    loaded = mindspore.load_checkpoint(path)
    return dict(names=sorted(loaded), values={k: v.asnumpy() for k, v in loaded.items()})


def case_torch_writes(tmp):
    """Real torch.save of a model state_dict + optimizer state + extras; the numbers it wrote."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(2, 3, 6, 6)).sum().backward()
        opt.step()
    view = torch.arange(24, dtype=torch.float64).reshape(4, 6)[1:, ::2]   # storage offset + strides
    # metric: a numpy scalar, as fast-reid's checkpointer saves it (pickled through _codecs.encode)
    obj = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 9, "view": view,
           "half": torch.randn(4).half(), "flags": torch.tensor([True, False]), "metric": np.float64(45.25)}
    torch.save(obj, os.path.join(tmp, "torch.pth"))
    torch.save({"a": torch.ones(2)}, os.path.join(tmp, "legacy.pth"), _use_new_zipfile_serialization=False)
    return dict(model={k: v.numpy().copy() for k, v in obj["model"].items()},
                buffers={k: v["momentum_buffer"].numpy().copy() for k, v in obj["optimizer"]["state"].items()},
                groups=[{k: v for k, v in g.items()} for g in obj["optimizer"]["param_groups"]],
                view=view.numpy().copy(), half=obj["half"].numpy().copy())


def case_compat_reads_torch_file(tmp):
    import compat
    loaded = compat.checkpoint.load(os.path.join(tmp, "torch.pth"))
    return dict(model=dict(loaded["model"]), model_type=type(loaded["model"]).__name__,
                buffers={k: v["momentum_buffer"] for k, v in loaded["optimizer"]["state"].items()},
                groups=loaded["optimizer"]["param_groups"], epoch=loaded["epoch"], view=loaded["view"],
                half=loaded["half"], flags=loaded["flags"], metric=loaded["metric"])


def case_torch_reads_our_file(tmp):
    import torch
    loaded = torch.load(os.path.join(tmp, "ours.pth"), weights_only=True)

    def to_numpy(obj):
        if isinstance(obj, dict):
            return type(obj)((k, to_numpy(v)) for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(to_numpy(v) for v in obj)
        return obj.numpy() if isinstance(obj, torch.Tensor) else obj
    return to_numpy(loaded)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One torch process (writes torch files, reads ours, runs the backend cases) and the MindSpore cases."""
    import compat
    tmp = str(tmp_path_factory.mktemp("ckpt"))
    compat.checkpoint.save(_tree(0), os.path.join(tmp, "ours.pth"))   # written by the active backend, no torch
    names = ["round_trip", "module_errors", "export_ms"]
    common = [("tests.test_compat_checkpoint:case_%s" % n, dict(tmp=tmp)) for n in ("round_trip", "export_mindspore")]
    common.insert(1, ("tests.test_compat_checkpoint:case_module_errors", {}))
    torch_side = run_cases("torch", [("tests.test_compat_checkpoint:case_torch_writes", dict(tmp=tmp)),
                                     ("tests.test_compat_checkpoint:case_torch_reads_our_file", dict(tmp=tmp))]
                           + common)
    ms = run_cases("mindspore", common + [("tests.test_compat_checkpoint:case_compat_reads_torch_file",
                                           dict(tmp=tmp))])
    return dict(written=torch_side[0], torch_read=torch_side[1], torch=dict(zip(names, torch_side[2:])),
                mindspore=dict(zip(names, ms[:3])), ms_read=ms[3])


@pytest.mark.parity
@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_round_trip_and_module_state(shared, backend):
    got = shared[backend]["round_trip"]
    assert got["same_output"] and got["missing"] == [] and got["counter"] == 5
    assert got["keys"] == ["conv.weight", "conv.bias", "norm.weight", "norm.bias", "norm.running_mean",
                           "norm.running_var", "norm.num_batches_tracked", "fc.weight", "fc.bias"]


@pytest.mark.parity
def test_state_dict_keys_identical_on_both_backends(shared):
    assert shared["mindspore"]["round_trip"]["keys"] == shared["torch"]["round_trip"]["keys"]
    assert shared["mindspore"]["module_errors"]["keys"] == shared["torch"]["module_errors"]["keys"]


@pytest.mark.parity
@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_load_state_dict_errors_name_the_keys(shared, backend):
    got = shared[backend]["module_errors"]
    msg = got["messages"]["strict"]
    assert "missing keys: fc.bias" in msg and "unexpected keys: extra.weight" in msg
    assert "shape mismatch: conv.weight (expected (4, 3, 3, 3), got (4, 3, 5, 5))" in msg
    assert "\n" not in msg
    assert got["nonstrict"] == (["fc.bias"], ["extra.weight"])


@pytest.mark.parity
def test_torch_written_pth_loads_exactly_without_torch(shared):
    ref, got = shared["written"], shared["ms_read"]
    assert got["model_type"] == "OrderedDict" and list(got["model"]) == list(ref["model"])
    for key, value in ref["model"].items():
        assert got["model"][key].dtype == value.dtype and np.array_equal(got["model"][key], value), key
    assert sorted(got["buffers"]) == sorted(ref["buffers"]) and len(ref["buffers"]) == 6
    for key, value in ref["buffers"].items():
        assert np.array_equal(got["buffers"][key], value)
    assert got["groups"] == ref["groups"] and got["epoch"] == 9
    assert np.array_equal(got["view"], ref["view"]) and got["view"].dtype == np.float64
    assert np.array_equal(got["half"], ref["half"]) and got["half"].dtype == np.float16
    assert got["flags"].tolist() == [True, False]
    assert got["metric"] == 45.25


@pytest.mark.parity
def test_our_file_loads_in_real_torch_weights_only(shared):
    _assert_tree_equal(shared["torch_read"], _tree(0))


@pytest.mark.parity
def test_export_mindspore_ckpt(shared):
    got = shared["mindspore"]["export_ms"]
    assert got["names"] == ["bn.num_batches_tracked", "conv.weight"]
    assert np.array_equal(got["values"]["conv.weight"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert int(got["values"]["bn.num_batches_tracked"]) == 3
    assert "needs the mindspore backend" in shared["torch"]["export_ms"]["error"]


# -- in-process tests (active backend; the loader itself never imports torch) -----------------------------
def _zip_with_pickle(path, payload):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", "3\n")


class _Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


@pytest.mark.parametrize("kind", ["system", "eval"])
@pytest.mark.parametrize("container", ["zip", "raw"])
def test_malicious_pickle_is_refused_and_has_no_effect(tmp_path, kind, container):
    import compat
    marker = tmp_path / "pwned"
    if kind == "system":
        evil = _Evil(os.system, "touch %s" % marker)
        name = r"%s\.system" % os.system.__module__
    else:
        evil = _Evil(eval, "open(%r, 'w').close()" % str(marker))
        name = r"(builtins|__builtin__)\.eval"  # protocol 2 writes the python 2 name
    payload = pickle.dumps({"model": {"w": [evil]}}, protocol=2)
    path = tmp_path / "evil.pth"
    if container == "zip":
        _zip_with_pickle(path, payload)
    else:
        path.write_bytes(payload)
    with pytest.raises(compat.UserError) as info:
        compat.checkpoint.load(path)
    assert re.search(r"^refusing to unpickle global %s in %s: not a tensor checkpoint" % (name, re.escape(str(path))),
                     str(info.value))
    assert not marker.exists()


def _saved(tmp_path):
    import compat
    path = tmp_path / "good.pth"
    compat.checkpoint.save(_tree(1), path)
    return path


def test_corrupt_and_foreign_files_give_one_line_errors(tmp_path):
    import compat
    good = _saved(tmp_path).read_bytes()
    cases = {}
    cases["truncated"] = good[: len(good) // 2]
    flipped = bytearray(good)
    data_at = good.index(b"archive/data/0") + len("archive/data/0") + 80   # inside the first storage's bytes
    flipped[data_at] ^= 0xFF
    cases["flipped"] = bytes(flipped)
    cases["text"] = b"model weights, honest\n"
    cases["empty"] = b""
    cases["npy"] = _npy_bytes()
    cases["zip_without_pickle"] = _zip_bytes({"readme.txt": b"hello"})
    for name, content in cases.items():
        path = tmp_path / ("%s.pth" % name)
        path.write_bytes(content)
        with pytest.raises(compat.UserError) as info:
            compat.checkpoint.load(path)
        msg = str(info.value)
        assert str(path) in msg and "\n" not in msg, (name, msg)
    with pytest.raises(compat.UserError, match="does not exist"):
        compat.checkpoint.load(tmp_path / "missing.pth")


def test_storage_bounds_are_checked(tmp_path):
    """A well-formed zip whose tensor claims more elements than its storage holds."""
    import compat
    path = _saved(tmp_path)
    with zipfile.ZipFile(path) as zf:
        records = {n: zf.read(n) for n in zf.namelist()}
    payload = records["archive/data.pkl"]
    # conv.weight is (4, 3, 3, 3) = 108 elements; claim a first dim of 9 (243 elements)
    assert payload.count(b"K\x04K\x03K\x03K\x03") == 1
    records["archive/data.pkl"] = payload.replace(b"K\x04K\x03K\x03K\x03", b"K\x09K\x03K\x03K\x03")
    path.write_bytes(_zip_bytes(records))
    with pytest.raises(compat.UserError, match="truncated or corrupt"):
        compat.checkpoint.load(path)


def test_legacy_torch_file_is_refused(tmp_path):
    import compat
    # the start of a pre-1.6 torch.save file: the pickled legacy magic number, then the protocol version
    path = tmp_path / "legacy.pth"
    path.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2))
    with pytest.raises(compat.UserError, match="legacy .*non-zip"):
        compat.checkpoint.load(path)


@pytest.mark.parity
def test_legacy_file_written_by_real_torch_is_refused(shared, tmp_path_factory):
    import compat
    path = [p for p in tmp_path_factory.getbasetemp().glob("ckpt*/legacy.pth")][0]
    with pytest.raises(compat.UserError, match="legacy"):
        compat.checkpoint.load(path)


def test_atomic_save_keeps_the_old_file(tmp_path, monkeypatch):
    import compat
    from compat import checkpoint
    path = _saved(tmp_path)
    before = path.read_bytes()
    written = []

    def failing_write(zf, fh, storage):
        if written:
            raise OSError("disk full (simulated)")
        written.append(storage.key)
        original(zf, fh, storage)

    original = checkpoint._write_storage
    monkeypatch.setattr(checkpoint, "_write_storage", failing_write)
    with pytest.raises(OSError, match="simulated"):
        compat.checkpoint.save(_tree(2), path)
    assert written == ["0"]                       # it did fail midway, after writing data
    assert path.read_bytes() == before            # the previous checkpoint is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.pth"]   # no temp file left behind
    _assert_tree_equal(compat.checkpoint.load(path), _tree(1))
    with pytest.raises(compat.UserError, match="cannot save set"):
        compat.checkpoint.save({"bad": {1, 2}}, path)
    assert path.read_bytes() == before


def _npy_bytes():
    buf = io.BytesIO()
    np.save(buf, np.ones(3))
    return buf.getvalue()


def _zip_bytes(records):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in records.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_files_follow_the_umask(tmp_path, umask):
    """A checkpoint is written to a temporary file (owner-only) and moved into place: it ends with the mode a
    file created with open() gets, 0o666 less the umask."""
    from compat import checkpoint
    previous = os.umask(umask)
    try:
        assert checkpoint.new_file_mode() == 0o666 & ~umask
        path = str(tmp_path / "state.pth")
        checkpoint.save({"w": np.zeros(3, np.float32)}, path)
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    finally:
        os.umask(previous)
