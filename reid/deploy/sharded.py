"""`tools/index.py --nproc N` (and --nnodes ...): the extraction of an index update spread over N processes per
machine, started by the launchers of data-parallel training (reid.engine.distributed: torchrun on torch,
MindSpore's scheduler + workers on MindSpore; docs/retrieval.md#sharded-extraction).

Every rank runs tools/index.py with the same arguments. Rank 0 plans the update as one process does
(gallery.plan_update: the images to extract, sorted) and publishes the list in the shard folder; each rank
extracts one contiguous shard of it, cut on batch boundaries so that every batch is the one a single process
runs (the features are the single process's), and writes its features there; rank 0 gathers them and writes
the index as one process does (the .npz atomically, a Milvus collection by upserts), then tells the others
that the run is over. Files, not collectives, carry the features and the waits: a shard may take hours, and
the launcher, not a collective's timeout, ends a run whose rank died.

The shard folder sits beside the index (`.NAME.shards`; for a Milvus server in the working folder); with
several machines it must be on a file system that every node reads, as training's OUTPUT_DIR. The launcher
makes it empty before the ranks start and removes it after the run. A rank that dies fails the run: the
launcher stops the others (which leave a `rankR.stopped` mark as they go), names the rank that left neither
its shard nor that mark, and the index is as it was: nothing is written before every shard is in.
"""
import json
import os
import shutil
import signal
import sys
import time

import numpy as np

from compat.checkpoint import atomic_write
from reid.errors import UserError

POLL_S = 0.2
PLAN = "plan.json"
FINISHED = "finished"


def shard_folder(output=None, spec=None):
    """Where the ranks of a run on the index `output` (.npz) or the store `spec` (milvus_store.StoreSpec)
    exchange their shards."""
    if spec is not None and spec.kind != "npz":
        if spec.lite:
            return os.path.join(os.path.dirname(spec.lite), ".%s.shards" % os.path.basename(spec.lite))
        return os.path.abspath(".%s.shards" % spec.collection)
    output = os.path.abspath(output)
    return os.path.join(os.path.dirname(output), ".%s.shards" % os.path.basename(output))


