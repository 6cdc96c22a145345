"""From config to loaders: the combined training stream, one stream per source domain (meta steps), and
query/gallery loaders for evaluation. Everything up to the loader is numpy/OpenCV; `compat.data.make_loader`
hands it to the backend's own loader.

Reproducibility: every training sample is augmented with its own `np.random.Generator` seeded from
(SEED, stream, position in the stream), so a batch is a pure function of the seed and its number,
whatever the worker count, and `--resume` can continue a stream exactly by replaying its sampler.
"""
import numpy as np

import compat
from reid.errors import UserError
from reid.data.common import read_image
from reid.data.datasets import build_test_set, build_train_set
from reid.data.samplers import InferenceSampler, NaiveIdentitySampler, domain_indices
from reid.data.transforms import build_transforms


class TrainImages:
    """dataset[key] -> dict(images float32 (3,H,W) 0..255, targets, camids, domains).

    Loaders pass integer keys, so a key packs the record index and the sample's position in its stream:
    key = position * len(records) + index; the augmentation generator is seeded from (seed, stream, position).
    """

    def __init__(self, records, transform, seed, stream_id):
        self.records, self.transform = records, transform
        self.seed, self.stream_id = int(seed), int(stream_id)

    def __len__(self):
        return len(self.records)

    def key(self, index, position):
        return int(position) * len(self.records) + int(index)

    def __getitem__(self, key):
        position, index = divmod(int(key), len(self.records))
        path, pid, camid, domain = self.records[index]
        image = read_image(path, "stop")  # bad files were dropped (skip) or reported (stop) before training
        rng = np.random.default_rng([self.seed, 7919, self.stream_id, position])
        return dict(images=self.transform(image, rng), targets=np.int64(pid), camids=np.int64(camid),
                    domains=np.int64(domain))


class TestImages:
    """dataset[index] -> dict(images, targets, camids, img_paths) for feature extraction."""

    def __init__(self, records, transform):
        self.records, self.transform = records, transform

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        path, pid, camid, _ = self.records[index]
        image = read_image(path, "stop")
        return dict(images=self.transform(image, None), targets=np.int64(pid), camids=np.int64(camid),
                    img_paths=path)


class PositionedBatches:
    """Wraps an infinite index-list sampler and turns each index into a key that also carries the sample's
    position in the stream (see TrainImages), counting from batch `start_batch`. `shard` (rank, world size):
    only that rank's contiguous chunk of every batch (data-parallel runs), with the keys, and so the images
    and their augmentation, the whole batch has there."""

    def __init__(self, sampler, dataset, start_batch=0, shard=(0, 1)):
        self.sampler, self.dataset = sampler, dataset
        self.start_batch = int(start_batch)  # the sampler was built to skip this many batches too
        self.rank, self.world = int(shard[0]), int(shard[1])

    def __iter__(self):
        batch_no = self.start_batch
        for indices in self.sampler:
            first = batch_no * len(indices)
            keys = [self.dataset.key(i, first + k) for k, i in enumerate(indices)]
            size = len(keys) // self.world
            yield keys[self.rank * size:(self.rank + 1) * size]
            batch_no += 1


class TrainStream:
    """An endless iterator of training batches (backend tensors) that counts what it handed out, so a
    checkpoint can record `consumed` and a resumed run rebuilds the stream from exactly there."""

    def __init__(self, records, transform, pids, batch_size, num_instances, seed, stream_id, num_workers,
                 indices=None, consumed=0, shard=(0, 1)):
        self.consumed = int(consumed)
        dataset = TrainImages(records, transform, seed, stream_id)
        sampler = NaiveIdentitySampler(pids, batch_size, num_instances, seed=[int(seed), int(stream_id)],
                                       indices=indices, start_batch=self.consumed)
        batches = PositionedBatches(sampler, dataset, start_batch=self.consumed, shard=shard)
        self._loader = compat.data.make_loader(dataset, batches, num_workers)
        self._iter = None

    def __next__(self):
        if self._iter is None:
            self._iter = iter(self._loader)
        batch = next(self._iter)
        self.consumed += 1
        return batch

    def __iter__(self):
        return self


class TrainData:
    """The training set and its streams: `combined` (P x K over all sources) and `domains[d]` (per source).

    `shard` (rank, world size) of a data-parallel run: `combined` hands out that rank's contiguous chunk of
    every batch (DataParallel's scatter). The per-domain streams hand out whole batches on every rank: a meta
    step chunks the concatenated meta-train batch, and which domain batches a chunk covers depends on the
    meta-test domain drawn in that step (the trainer chunks them, reid/engine/trainer.py)."""

    def __init__(self, cfg, consumed=None, shard=(0, 1)):
        self.train_set = build_train_set(cfg)
        self.num_classes = list(self.train_set.num_classes)
        self.offsets = list(self.train_set.offsets)
        records = self.train_set.records
        transform = build_transforms(cfg, is_train=True)
        pids = np.array([r[1] for r in records], np.int64)
        domains = np.array([r[3] for r in records], np.int64)
        consumed = consumed or {}
        workers = int(cfg.DATALOADER.NUM_WORKERS)
        seed = int(cfg.SEED)
        world = int(shard[1])
        if world > 1 and (cfg.SOLVER.IMS_PER_BATCH % world or (cfg.META.ENABLED and cfg.META.IMS_PER_DOMAIN % world)):
            raise UserError("SOLVER.IMS_PER_BATCH (%d) and META.IMS_PER_DOMAIN (%d) must be multiples of the %d "
                            "processes (the batch sizes are those of the whole run, split over the processes)"
                            % (cfg.SOLVER.IMS_PER_BATCH, cfg.META.IMS_PER_DOMAIN, world))
        self.combined = TrainStream(records, transform, pids, cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_INSTANCE, seed,
                                    0, workers, consumed=consumed.get("combined", 0), shard=shard)
        self.domains = []
        if cfg.META.ENABLED:
            by_domain = domain_indices(domains)
            for d in range(len(self.num_classes)):
                self.domains.append(TrainStream(
                    records, transform, pids, cfg.META.IMS_PER_DOMAIN, cfg.DATALOADER.NUM_INSTANCE, seed, 1 + d,
                    workers, indices=by_domain[d], consumed=consumed.get("domain%d" % d, 0)))

    def iters_per_epoch(self, cfg):
        if cfg.SOLVER.ITERS_PER_EPOCH > 0:
            return int(cfg.SOLVER.ITERS_PER_EPOCH)
        n = len(self.train_set) // int(cfg.SOLVER.IMS_PER_BATCH)
        if n < 1:
            raise UserError("the training set (%d images) is smaller than one batch (SOLVER.IMS_PER_BATCH=%d)"
                            % (len(self.train_set), cfg.SOLVER.IMS_PER_BATCH))
        return n

    def consumed(self):
        out = {"combined": self.combined.consumed}
        out.update({"domain%d" % d: s.consumed for d, s in enumerate(self.domains)})
        return out


def build_test_loaders(cfg, name):
    """(query_loader, gallery_loader, query_records, gallery_records) of test dataset `name`."""
    query, gallery = build_test_set(name, cfg)
    transform = build_transforms(cfg, is_train=False)
    batch = int(cfg.TEST.IMS_PER_BATCH)
    workers = int(cfg.DATALOADER.NUM_WORKERS)
    loaders = [compat.data.make_loader(TestImages(recs, transform), InferenceSampler(len(recs), batch), workers)
               for recs in (query, gallery)]
    return loaders[0], loaders[1], query, gallery
