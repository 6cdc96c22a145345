"""Batches from a numpy dataset through the backend's own loader.

    loader = make_loader(dataset, batch_sampler, num_workers=0, to_tensor=True)
    for batch in loader: ...        # one pass per `iter(loader)`; an infinite sampler streams forever

`dataset[i]` returns a dict of numpy arrays / numbers / str; `batch_sampler` is an iterable of index lists
(iterated afresh for every pass). A batch is the dict of the stacked values (str values stay lists), as backend
tensors when `to_tensor` (numpy otherwise). Batches come out in sampler order for any `num_workers`.

torch: `torch.utils.data.DataLoader(batch_sampler=..., num_workers=..., collate_fn=...)`.
MindSpore: `GeneratorDataset` streaming the index lists, then `map` loading and collating a whole batch per
row in `num_workers` processes (order-preserving); the batch crosses the process boundary as one pickled byte
row (pickle protocol 5, array data out of band: one copy in the worker, none in the main process), which
keeps str values and arbitrary keys without a fixed column schema.
On both, an exception raised by `dataset[i]` in a worker is caught there, shipped back, and raised again in the
main process with its original type and message (the worker traceback is attached as the cause).
Workers stop when the pass ends or the iterator is dropped.
"""
import itertools
import pickle
import traceback

import numpy as np

import compat as _c
from compat.errors import UserError


class WorkerError(RuntimeError):
    """Carries the traceback text of an exception raised inside a loader worker."""


def collate(items):
    """Stack a list of item dicts into one batch dict (numpy arrays; str values as lists)."""
    if not items:
        raise UserError("the batch sampler produced an empty batch; every batch needs at least one index")
    first = items[0]
    if not isinstance(first, dict):
        raise UserError("dataset items must be dicts of numpy arrays / numbers / str, got %s"
                        % type(first).__name__)
    batch = {}
    for key in first:
        values = []
        for item in items:
            if not isinstance(item, dict) or key not in item:
                raise UserError("dataset items disagree on their keys (%r is missing from one); return the same "
                                "keys for every index" % (key,))
            values.append(item[key])
        if all(isinstance(v, str) for v in values):
            batch[key] = values
        elif all(isinstance(v, (np.ndarray, np.generic, int, float, bool)) for v in values):
            try:
                batch[key] = np.stack([np.asarray(v) for v in values])
            except ValueError as exc:
                raise UserError("cannot stack dataset values of key %r into a batch (%s); give every item the "
                                "same shape" % (key, exc)) from None
        else:
            kinds = sorted({type(v).__name__ for v in values})
            raise UserError("dataset value %r has unsupported type %s; use numpy arrays, numbers or str"
                            % (key, "/".join(kinds)))
    return batch


def _failure(exc):
    return ("error", type(exc), str(exc), traceback.format_exc())


def _load_batch(dataset, indices):
    """('ok', batch) or ('error', type, message, traceback) -- run inside a worker."""
    try:
        return ("ok", collate([dataset[int(i)] for i in indices]))
    except Exception as exc:  # shipped to the main process and raised there
        return _failure(exc)


def _raise_failure(result):
    _, exc_type, message, worker_tb = result
    try:
        exc = exc_type(message)
    except Exception:
        exc = RuntimeError("%s: %s" % (getattr(exc_type, "__name__", exc_type), message))
    raise exc from WorkerError("raised in a data loader worker:\n" + worker_tb)


