"""Average query expansion, alpha-weighted (alpha-QE, Radenovic et al.; fast-reid's ``aqe``).

Each feature of the joint set (queries + gallery) is replaced by the mean of its ``qe_k`` most similar
features (itself included, cosine similarity) weighted by similarity**alpha; repeated ``qe_times`` times.
The averaged features are not normalised (the cosine metric does it).
"""
import numpy as np

from reid.errors import UserError
from reid.evaluation.distance import _as_features, normalize

DEFAULT_BLOCK_ELEMENTS = 1 << 22


def aqe(query_feat, gallery_feat, qe_times=1, qe_k=5, alpha=3.0, chunk_size=None):
    """Returns (expanded query features, expanded gallery features) as float32 numpy arrays."""
    qf, gf = _as_features(query_feat, "query features"), _as_features(gallery_feat, "gallery features")
    feats = np.concatenate([qf, gf]).astype(np.float32)
    n = feats.shape[0]
    if not 1 <= int(qe_k) <= n:
        raise UserError("TEST.AQE.QE_K must be between 1 and the number of images (%d), got %s" % (n, qe_k))
    qe_k = int(qe_k)
    step = int(chunk_size) if chunk_size else max(1, DEFAULT_BLOCK_ELEMENTS // n)
    for _ in range(int(qe_times)):
        normed = normalize(feats)
        expanded = np.empty_like(feats)
        for start in range(0, n, step):
            sims = normed[start:start + step] @ normed.T
            top = np.argpartition(-sims, qe_k - 1, axis=1)[:, :qe_k]
            weights = np.power(np.take_along_axis(sims, top, 1), alpha)
            expanded[start:start + step] = (feats[top] * weights[:, :, None]).mean(1)
        feats = expanded
    return feats[:qf.shape[0]], feats[qf.shape[0]:]
