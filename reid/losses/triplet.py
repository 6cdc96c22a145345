"""Triplet losses: fast-reid batch-hard (basic step) and MetaBIN's `triplet_loss_Meta` (meta steps).

Definitions: docs/method.md#loss-triplet and #loss-meta-triplet. Mining is done with masks over the (N, N)
distance matrix, never with loops over rows.
"""
import numpy as np

from compat import torch
from reid.errors import UserError
from reid.losses.utils import cosine_dist, euclidean_dist, normalize

_BIG = 1e9  # fast-reid's "not a candidate" offset for the min over negatives
META_MODES = ("mtrain", "mtest", "add")


def _softmax_weights(dist, mask):
    max_v = torch.max(dist * mask, 1)[0].reshape(-1, 1)
    diff = dist - max_v
    z = (torch.exp(diff) * mask).sum(1).reshape(-1, 1) + 1e-6  # the original's guard against empty rows
    return torch.exp(diff) * mask / z


def weighted_example_mining(dist, is_pos, is_neg):
    """Softmax-weighted positive / negative distances (fast-reid's `weighted_example_mining`)."""
    dist_ap = dist * is_pos
    dist_an = dist * is_neg
    dist_ap = (dist_ap * _softmax_weights(dist_ap, is_pos)).sum(1)
    dist_an = (dist_an * _softmax_weights(-dist_an, is_neg)).sum(1)
    return dist_ap, dist_an


def hard_example_mining(dist, is_pos, is_neg):
    """fast-reid's vectorised batch-hard mining: max over positives; min over `dist*is_neg + is_pos*1e9`.

    Distances are >= 1e-6, so the zeros that `dist * is_pos` leaves for non-positives never win the max.
    On ties the whole gradient goes to the one index max/min returns, as in fast-reid.
    """
    dist_ap = torch.max(dist * is_pos, 1)[0]
    dist_an = torch.min(dist * is_neg + is_pos * _BIG, 1)[0]
    return dist_ap, dist_an


def _tie_mean(dist, mask, extreme):
    """Per row, the mean of `dist` over the masked entries equal to `extreme`: the value of the row-wise
    max/min, with the gradient shared evenly among ties like torch.max(t)/torch.min(t) of a whole tensor."""
    ties = (dist == extreme.unsqueeze(1)).float() * mask   # (a comparison carries no gradient)
    # a row with candidates has at least one tie; one without (which the losses reject op by op, but the
    # compiled shared basic / meta-train graph meets when it takes the meta losses of a basic batch, weighted
    # 0: reid/engine/steps.py) gets 0 instead of 0 / 0, whose NaN a weight of 0 would not remove
    return (dist * (ties / ties.sum(1).clamp(min=1.0).reshape(-1, 1))).sum(1)


def meta_hard_example_mining(dist, is_pos, is_neg):
    """The MetaBIN/ACL loop `max(dist[i][is_pos[i]])`, `min(dist[i][is_neg[i]])`, vectorised with masks.

    Every row must have a positive and a negative (the caller checks); the non-candidate entries are moved out
    of reach (0 for the max since distances are >= 1e-6, +1e9 for the min).
    """
    ap_max = torch.max(dist * is_pos, 1)[0]
    an_min = torch.min(dist * is_neg + (1.0 - is_neg) * _BIG, 1)[0]
    return _tie_mean(dist, is_pos, ap_max), _tie_mean(dist, is_neg, an_min)


def _ranking_loss(dist_an, dist_ap, margin):
    """margin_ranking_loss(d_an, d_ap, y=1, margin) for margin > 0, else the soft-margin (logistic) form
    mean(log1p(exp(-(d_an - d_ap)))) with the original's fall-back to margin 0.3 when that overflows to inf."""
    if margin > 0:
        return (dist_ap - dist_an + margin).clamp(min=0).mean()
    loss = torch.log1p(torch.exp(dist_ap - dist_an)).mean()  # F.soft_margin_loss's formula (no log-sum-exp trick)
    if torch.compiler.is_compiling():  # compiled: no host read, the same choice as a select
        return torch.where(torch.isinf(loss), (dist_ap - dist_an + 0.3).clamp(min=0).mean(), loss)
    if bool(torch.isinf(loss)):
        return (dist_ap - dist_an + 0.3).clamp(min=0).mean()
    return loss


def _check_embedding(shape, name):
    if len(shape) != 2:
        raise UserError("%s expects (N, D) embeddings, got %d dims" % (name, len(shape)))