def shard_bounds(count, world, batch):
    """[(start, stop)] of each rank's contiguous shard of `count` items: whole batches of `batch`, as evenly
    as whole batches allow (the last batch may be short, as a single process's)."""
    batches = -(-int(count) // int(batch))
    out = []
    for rank in range(int(world)):
        first, last = rank * batches // world, (rank + 1) * batches // world
        out.append((min(first * batch, count), min(last * batch, count)))
    return out


def _wait_for(paths):
    """Wait until every file in `paths` exists (the launcher ends this rank if another one dies)."""
    while not all(os.path.exists(p) for p in paths):
        time.sleep(POLL_S)


class ShardRun:
    """This rank's part of a sharded run: `group` (compat.distributed), the shard `folder`."""

    def __init__(self, group, folder):
        self.group, self.folder = group, folder
        self.rank, self.world = group.rank, group.world_size
        signal.signal(signal.SIGTERM, self._stopped)

    def _stopped(self, signum, frame):
        # stopped by the launcher because another rank failed: say so for its report, then leave at once
        # (os._exit: MindSpore's cluster threads can crash an orderly interpreter shutdown)
        try:
            open(self._path("rank%d.stopped" % self.rank), "w").close()
        finally:
            os._exit(128 + signum)

    def _path(self, name):
        return os.path.join(self.folder, name)

    def _shard(self, todo, batch, rank):
        start, stop = shard_bounds(len(todo), self.world, batch)[rank]
        return todo[start:stop]

    def _extract_own(self, extractor, root, todo, strict, progress):
        from reid.deploy.gallery import extract_planned
        shard = self._shard(todo, extractor.batch_size, self.rank)
        extracted, problems = extract_planned(extractor, root, shard, strict, progress) if shard else ({}, [])
        paths = [p for p in shard if p in extracted]
        features = np.stack([extracted[p] for p in paths]) if paths else np.zeros((0, 0), np.float32)

        def write(fh):
            np.savez(fh, features=np.asarray(features, np.float32), paths=np.array(json.dumps(paths)),
                     problems=np.array(json.dumps(problems)))
        atomic_write(self._path("rank%d.npz" % self.rank), write)

    def extract(self, extractor, plan, strict=False, progress=False):
        """Rank 0: publish `plan`'s images, extract its own shard, wait for every rank's and gather them:
        ({path: feature}, [(path, reason)]) as gallery.extract_planned returns for the whole list."""
        if plan.todo:
            extractor.net     # built (exported, with engine onnx / mindir) once here, before the others load it
        atomic_write(self._path(PLAN), lambda fh: fh.write(json.dumps(
            {"root": plan.root, "todo": plan.todo, "batch": extractor.batch_size}).encode()))
        self._extract_own(extractor, plan.root, plan.todo, strict, progress)
        shards = [self._path("rank%d.npz" % r) for r in range(self.world)]
        _wait_for(shards)
        extracted, problems = {}, []
        for path in shards:
            with np.load(path, allow_pickle=False) as data:
                paths = json.loads(str(data["paths"][()]))
                extracted.update(zip(paths, data["features"]))
                problems += [tuple(p) for p in json.loads(str(data["problems"][()]))]
        return extracted, problems

    def finish(self):
        """Rank 0, once the index is written: the others may leave."""
        open(self._path(FINISHED), "w").close()

    def work(self, extractor, strict=False):
        """A rank other than 0: wait for the plan, extract this rank's shard, wait for the end of the run."""
        _wait_for([self._path(PLAN)])
        with open(self._path(PLAN)) as fh:
            plan = json.load(fh)
        if plan["batch"] != extractor.batch_size:
            raise UserError("rank %d's batch size %d is not rank 0's %d; give every node the same --batch"
                            % (self.rank, extractor.batch_size, plan["batch"]))
        self._extract_own(extractor, plan["root"], plan["todo"], strict, progress=False)
        # the launcher removes the folder after a run: a folder gone is a run over
        while os.path.isdir(self.folder) and not os.path.exists(self._path(FINISHED)):
            time.sleep(POLL_S)


def join(device="cpu"):
    """The group of a launched rank (compat.distributed), or None in a process that is not one."""
    from reid.engine.distributed import launched_rank
    if not launched_rank():
        return None
    import compat
    return compat.distributed.init(device)


def launch_index(script, argv, args, folder, describe_store, log=None):
    """The launching process of `tools/index.py --nproc N`: an empty shard `folder`, the ranks on the
    backend's launcher, then the folder removed. A failed run is a one-line UserError naming the rank that
    died; `describe_store` says what is left of the index."""
    import compat.backend
    from reid.engine.distributed import launch
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    main_node = args.node_rank == 0
    if main_node:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    world = args.nproc * args.nnodes
    try:
        rc = launch(script, list(sys.argv[1:] if argv is None else argv), compat.backend.requested_backend(),
                    args.nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port, log=log,
                    rank_args=(), what=None)
        if rc == 0:
            return
        done = [os.path.exists(os.path.join(folder, "rank%d.npz" % r)) for r in range(world)]
        stopped = [os.path.exists(os.path.join(folder, "rank%d.stopped" % r)) for r in range(world)]
        dead = [r for r in range(world) if not done[r] and not stopped[r]]
    finally:
        if main_node:
            shutil.rmtree(folder, ignore_errors=True)
    if dead:
        what = "%s of %d died before finishing %s shard" % (
            "rank %d" % dead[0] if len(dead) == 1 else "ranks %s" % ", ".join(map(str, dead)), world,
            "its" if len(dead) == 1 else "their")
    elif all(done):
        what = "rank 0 failed while writing the index, after every shard was extracted"
    else:
        what = "a rank failed (status %d)" % rc
    raise UserError("distributed extraction failed: %s (its error, if any, is above); %s" % (what, describe_store()))
