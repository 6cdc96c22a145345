"""compat.data.make_loader on both backends with 0 and 2 workers: sampler order, identical batches for any
worker count and backend, worker errors surfacing with their message, re-iteration, infinite samplers,
and no worker process left behind."""
import gc
import itertools
import os
import time

import numpy as np
import pytest

from tests.crossenv import run_cases

BATCHES = [[3, 1, 4], [1, 5], [9, 2, 6], [5, 3, 5], [8], [9, 7, 0]]


class TinySet:
    """Backend-neutral dataset: dict of numpy arrays / ints / str; optionally one corrupt index."""

    def __init__(self, n=10, bad=None):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            import compat
            raise compat.UserError("corrupt image /x/y%d.jpg (cannot decode); remove it or fix the dataset" % i)
        rng = np.random.RandomState(i)
        return {"images": rng.rand(3, 4, 2).astype(np.float32) * 255, "targets": i * 10, "camids": np.int64(i % 3),
                "img_paths": "/data/img_%02d.jpg" % i}


class Forever:
    """An infinite batch sampler (re-iterable: every pass starts again)."""

    def __iter__(self):
        for k in itertools.count():
            yield [k % 10, (3 * k + 1) % 10]


def _children():
    me, out = str(os.getpid()), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/stat" % pid) as fh:
                    if fh.read().rsplit(") ", 1)[1].split()[1] == me:
                        out.add(pid)
            except (OSError, IndexError):
                pass
    return out


def _plain(batch):
    import compat
    return {k: v if isinstance(v, list) else compat.to_numpy(v) for k, v in batch.items()}


def case_loader(num_workers):
    import compat
    from compat.data import make_loader
    before = _children()
    out = dict(backend=compat.BACKEND)
    loader = make_loader(TinySet(), BATCHES, num_workers=num_workers)
    first = list(loader)
    out["tensor_types"] = sorted({type(v).__name__ for b in first for v in b.values()})
    out["is_tensor"] = all(compat.is_tensor(v) for b in first for k, v in b.items() if k != "img_paths")
    out["epochs"] = [[_plain(b) for b in first], [_plain(b) for b in loader]]   # iterator re-created
    out["len"] = len(loader)

    stream = iter(make_loader(TinySet(), Forever(), num_workers=num_workers, to_tensor=False))
    out["stream"] = [next(stream)["targets"].tolist() for _ in range(7)]
    out["workers_while_streaming"] = len(_children() - before)
    del stream

    try:
        list(make_loader(TinySet(bad=5), BATCHES, num_workers=num_workers))
        out["error"] = None
    except Exception as exc:  # what the user would see
        out["error"] = (type(exc).__name__, str(exc))
    gc.collect()
    deadline = time.time() + 10
    while _children() - before and time.time() < deadline:
        time.sleep(0.1)
    out["leftover"] = sorted(_children() - before)
    return out


WORKERS = [0, 2]


@pytest.fixture(scope="module")
def results():
    calls = [("tests.test_compat_data:case_loader", dict(num_workers=w)) for w in WORKERS]
    return dict(torch=run_cases("torch", calls), mindspore=run_cases("mindspore", calls))


def _expected():
    items = TinySet()
    return [{"images": np.stack([items[i]["images"] for i in b]), "targets": np.array([10 * i for i in b]),
             "camids": np.array([i % 3 for i in b]), "img_paths": ["/data/img_%02d.jpg" % i for i in b]}
            for b in BATCHES]


BACKENDS = ["mindspore", "torch"]


@pytest.mark.parity
@pytest.mark.parametrize("workers", range(len(WORKERS)), ids=["w%d" % w for w in WORKERS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_in_sampler_order_and_identical(results, backend, workers):
    got = results[backend][workers]
    assert got["backend"] == backend and got["is_tensor"] and got["len"] == len(BATCHES)
    for epoch in got["epochs"]:
        assert len(epoch) == len(BATCHES)
        for batch, want in zip(epoch, _expected()):
            assert sorted(batch) == sorted(want)
            assert batch["img_paths"] == want["img_paths"]
            for key in ("images", "targets", "camids"):
                assert batch[key].dtype == want[key].dtype and np.array_equal(batch[key], want[key]), key


@pytest.mark.parity
@pytest.mark.parametrize("workers", range(len(WORKERS)), ids=["w%d" % w for w in WORKERS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_sampler_streams_in_order(results, backend, workers):
    got = results[backend][workers]
    assert got["stream"] == [[10 * (k % 10), 10 * ((3 * k + 1) % 10)] for k in range(7)]
    if WORKERS[workers] > 0:
        assert got["workers_while_streaming"] >= WORKERS[workers]   # really ran in worker processes


@pytest.mark.parity
@pytest.mark.parametrize("workers", range(len(WORKERS)), ids=["w%d" % w for w in WORKERS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_worker_error_keeps_type_and_message_and_no_worker_leaks(results, backend, workers):
    got = results[backend][workers]
    assert got["error"] == ("UserError", "corrupt image /x/y5.jpg (cannot decode); remove it or fix the dataset")
    assert got["leftover"] == []


def test_loader_rejects_bad_input():
    import compat
    from compat.data import make_loader
    with pytest.raises(compat.UserError, match="num_workers"):
        make_loader(TinySet(), BATCHES, num_workers=-1)
    with pytest.raises(compat.UserError, match="__len__ and __getitem__"):
        make_loader(object(), BATCHES)
    with pytest.raises(compat.UserError, match="empty batch"):
        list(make_loader(TinySet(), [[1], []]))
