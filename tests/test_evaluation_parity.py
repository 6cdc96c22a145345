"""Feature extraction through the backend: the same weights give the same features (1e-5) and the same
metrics (1e-6) on MindSpore and torch, both match a plain real-torch forward, and the extractor's
contract (eval mode restored, flip averaging, joint loader, bad model output)."""
import numpy as np
import pytest

from tests.crossenv import run_cases

NUM_IDS, PER_ID, H, W = 8, 4, 24, 12


def tiny_weights(seed):
    rng = np.random.RandomState(seed)
    return {"conv.weight": rng.randn(6, 3, 3, 3).astype(np.float32) * 0.5,
            "bn_weight": (rng.rand(6) + 0.5).astype(np.float32), "bn_bias": rng.randn(6).astype(np.float32) * 0.1,
            "bn_mean": rng.randn(6).astype(np.float32) * 0.5, "bn_var": (rng.rand(6) + 0.5).astype(np.float32),
            "fc.weight": rng.randn(5, 6).astype(np.float32) * 0.3, "fc.bias": rng.randn(5).astype(np.float32) * 0.1}


def tiny_data(seed):
    """Images with an identity colour plus a per-image colour shift and pixel noise, pids, camids, paths."""
    rng = np.random.RandomState(seed + 1)
    base = rng.rand(NUM_IDS, 3, 1, 1) * 255
    pids = np.repeat(np.arange(NUM_IDS), PER_ID)
    shift = rng.randn(len(pids), 3, 1, 1) * 35
    images = np.clip(base[pids] + shift + rng.randn(len(pids), 3, H, W) * 40, 0, 255).astype(np.float32)
    camids = np.tile(np.arange(PER_ID), NUM_IDS)
    paths = ["img_%03d.jpg" % i for i in range(len(pids))]
    return images, pids, camids, paths


def build_tiny(weights):
    """conv -> BN (running statistics via compat.batch_norm) -> ReLU -> average pool -> linear."""
    import compat
    from compat import nn, F

    class Tiny(nn.Module):
        def __init__(self):
            super(Tiny, self).__init__()
            self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False)
            self.bn_weight = nn.Parameter(compat.as_tensor(np.ones(6, np.float32)))
            self.bn_bias = nn.Parameter(compat.as_tensor(np.zeros(6, np.float32)))
            self.register_buffer("bn_mean", compat.as_tensor(np.zeros(6, np.float32)))
            self.register_buffer("bn_var", compat.as_tensor(np.ones(6, np.float32)))
            self.fc = nn.Linear(6, 5)

        def forward(self, x):
            x = self.conv(x / 255.0)
            mode = "general" if self.training else "eval"
            x = F.relu(compat.batch_norm(x, self.bn_mean, self.bn_var, self.bn_weight, self.bn_bias, mode))
            return self.fc(F.adaptive_avg_pool2d(x, 1).reshape(x.shape[0], -1))

    model = Tiny()
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    for name, value in weights.items():
        compat.assign_(named[name], compat.as_tensor(value))
    return model


def loader(images, pids, camids, paths, batch=7):
    """Dict batches of backend tensors, the last one short (as a test loader without drop_last)."""
    import compat
    for s in range(0, len(images), batch):
        yield {"images": compat.as_tensor(images[s:s + batch]), "targets": compat.as_tensor(pids[s:s + batch]),
               "camids": compat.as_tensor(camids[s:s + batch]), "img_paths": paths[s:s + batch]}


def case_extract(seed, flip):
    from reid.evaluation import evaluate_features, extract_features
    images, pids, camids, paths = tiny_data(seed)
    model = build_tiny(tiny_weights(seed))
    model.train()
    feats, got_pids, got_cams, got_paths = extract_features(model, loader(images, pids, camids, paths), flip=flip)
    is_q = got_cams == 0
    metrics = {m: evaluate_features(feats[is_q], feats[~is_q], got_pids[is_q], got_pids[~is_q], got_cams[is_q],
                                    got_cams[~is_q], metric=m) for m in ("cosine", "euclidean")}
    return dict(feats=feats, pids=got_pids, camids=got_cams, paths=got_paths, training_after=model.training,
                metrics=metrics)