def _check_indices(batch):
    try:
        indices = np.asarray(batch, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise UserError("the batch sampler must yield lists of integer indices, got %r" % (batch,)) from None
    if indices.size == 0:
        raise UserError("the batch sampler produced an empty batch; every batch needs at least one index")
    return indices


class Loader:
    def __init__(self, dataset, batch_sampler, num_workers=0, to_tensor=True):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise UserError("make_loader needs a dataset with __len__ and __getitem__, got %s"
                            % type(dataset).__name__)
        if isinstance(num_workers, bool) or int(num_workers) != num_workers or num_workers < 0:
            raise UserError("num_workers (DATALOADER.NUM_WORKERS) must be an integer >= 0, got %r" % (num_workers,))
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.num_workers, self.to_tensor = int(num_workers), bool(to_tensor)

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        run = _ms_batches if _c.IS_MINDSPORE else _torch_batches
        for result in run(self.dataset, self.batch_sampler, self.num_workers):
            if result[0] != "ok":
                _raise_failure(result)
            yield self._finish(result[1])

    def _finish(self, batch):
        if not self.to_tensor:
            return batch
        return {k: v if isinstance(v, list) else _as_tensor(v) for k, v in batch.items()}


def _as_tensor(value):
    if _c.IS_MINDSPORE:
        # MindSpore cannot make a tensor from an array that views a foreign buffer (unpack's output)
        return _c.as_tensor(value if value.flags["OWNDATA"] else np.array(value))
    if not _c.is_tensor(value):
        return _c.as_tensor(value)
    from compat.device import to_device
    return to_device(value)


def make_loader(dataset, batch_sampler, num_workers=0, to_tensor=True):
    return Loader(dataset, batch_sampler, num_workers, to_tensor)


# -- torch ------------------------------------------------------------------------------------------------
class _GuardedItems:
    """Dataset view whose items are either the item or a failure record (so worker errors keep their type)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            return ("ok", self.dataset[index])
        except Exception as exc:
            return _failure(exc)


def _torch_collate(results):
    for result in results:
        if result[0] != "ok":
            return result
    try:
        batch = collate([r[1] for r in results])
    except Exception as exc:
        return _failure(exc)
    torch = _c.torch
    # torch tensors travel from workers through shared memory; numpy arrays would be pickled
    return ("ok", {k: v if isinstance(v, list) else torch.from_numpy(v) for k, v in batch.items()})


class _CheckedBatches:
    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def __iter__(self):
        for batch in self.batch_sampler:
            yield _check_indices(batch).tolist()


def _torch_batches(dataset, batch_sampler, num_workers):
    loader = _c.torch.utils.data.DataLoader(_GuardedItems(dataset), batch_sampler=_CheckedBatches(batch_sampler),
                                            num_workers=num_workers, collate_fn=_torch_collate)
    iterator = iter(loader)
    try:
        for result in iterator:
            yield result
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:  # do not wait for garbage collection to stop the worker processes
            shutdown()
        del iterator


# -- MindSpore --------------------------------------------------------------------------------------------
def pack(obj):
    """obj -> one uint8 array: [count, sizes..., pickle header, raw array buffers...] (pickle protocol 5 with
    out-of-band buffers, so array data is copied once here and not at all by `unpack`)."""
    buffers = []
    header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(header)] + [b.raw() for b in buffers]
    sizes = np.array([len(parts)] + [p.nbytes for p in parts], dtype=np.int64)
    out = np.empty(sizes.nbytes + int(sizes[1:].sum()), dtype=np.uint8)
    out[:sizes.nbytes] = sizes.view(np.uint8)
    at = sizes.nbytes
    for part in parts:
        out[at:at + part.nbytes] = np.frombuffer(part, dtype=np.uint8)
        at += part.nbytes
    return out


def unpack(row):
    """Inverse of `pack`; the arrays it returns are views into `row`."""
    row = np.ascontiguousarray(row, dtype=np.uint8)
    count = int(row[:8].view(np.int64)[0])
    sizes = row[8:8 * (count + 1)].view(np.int64)
    views, at = [], 8 * (count + 1)
    for size in sizes:
        views.append(memoryview(row[at:at + int(size)]))
        at += int(size)
    return pickle.loads(views[0], buffers=views[1:])


class _BatchRow:
    """map() operation: a row of indices -> one row holding the packed ('ok', batch) / failure record."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __call__(self, indices):
        result = _load_batch(self.dataset, indices)
        try:
            return pack(result)
        except Exception as exc:  # e.g. an exception type that cannot be pickled
            return pack(("error", RuntimeError, "%s: %s" % (type(exc).__name__, exc),
                         result[-1] if result[0] == "error" else ""))


class _IndexRows:
    """GeneratorDataset source: the sampler's index lists, one row each; a sampler error ends the stream and is
    raised by the main loop after the batches before it (MindSpore would rewrap it otherwise)."""

    def __init__(self, batches, errors):
        self.batches, self.errors = batches, errors

    def __call__(self):
        try:
            for batch in self.batches:
                yield (_check_indices(batch),)
        except Exception as exc:
            self.errors.append(exc)


def _row_megabytes(dataset, batch):
    """Shared-memory slot size (MB) for one packed batch, from the first item: MindSpore's worker queues copy a
    row through shared memory only when it fits (else it pickles it through a pipe, several times slower), and
    allocate 6 slots of this size per worker, so guessing large costs memory."""
    item = dataset[int(_check_indices(batch)[0])]
    if not isinstance(item, dict):
        return 6  # collate will report the bad item
    per_item = sum(np.asarray(v).nbytes for v in item.values() if not isinstance(v, str))
    return int(min(max(np.ceil(1.25 * per_item * len(batch) / 2 ** 20) + 1, 6), 2048))


def _ms_batches(dataset, batch_sampler, num_workers):
    import mindspore.dataset as ds
    errors = []
    batches = iter(batch_sampler)
    try:
        first = next(batches)
    except StopIteration:
        return
    max_rowsize = _row_megabytes(dataset, first) if num_workers > 0 else 6
    # A small prefetch keeps memory near torch's (2 batches per worker) instead of MindSpore's 16 rows per op.
    ds.config.set_prefetch_size(max(2, 2 * num_workers))
    source = ds.GeneratorDataset(_IndexRows(itertools.chain([first], batches), errors), column_names=["indices"],
                                 shuffle=False, num_parallel_workers=1, python_multiprocessing=False)
    rows = source.map(_BatchRow(dataset), input_columns=["indices"], output_columns=["batch"],
                      num_parallel_workers=max(num_workers, 1), python_multiprocessing=num_workers > 0,
                      max_rowsize=max_rowsize)
    iterator = rows.create_tuple_iterator(num_epochs=1, output_numpy=True)
    try:
        for (row,) in iterator:
            yield unpack(row)
        if errors:
            raise errors[0]
    finally:
        stop = getattr(iterator, "stop", None)
        if stop is not None:  # ends the pipeline and its worker processes now, not at garbage collection
            stop()
        del iterator


__all__ = ["make_loader", "Loader", "collate", "WorkerError"]