def _same(labels):
    col = labels.reshape(-1, 1)
    return (col == col.t()).float()


def triplet_loss(embedding, targets, margin=0.3, norm_feat=False, hard_mining=True):
    """fast-reid/ACL basic-step triplet loss on `embedding` (N, D) with identity `targets` (N,).

    Distance: cosine (2 - 2cos) when norm_feat, else Euclidean sqrt(clamp(d^2, 1e-12)). Positives are the same
    id including the anchor itself; margin 0 switches to the soft-margin variant.
    """
    if not torch.compiler.is_compiling():
        _check_embedding(embedding.shape, "triplet_loss")
    dist = cosine_dist(embedding, embedding) if norm_feat else euclidean_dist(embedding, embedding)
    is_pos = _same(targets)
    is_neg = 1.0 - is_pos
    mine = hard_example_mining if hard_mining else weighted_example_mining
    dist_ap, dist_an = mine(dist, is_pos, is_neg)
    return _ranking_loss(dist_an, dist_ap, float(margin))


def meta_triplet_masks(targets, domains, mode):
    """(N, N) float positive/negative mask tensors of `triplet_loss_Meta`, as tensor ops on the label tensors
    (numpy masks turned into tensors inside a differentiated function are constants whose value changes per
    batch, which makes MindSpore's cached backward graph dynamic; see compat/autograd.py).

    mtrain / mtest (pos_flag [1,0,0], neg_flag [0,1,1]): positives = same id (incl. self), negatives = other ids.
    add (pos_flag [0,0,1], neg_flag [0,1,0]): positives = self or another domain, negatives = same domain and
    another id.
    """
    if not torch.compiler.is_compiling():
        _check_mask_args(mode, targets.shape, None if domains is None else domains.shape)
    same_id = _same(targets)
    if mode in ("mtrain", "mtest"):
        return same_id, 1.0 - same_id
    other_domain = 1.0 - _same(domains)
    eye = _same(torch.arange(int(targets.shape[0]), device=targets.device))  # the identity matrix
    return eye + other_domain, (1.0 - same_id) * (1.0 - other_domain)  # self and other domains never overlap


def _check_mask_args(mode, targets_shape, domains_shape):
    if mode not in META_MODES:
        raise UserError("meta triplet mode must be one of %s, got %r" % (", ".join(META_MODES), mode))
    if mode == "add" and domains_shape is None:
        raise UserError("meta triplet mode 'add' needs the domain label of every sample")
    if mode == "add" and tuple(domains_shape) != tuple(targets_shape):
        raise UserError("targets (%d) and domains (%d) must have one entry per sample"
                        % (int(np.prod(targets_shape)), int(np.prod(domains_shape))))


def _check_negatives(is_neg, mode):
    empty = np.nonzero(is_neg.sum(1).detach().cpu().numpy() == 0)[0]
    if empty.size:
        raise UserError("meta triplet loss ('%s'): anchor %d has no negative (every sample of its %s shares its "
                        "identity); use more identities per (chunk of the) batch or a smaller MODEL.NUM_SPLITS"
                        % (mode, int(empty[0]), "domain" if mode == "add" else "batch"))


def triplet_loss_meta(embedding, targets, domains=None, mode="mtrain", margin=None, norm_feat=False,
                      hard_mining=True):
    """MetaBIN/ACL `triplet_loss_Meta` (Euclidean distance, 'logistic' loss type).

    mode 'mtrain' / 'mtest': batch-hard triplet, default margin 0.3. mode 'add': default margin 0, i.e. the
    soft-margin softplus(-(d_an - d_ap)), positives = self or other domains, negatives = same domain, other id.
    The original crashes (max/min of an empty selection) when an anchor has no negative; this raises a
    UserError instead. With hard mining, ties share the gradient evenly (the original reduced each row with
    a whole-tensor max/min).
    """
    if not torch.compiler.is_compiling():
        _check_embedding(embedding.shape, "triplet_loss_meta")
    if margin is None:
        margin = 0.0 if mode == "add" else 0.3
    is_pos, is_neg = meta_triplet_masks(targets, domains, mode)
    if not torch.compiler.is_compiling():
        _check_negatives(is_neg, mode)
    if norm_feat:
        embedding = normalize(embedding, axis=-1)
    dist = euclidean_dist(embedding, embedding)
    mine = meta_hard_example_mining if hard_mining else weighted_example_mining
    dist_ap, dist_an = mine(dist, is_pos, is_neg)
    return _ranking_loss(dist_an, dist_ap, float(margin))
