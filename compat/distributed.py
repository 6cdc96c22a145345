"""Data-parallel collectives on the framework's own distributed engine (docs/architecture.md#distributed).

    group = compat.distributed.init()         # from the launcher's environment variables; world 1 without them
    group.rank, group.world_size, group.is_main
    loss, terms, grads = group.average_step(loss, terms, grads)   # the mean over ranks (one all-reduce)
    group.broadcast_(tensors)                 # rank 0's values everywhere (in place)
    group.barrier(); group.shutdown()

Which engine: torch runs `torch.distributed` (gloo on CPU, nccl with MODEL.DEVICE gpu) from torchrun's variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). MindSpore runs `mindspore.communication` (mccl on CPU,
nccl on GPU, hccl on Ascend) from its dynamic-networking variables (MS_ROLE=MS_WORKER, MS_WORKER_NUM,
MS_SCHED_HOST, MS_SCHED_PORT); one extra process with MS_ROLE=MS_SCHED (`run_scheduler`) forms the cluster.
Without those variables (or with a world of one) every call is a no-op that returns its input.

MindSpore facts this module is built on (on CPU, workers and scheduler on one machine; tests/test_distributed.py):
- `communication.init()` refuses PyNative ("PyNative mode is not supported in dynamic networking"), but that is
  a check made by init alone: with the context switched to GRAPH_MODE for the call and back to PYNATIVE after
  it, the process trains op by op, `compat.value_and_grad` included, and `ops.AllReduce` works both op by op
  and inside a `mindspore.jit` function. So averaging is one call after the gradients exist, whichever way
  they were computed (op by op or by a compiled step).
- `ops.Broadcast` fails op by op; a broadcast is an all-reduce (sum) of rank 0's values and zeros elsewhere,
  which is exact (x + 0 = x).
- The scheduler's init returns once every worker has registered, and the scheduler must then stay alive until
  the workers are done: a scheduler whose Python main returns right after init leaves the workers' registration
  unanswered and they fail with "The state of the cluster is error".
"""
import datetime
import os

import numpy as np

import compat as _c
from compat.errors import UserError

# seconds a collective may wait for the other ranks before it fails (torch's process-group timeout); the
# launcher stops the whole run much sooner when a rank dies (reid/engine/distributed.py)
DEFAULT_TIMEOUT_S = 1800
# exit status of a rank whose engine could not form the cluster (MindSpore on a busy machine: a worker whose
# registration or heartbeat is late is declared dead); the launcher starts the cluster again on it
EXIT_CLUSTER_FORMATION = 75
_state = {"group": None}


