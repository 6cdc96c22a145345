"""Batch samplers (numpy only): identity-balanced P x K training batches and sequential test batches.

`NaiveIdentitySampler` follows fast-reid's sampler of the same name (docs/method.md#samplers). A *pass* starts with
every identity available and each identity's image indices shuffled into a pool (K draws with replacement
when it has fewer than K images). Each batch draws P = batch_size / num_instances distinct identities
uniformly among those still available and pops K indices from each one's pool; an identity whose pool then
holds fewer than K is dropped for the rest of the pass. When fewer than P identities remain, a new pass
starts. The stream is infinite and a function of the seed alone. (fast-reid shuffles a pool when the
identity is first drawn in the pass; drawing all pools at the pass start gives the same distribution and
makes a batch cost O(P) instead of O(number of identities).)

Resuming: the stream is reconstructible from (seed, number of batches consumed). `state_dict()` gives
``{"seed", "batches"}`` for the batches this sampler has yielded; because loaders prefetch, the trainer
should store the number of batches it actually consumed instead and hand that to `load_state_dict` (or to
the `start_batch` argument), which replays the stream up to there (numpy only: seconds even for a whole
paper-length run, docs/performance.md#other).
"""
import numpy as np

from reid.errors import UserError


def domain_indices(domains):
    """{domain id: int64 array of the dataset indices in that domain}, ids in increasing order."""
    domains = np.asarray(domains)
    if domains.ndim != 1:
        raise UserError("domain labels must be a 1-D sequence, got shape %s" % (domains.shape,))
    return {int(d): np.nonzero(domains == d)[0].astype(np.int64) for d in np.unique(domains)}


def _seed_material(seed):
    if isinstance(seed, (list, tuple)):
        return [int(s) for s in seed]
    return int(seed)


class NaiveIdentitySampler:
    """Infinite iterator of P x K index lists; see the module docstring for the exact semantics.

    pids: identity label of every dataset item (array-like, any hashable-as-int labels);
    indices: optional subset of dataset indices to sample from (e.g. one domain, see `domain_samplers`);
    seed: int or list of ints (a numpy SeedSequence entropy); start_batch: skip that many batches.
    """

    def __init__(self, pids, batch_size, num_instances, seed=0, indices=None, start_batch=0):
        pids = np.asarray(pids)
        if pids.ndim != 1:
            raise UserError("NaiveIdentitySampler needs one pid per dataset item, got shape %s" % (pids.shape,))
        batch_size, num_instances = int(batch_size), int(num_instances)
        if num_instances < 1 or batch_size < num_instances or batch_size % num_instances:
            raise UserError("batch size %d must be a positive multiple of DATALOADER.NUM_INSTANCE=%d"
                            % (batch_size, num_instances))
        self.indices = np.arange(len(pids), dtype=np.int64) if indices is None else np.asarray(indices, np.int64)
        self.batch_size, self.num_instances = batch_size, num_instances
        self.num_pids_per_batch = batch_size // num_instances
        self.seed = _seed_material(seed)
        subset = pids[self.indices]
        self.pids = sorted(int(p) for p in np.unique(subset))
        if len(self.pids) < self.num_pids_per_batch:
            raise UserError("a batch of %d with %d images per identity needs %d identities, but the data has only %d; "
                            "lower SOLVER.IMS_PER_BATCH (or META.IMS_PER_DOMAIN) or raise DATALOADER.NUM_INSTANCE"
                            % (batch_size, num_instances, self.num_pids_per_batch, len(self.pids)))
        # identity codes 0..n-1 (in sorted-pid order) of the subset's items, and each code's [start, end) range
        # in the items sorted by code
        self._codes = np.searchsorted(np.asarray(self.pids), subset).astype(np.int64)
        counts = np.bincount(self._codes, minlength=len(self.pids))
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self._small = np.nonzero(counts < num_instances)[0]
        self.start_batch = int(start_batch)
        self._served = self.start_batch

    def _pass_pools(self, rng):
        """Every identity's shuffled pool for one pass, drawn at once: (flat index array, start, end) per id."""
        keys = rng.random(self._codes.size)
        order = np.lexsort((keys, self._codes))  # grouped by identity, random order inside each group
        flat = self.indices[order]
        start, end = self._starts.copy(), self._ends.copy()
        if self._small.size:  # identities with fewer than K images: K draws with replacement
            k = self.num_instances
            counts = self._ends[self._small] - self._starts[self._small]
            picks = self._starts[self._small, None] + (rng.random((self._small.size, k)) * counts[:, None]).astype(
                np.int64)
            start[self._small] = flat.size + np.arange(self._small.size) * k
            end[self._small] = start[self._small] + k
            flat = np.concatenate([flat, flat[picks.reshape(-1)]])
        return flat.tolist(), start.tolist(), end.tolist()

    def _stream(self):
        rng = np.random.default_rng(self.seed)
        k, p_count = self.num_instances, self.num_pids_per_batch
        while True:
            flat, cursor, end = self._pass_pools(rng)
            available = list(range(len(self.pids)))
            position = list(available)
            while len(available) >= p_count:
                chosen = [available[i] for i in rng.choice(len(available), p_count, replace=False)]
                batch = []
                for code in chosen:
                    c = cursor[code]
                    batch.extend(flat[c:c + k])
                    cursor[code] = c + k
                    if end[code] - c - k < k:  # drop for this pass: O(1) swap with the last available id
                        i, last = position[code], available.pop()
                        if last != code:
                            available[i], position[last] = last, i
                yield batch

    def __iter__(self):
        stream = self._stream()
        for _ in range(self.start_batch):
            next(stream)
        self._served = self.start_batch
        for batch in stream:
            self._served += 1
            yield batch

    def state_dict(self):
        """{"seed", "batches"}: the batches yielded so far (prefetching loaders run ahead of training)."""
        return {"seed": self.seed, "batches": self._served}

    def load_state_dict(self, state):
        """Continue after state["batches"] batches of the stream of state["seed"] (it must be this seed)."""
        if _seed_material(state["seed"]) != self.seed:
            raise UserError("sampler state was saved with seed %r but this run uses seed %r; resume with the "
                            "checkpoint's SEED" % (state["seed"], self.seed))
        self.start_batch = self._served = int(state["batches"])


def domain_samplers(pids, domains, batch_size, num_instances, seed=0, start_batch=0):
    """{domain id: NaiveIdentitySampler over that domain's items}, each with its own seed stream [seed, 1, d]."""
    return {d: NaiveIdentitySampler(pids, batch_size, num_instances, seed=[_seed_material(seed), 1, d],
                                    indices=idx, start_batch=start_batch)
            for d, idx in domain_indices(domains).items()}


class InferenceSampler:
    """Sequential batches over range(num_items), in order; the last, partial batch is kept. Finite."""

    def __init__(self, num_items, batch_size):
        if int(batch_size) < 1:
            raise UserError("test batch size must be positive, got %r (TEST.IMS_PER_BATCH)" % (batch_size,))
        self.num_items, self.batch_size = int(num_items), int(batch_size)

    def __iter__(self):
        for start in range(0, self.num_items, self.batch_size):
            yield list(range(start, min(start + self.batch_size, self.num_items)))

    def __len__(self):
        return (self.num_items + self.batch_size - 1) // self.batch_size
