"""The ACL training objectives (docs/method.md#basic-step, #meta-step): which loss terms each step adds up.

Every objective maps the model's train-mode outputs and the batch to ``(total, terms)``: ``total`` is the
scalar to differentiate and ``terms`` the individual (weighted) loss values for logging. With
``num_splits`` > 1 each term is computed per contiguous chunk and the chunk totals are averaged, which is
what the original's nn.DataParallel over 4 GPUs did (docs/method.md#dataparallel).
"""
import compat
from reid.losses import (center_loss, cross_entropy_per_domain, domain_sct_loss, inter_cluster_loss,
                         intra_cluster_loss, triplet_loss, triplet_loss_meta)

# MODEL.HEADS.NECK_FEAT -> the head output the metric losses (triplet, meta triplet, SCT) use: "after" the
# L2-normalised BNNeck feature (the original's setting), "before" the pooled feature, un-normalised. The
# evaluation feature is the BNNeck output either way, as in the original.
METRIC_FEATURES = {"after": "feat_norm", "before": "features"}


@compat.eager_only
def _check_neck_feat(neck_feat):
    if neck_feat not in METRIC_FEATURES:
        raise compat.UserError("MODEL.HEADS.NECK_FEAT must be one of %s, got %r"
                               % (", ".join(METRIC_FEATURES), neck_feat))


def metric_feature_key(neck_feat):
    """The head output the metric losses use (the check is skipped inside compiled code: compat/jit.py)."""
    _check_neck_feat(neck_feat)
    return METRIC_FEATURES.get(neck_feat, "feat_norm")


def _chunks(num_splits, n):
    size = n // num_splits
    return [slice(i * size, (i + 1) * size) for i in range(num_splits)]


def _take(out, batch, sl, index, metric_key):
    logits = [l[sl] for l in out["logits"]]
    center = out["center_dist"][sl] if out.get("center_dist") is not None else None
    paths = out["paths"][sl] if out.get("paths") is not None else None
    present = batch["present"][index] if batch.get("present") is not None else None
    return dict(metric_feat=out[metric_key][sl], logits=logits, center_dist=center, paths=paths,
                targets=batch["targets"][sl], domains=batch["domains"][sl], present=present)


def _cluster_terms(c, cfg, terms):
    cl = cfg.MODEL.LOSSES.CLUSTER
    if c["paths"] is None or not cl.ENABLED:
        return
    terms["loss_intra"] = intra_cluster_loss(c["paths"], c["domains"], cl.INTRA_MARGIN, cl.CENTROID, c["present"])
    terms["loss_inter"] = inter_cluster_loss(c["paths"], c["domains"], cl.INTER_MARGIN, cl.CENTROID, c["present"])


def _chunk_terms(kind, c, cfg, offsets):
    losses = cfg.MODEL.LOSSES
    terms = {}
    if kind == "basic":
        terms["loss_cls"] = cross_entropy_per_domain(c["logits"], c["targets"], c["domains"], offsets,
                                                     losses.CE.EPSILON, losses.CE.SCALE, present=c["present"])
        terms["loss_triplet"] = triplet_loss(c["metric_feat"], c["targets"], losses.TRI.MARGIN) * losses.TRI.SCALE
        _cluster_terms(c, cfg, terms)
        if c["center_dist"] is not None and losses.CENTER.SCALE > 0:
            terms["loss_center"] = center_loss(c["center_dist"], c["targets"]) * losses.CENTER.SCALE
    elif kind == "mtrain":
        terms["loss_triplet_add"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "add")
        terms["loss_triplet_mtrain"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "mtrain",
                                                         losses.TRI.MARGIN)
        terms["loss_sct"] = domain_sct_loss(c["metric_feat"], c["domains"], present=c["present"]) * losses.SCT.SCALE
        _cluster_terms(c, cfg, terms)
    elif kind == "mtest":
        terms["loss_triplet_mtest"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "mtest",
                                                        losses.TRI.MARGIN)
        _cluster_terms(c, cfg, terms)
        if c["center_dist"] is not None and losses.CENTER.META_SCALE > 0:
            terms["loss_center"] = center_loss(c["center_dist"], c["targets"]) * losses.CENTER.META_SCALE
    else:
        raise ValueError("unknown step kind %r" % (kind,))
    return terms


@compat.eager_only
def _check_split(n, num_splits):
    if n % num_splits:
        raise compat.UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch "
                               "sizes multiples of NUM_SPLITS" % (n, num_splits))


def objective(kind, out, batch, cfg, offsets, num_splits=1):
    """(total, terms) for one step kind; terms are per-chunk means, total = mean over chunks of their sum.

    `batch` holds `targets` and `domains` (N,) tensors and optionally `present`: per chunk, the sorted domain
    ids it holds (compiled steps must pass it: they cannot read labels on the host, compat/jit.py)."""
    metric_key = metric_feature_key(cfg.MODEL.HEADS.NECK_FEAT)
    n = int(out[metric_key].shape[0])
    num_splits = max(int(num_splits), 1)
    _check_split(n, num_splits)
    summed = {}
    for index, sl in enumerate(_chunks(num_splits, n)):
        for key, value in _chunk_terms(kind, _take(out, batch, sl, index, metric_key), cfg, offsets).items():
            summed[key] = value if key not in summed else summed[key] + value
    terms = {}
    for key, value in summed.items():  # (a loop, not a dict comprehension: compiled code cannot parse those)
        terms[key] = value / num_splits
    total = None
    for value in terms.values():
        total = value if total is None else total + value
    return total, terms