def requested_world_size():
    """The world size the launcher's variables ask for (1 without them); imports no framework."""
    if os.environ.get("MS_ROLE") == "MS_WORKER":
        return int(os.environ.get("MS_WORKER_NUM", "1"))
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank():
    """This process's index among the ranks on its machine (selects a GPU / Ascend device)."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("REID_LOCAL_RANK", "0")))


class Group:
    """The ranks of one data-parallel run. World size 1: every collective returns its input unchanged."""

    def __init__(self, rank=0, world_size=1):
        self.rank, self.world_size = int(rank), int(world_size)

    @property
    def is_main(self):
        return self.rank == 0

    def __repr__(self):
        return "Group(rank=%d, world_size=%d, backend=%s)" % (self.rank, self.world_size, _c.BACKEND)

    # ------------------------------------------------------------------ collectives
    def _all_reduce_sum(self, flat):
        """Sum of a 1-D float32 (float64) tensor over the ranks (a new tensor on MindSpore, in place on torch)."""
        if _c.IS_MINDSPORE:
            return _c.torch.cast_to_adapter_tensor(_ms_all_reduce()(flat))
        import torch.distributed as dist
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return flat

    def average(self, tensors):
        """The mean over ranks of each tensor in `tensors` (a list, same shapes on every rank): one all-reduce
        of their concatenation. None entries stay None."""
        tensors = list(tensors)
        if self.world_size == 1:
            return tensors
        torch = _c.torch
        present = [i for i, t in enumerate(tensors) if t is not None]
        shapes = [tuple(tensors[i].shape) for i in present]
        # float32, or float64 when any tensor is (the all-reduce then loses nothing)
        wide = any(tensors[i].dtype == torch.float64 for i in present)
        flat = torch.cat([tensors[i].flatten().to(torch.float64 if wide else torch.float32) for i in present], 0)
        flat = self._all_reduce_sum(flat) / float(self.world_size)
        out, start = list(tensors), 0
        for i, shape in zip(present, shapes):
            size = int(np.prod(shape)) if shape else 1
            piece = flat[start:start + size]
            out[i] = (piece.reshape(shape) if shape else piece[0]).to(tensors[i].dtype)
            start += size
        return out

    def average_step(self, loss, terms, grads):
        """(loss, terms, grads) of one training step averaged over the ranks, in one all-reduce: what one
        process computes with the ranks' chunks as its MODEL.NUM_SPLITS chunks (per-chunk losses, their mean,
        and the mean gradient)."""
        if self.world_size == 1:
            return loss, terms, grads
        keys = list(terms)
        # (0-d tensors go in flattened and come out indexed: one 1-d shape for every all-reduce input)
        scalars = [loss.flatten()] + [terms[k].flatten() for k in keys]
        out = self.average(scalars + list(grads))
        n = len(scalars)
        return out[0][0], {k: out[1 + i][0] for i, k in enumerate(keys)}, tuple(out[n:])

    def broadcast_(self, tensors):
        """Overwrite every tensor in `tensors` with rank 0's value (parameters and buffers at the start)."""
        tensors = [t for t in tensors if t is not None]
        if self.world_size == 1 or not tensors:
            return
        keep = 1.0 if self.rank == 0 else 0.0
        summed = self.average([t * keep for t in tensors])  # mean of (x0, 0, ..., 0) = x0 / N
        for t, s in zip(tensors, summed):
            _c.assign_(t, (s * float(self.world_size)).to(t.dtype))

    def max_abs_difference(self, tensors):
        """The largest |value - rank 0's value| over `tensors` and all ranks (0.0 when they agree)."""
        if self.world_size == 1:
            return 0.0
        torch = _c.torch
        flat = torch.cat([t.flatten().float() for t in tensors], 0)
        reference = self.average([flat * (1.0 if self.rank == 0 else 0.0)])[0] * float(self.world_size)
        gap = float(_c.to_numpy((flat - reference).abs()).max())
        # a max over ranks from a sum: every rank's gap in its own slot
        slots = np.zeros(self.world_size, np.float32)
        slots[self.rank] = gap
        gaps = self._all_reduce_sum(_c.as_tensor(slots))
        return float(_c.to_numpy(gaps).max())

    def chunk(self, batch):
        """This rank's contiguous chunk (dim 0) of every tensor in a batch dict: DataParallel's scatter."""
        if self.world_size == 1:
            return batch
        out = {}
        for key, value in batch.items():
            n = int(value.shape[0])
            if n % self.world_size:
                raise UserError("a batch of %d images cannot be split over %d processes; make SOLVER.IMS_PER_BATCH "
                                "and META.IMS_PER_DOMAIN multiples of --nproc x --nnodes" % (n, self.world_size))
            size = n // self.world_size
            out[key] = value[self.rank * size:(self.rank + 1) * size]
        return out

    def chunk_array(self, array):
        """This rank's chunk of one array (numpy or tensor), cut like `chunk`."""
        return self.chunk({"array": array})["array"]

    def barrier(self):
        if self.world_size == 1:
            return
        if _c.IS_MINDSPORE:
            self._all_reduce_sum(_c.torch.zeros(1).float())
        else:
            import torch.distributed as dist
            dist.barrier()

    def shutdown(self):
        if self.world_size == 1:
            return
        if not _c.IS_MINDSPORE:  # MindSpore: process exit leaves the cluster (no release() call)
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        _state["group"] = None


_MS_OPS = {}


def _ms_all_reduce():
    if "all_reduce" not in _MS_OPS:
        from mindspore import ops
        _MS_OPS["all_reduce"] = ops.AllReduce()
    return _MS_OPS["all_reduce"]


def group():
    """The process's group: the one `init` made, else world size 1."""
    return _state["group"] or Group()