def case_reference(seed, flip):
    """Plain real torch: the same network written with torch.nn.functional, eval statistics."""
    import torch
    import torch.nn.functional as F
    w = {k: torch.from_numpy(v) for k, v in tiny_weights(seed).items()}
    images = torch.from_numpy(tiny_data(seed)[0])

    def net(x):
        x = F.conv2d(x / 255.0, w["conv.weight"], stride=2, padding=1)
        x = F.relu(F.batch_norm(x, w["bn_mean"], w["bn_var"], w["bn_weight"], w["bn_bias"], False, 0.0, 1e-5))
        return F.linear(F.adaptive_avg_pool2d(x, 1).flatten(1), w["fc.weight"], w["fc.bias"])

    with torch.no_grad():
        feats = net(images)
        if flip:
            feats = (feats + net(torch.flip(images, dims=[3]))) / 2
    return dict(feats=feats.numpy())


FLIPS = [False, True]


@pytest.fixture(scope="module")
def results():
    calls = [("tests.test_evaluation_parity:case_extract", dict(seed=0, flip=f)) for f in FLIPS]
    refs = [("tests.test_evaluation_parity:case_reference", dict(seed=0, flip=f)) for f in FLIPS]
    torch_out = run_cases("torch", refs + calls)
    return dict(ref=torch_out[:len(FLIPS)], torch=torch_out[len(FLIPS):], mindspore=run_cases("mindspore", calls))


@pytest.mark.parity
@pytest.mark.parametrize("flip", FLIPS)
def test_features_and_metrics_agree_across_backends(results, flip):
    i = FLIPS.index(flip)
    ms, pt, ref = results["mindspore"][i], results["torch"][i], results["ref"][i]
    for got in (ms, pt):
        np.testing.assert_allclose(got["feats"], ref["feats"], atol=1e-5, rtol=1e-5)
        assert got["training_after"] is True
        np.testing.assert_array_equal(got["pids"], np.repeat(np.arange(NUM_IDS), PER_ID))
        assert got["paths"] == tiny_data(0)[3]
    np.testing.assert_allclose(ms["feats"], pt["feats"], atol=1e-5, rtol=1e-5)
    # the ranking is unambiguous at the feature tolerance (no two distances of a row closer than the error)
    from reid.evaluation import compute_distance
    feat_err = np.abs(ms["feats"] - pt["feats"]).max()
    is_q = pt["camids"] == 0
    for metric in ("cosine", "euclidean"):
        d = compute_distance(pt["feats"][is_q], pt["feats"][~is_q], metric)
        assert np.diff(np.sort(d, 1), axis=1).min() > 10 * feat_err, metric
    for metric in ("cosine", "euclidean"):
        for key, value in pt["metrics"][metric].items():
            assert abs(ms["metrics"][metric][key] - value) <= 1e-6, (metric, key)
    # the case is not degenerate: the identities are partly but not perfectly separated
    assert 0 < pt["metrics"]["cosine"]["mAP"] < 100


# ----------------------------------------------------------------------------- active backend only
def test_flip_is_the_mean_of_both_views_and_loader_forms():
    from reid.evaluation import evaluate, extract_features
    images, pids, camids, paths = tiny_data(3)
    model = build_tiny(tiny_weights(3))
    plain = extract_features(model, loader(images, pids, camids, paths))[0]
    mirrored = extract_features(model, loader(images[..., ::-1].copy(), pids, camids, paths))[0]
    flipped = extract_features(model, loader(images, pids, camids, paths), flip=True)[0]
    np.testing.assert_allclose(flipped, (plain + mirrored) / 2, atol=1e-5)
    assert model.training is True  # modules start in train mode; restored after extraction
    # a joint loader split by num_query equals separate query / gallery loaders
    is_q = camids == 0
    order = np.concatenate([np.flatnonzero(is_q), np.flatnonzero(~is_q)])
    joint = evaluate(model, loader(images[order], pids[order], camids[order], [paths[i] for i in order]),
                     num_query=int(is_q.sum()))
    split = evaluate(model, loader(images[is_q], pids[is_q], camids[is_q], paths),
                     loader(images[~is_q], pids[~is_q], camids[~is_q], paths))
    assert joint == split and set(joint) == {"Rank-1", "Rank-5", "Rank-10", "mAP", "mINP"}


def test_extractor_rejects_non_feature_outputs():
    from compat import nn
    from compat.errors import UserError
    from reid.evaluation import extract_features

    class DictOut(nn.Module):
        def forward(self, x):
            return {"features": x}

    images, pids, camids, paths = tiny_data(4)
    with pytest.raises(UserError, match=r"\(N, D\) feature tensor"):
        extract_features(DictOut(), loader(images, pids, camids, paths))
    with pytest.raises(UserError, match="yielded no images"):
        extract_features(build_tiny(tiny_weights(4)), [])
