"""Samplers (numpy only, backend-neutral): P x K structure, pass semantics, determinism, resume, domains."""
import itertools
from collections import Counter

import numpy as np
import pytest

from compat.errors import UserError
from reid.data.samplers import InferenceSampler, NaiveIdentitySampler, domain_indices, domain_samplers


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def toy_pids(seed=0, num_ids=20):
    """Identities with 1..7 images each, in shuffled dataset order."""
    rng = np.random.RandomState(seed)
    pids = np.repeat(np.arange(num_ids) * 3 + 100, rng.randint(1, 8, size=num_ids))  # non-contiguous labels
    return pids[rng.permutation(len(pids))]


def test_every_batch_is_p_ids_times_k_images():
    pids = toy_pids()
    sampler = NaiveIdentitySampler(pids, batch_size=16, num_instances=4, seed=3)
    for batch in take(sampler, 200):
        assert len(batch) == 16
        counts = Counter(int(pids[i]) for i in batch)
        assert len(counts) == 4 and set(counts.values()) == {4}


def test_single_image_identities_are_repeated_k_times():
    pids = np.array([0, 1, 1, 2, 2, 2, 3])  # ids 0 and 3 have a single image
    sampler = NaiveIdentitySampler(pids, batch_size=4, num_instances=2, seed=0)
    seen = set()
    for batch in take(sampler, 50):
        for pid in (0, 3):
            rows = [i for i in batch if pids[i] == pid]
            assert rows in ([], [int(np.nonzero(pids == pid)[0][0])] * 2)
            seen.add(pid) if rows else None
    assert seen == {0, 3}


def test_pass_uses_each_image_once_and_restarts_when_too_few_ids_remain():
    # 5 ids x exactly K images, P = 2: a pass is 2 batches over 4 distinct ids (every image once), then the
    # 5th id is left alone (fewer than P available) and a new pass starts
    k = 3
    pids = np.repeat(np.arange(5), k)
    batches = take(NaiveIdentitySampler(pids, batch_size=2 * k, num_instances=k, seed=1), 40)
    for first, second in zip(batches[0::2], batches[1::2]):
        both = first + second
        assert len(set(both)) == 4 * k                      # no image twice within a pass
        assert len({int(pids[i]) for i in both}) == 4       # 4 distinct ids, each once
    # with ids of 2K images, the id stays available for a second draw within the pass
    pids = np.repeat(np.arange(2), 2 * k)
    for batch_pair in zip(*[iter(take(NaiveIdentitySampler(pids, 2 * k, k, seed=2), 20))] * 2):
        assert sorted(batch_pair[0] + batch_pair[1]) == list(range(4 * k))


def test_all_images_eventually_visited():
    pids = toy_pids(seed=5)
    visited = set(itertools.chain.from_iterable(take(NaiveIdentitySampler(pids, 16, 4, seed=7), 400)))
    assert visited == set(range(len(pids)))


def test_deterministic_given_seed():
    pids = toy_pids()
    a = take(NaiveIdentitySampler(pids, 16, 4, seed=11), 30)
    b = take(NaiveIdentitySampler(pids, 16, 4, seed=11), 30)
    c = take(NaiveIdentitySampler(pids, 16, 4, seed=12), 30)
    assert a == b
    assert a != c
    assert all(isinstance(i, int) for i in a[0])


def test_resume_continues_the_exact_stream():
    pids = toy_pids()
    full = take(NaiveIdentitySampler(pids, 16, 4, seed=4), 60)
    assert take(NaiveIdentitySampler(pids, 16, 4, seed=4, start_batch=25), 35) == full[25:]
    sampler = NaiveIdentitySampler(pids, 16, 4, seed=4)
    it = iter(sampler)
    for _ in range(17):
        next(it)
    state = sampler.state_dict()
    assert state == {"seed": 4, "batches": 17}
    resumed = NaiveIdentitySampler(pids, 16, 4, seed=4)
    resumed.load_state_dict(state)
    assert take(resumed, 43) == full[17:]
    with pytest.raises(UserError, match="seed"):
        NaiveIdentitySampler(pids, 16, 4, seed=5).load_state_dict(state)


def test_domain_samplers_stay_in_their_domain():
    rng = np.random.RandomState(0)
    domains = rng.randint(0, 3, size=300)
    pids = domains * 1000 + rng.randint(0, 25, size=300)  # ids are unique to a domain, as after relabelling
    idx = domain_indices(domains)
    assert sorted(idx) == [0, 1, 2]
    assert sorted(np.concatenate(list(idx.values())).tolist()) == list(range(300))
    samplers = domain_samplers(pids, domains, batch_size=8, num_instances=2, seed=9)
    firsts = []
    for d, sampler in samplers.items():
        batches = take(sampler, 30)
        firsts.append(batches[0])
        for batch in batches:
            assert set(domains[batch]) == {d}
            counts = Counter(int(pids[i]) for i in batch)
            assert len(counts) == 4 and set(counts.values()) == {2}
    # domain streams are seeded independently, and the combined sampler mixes domains
    assert len({tuple(sorted(pids[b] % 1000)) for b in firsts}) == 3
    mixed = take(NaiveIdentitySampler(pids, 64, 2, seed=9), 20)
    assert any(len(set(domains[b])) > 1 for b in mixed)


def test_inference_sampler_keeps_order_and_last_partial_batch():
    sampler = InferenceSampler(10, 4)
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(sampler) == 3
    assert list(InferenceSampler(0, 4)) == [] and len(InferenceSampler(8, 4)) == 2


def test_bad_configuration_raises_user_error():
    with pytest.raises(UserError, match="multiple"):
        NaiveIdentitySampler(np.arange(10), 7, 2)
    with pytest.raises(UserError, match="identities"):
        NaiveIdentitySampler(np.repeat(np.arange(3), 4), 8, 2)
    with pytest.raises(UserError, match="positive"):
        InferenceSampler(5, 0)