def init(device="cpu", timeout_s=DEFAULT_TIMEOUT_S):
    """Join the run the launcher's variables describe (once per process) and return its Group; world size 1
    (no variables) joins nothing."""
    if _state["group"] is not None:
        return _state["group"]
    world = requested_world_size()
    if world <= 1:
        return Group()
    if _c.IS_MINDSPORE:
        import mindspore
        from mindspore.communication import get_group_size, get_rank
        from mindspore.communication import init as ms_init
        missing = [v for v in ("MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT") if not os.environ.get(v)]
        if missing:
            raise UserError("MS_ROLE=MS_WORKER needs %s; start distributed runs with train.py --nproc N"
                            % ", ".join(missing))
        _wait_for_local_ranks()
        # init() refuses PyNative; the check is init's alone (see the module docstring)
        mindspore.set_context(mode=mindspore.GRAPH_MODE)
        try:
            ms_init()
        except RuntimeError as exc:
            _exit_cluster_formation(exc)
        finally:
            mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
        grp = Group(get_rank(), get_group_size())
        _state["cluster"] = True
    else:
        import torch.distributed as dist
        backend = "nccl" if str(device).lower() in ("gpu", "cuda") else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
        _keep_user_errors_visible()
        grp = Group(dist.get_rank(), dist.get_world_size())
    if grp.world_size != world:
        raise UserError("the engine formed a group of %d processes but the launcher asked for %d"
                        % (grp.world_size, world))
    _state["group"] = grp
    return grp


def leave(status=0):
    """End this process, a rank of a MindSpore cluster whose work is done, with `status`: its output flushed,
    without the interpreter's shutdown. There MindSpore 2.7's exit handlers log its cluster connections at INFO
    level whatever GLOG_v says ("[INFO] PS(...) tcp_client.cc ... Event base dispatch success!", after the
    command's result) and at times crash (SIGSEGV, which the launcher reports as a failed rank). Anywhere
    else (torch, a single process) it returns and the process ends as usual."""
    if not _state.get("cluster"):
        return
    import logging
    import sys
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _keep_user_errors_visible():
    """torch's init_process_group wraps sys.excepthook in one that prefixes the rank to what the hook writes,
    written once the hook returns; compat.errors' hook exits after writing a UserError's line, so the line was
    lost and a rank's bad input ended in silence. UserErrors go to compat.errors' hook again (one line, status
    2), everything else still to torch's."""
    import sys

    from compat import errors
    wrapped = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, UserError):
            errors._excepthook(exc_type, exc, tb)
        wrapped(exc_type, exc, tb)
    sys.excepthook = hook


def _exit_cluster_formation(exc):
    """End this rank with EXIT_CLUSTER_FORMATION after one line naming why. os._exit, not SystemExit: after a
    failed init MindSpore's cluster threads are still running, and the interpreter's shutdown can then die with
    SIGSEGV, which the launcher would take for a crash during training instead of starting the cluster again."""
    import sys
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print("MindSpore could not form the cluster: %s" % message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_CLUSTER_FORMATION)


def _wait_for_local_ranks(timeout_s=900):
    """Tell the launcher this rank is ready to join (a file in REID_READY_DIR) and wait for its go (the file
    `go` there), which it gives once every local rank is ready and MindSpore's scheduler, started only then,
    listens. On a busy machine, workers that register long after the scheduler started (their imports are
    slow) usually fail to form the cluster; registering right after it succeeds."""
    import time
    folder = os.environ.get("REID_READY_DIR")
    if not folder:
        return
    open(os.path.join(folder, "rank%d" % local_rank()), "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(os.path.join(folder, "go")):
        if time.monotonic() > deadline:
            raise UserError("the launcher gave no go within %d s" % timeout_s)
        time.sleep(0.1)


def run_scheduler(stop_file=None):
    """MindSpore's scheduler process (MS_ROLE=MS_SCHED): form the cluster, then stay alive until the launcher
    closes this process's stdin (its workers are done) or `stop_file` appears."""
    import sys
    import time

    import mindspore
    from mindspore.communication import init as ms_init
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    ms_init()
    if stop_file:
        while not os.path.exists(stop_file):
            time.sleep(0.5)
    else:
        sys.stdin.read()
