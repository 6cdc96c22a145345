"""The ACL training objectives (docs/method.md#basic-step, #meta-step): which loss terms each step adds up.

Every objective maps the model's train-mode outputs and the batch to ``(total, terms)``: ``total`` is the
scalar to differentiate and ``terms`` the individual (weighted) loss values for logging. With
``num_splits`` > 1 each term is computed per contiguous chunk and the chunk totals are averaged, which is
what the original's nn.DataParallel over 4 GPUs did (docs/method.md#dataparallel).
"""
from compat import torch
from reid.errors import UserError
from reid.losses import (center_loss, cross_entropy_per_domain, domain_sct_loss, inter_cluster_loss,
                         intra_cluster_loss, triplet_loss, triplet_loss_meta)

# MODEL.HEADS.NECK_FEAT -> the head output the metric losses (triplet, meta triplet, SCT) use: "after" the
# L2-normalised BNNeck feature (the original's setting), "before" the pooled feature, un-normalised. The
# evaluation feature is the BNNeck output either way, as in the original.
METRIC_FEATURES = {"after": "feat_norm", "before": "features"}


def _check_neck_feat(neck_feat):
    if neck_feat not in METRIC_FEATURES:
        raise UserError("MODEL.HEADS.NECK_FEAT must be one of %s, got %r" % (", ".join(METRIC_FEATURES), neck_feat))


def metric_feature_key(neck_feat):
    """The head output the metric losses use (the check is skipped while a graph is built:
    `torch.compiler.is_compiling()`; loss_settings calls it op by op, before any graph)."""
    if not torch.compiler.is_compiling():
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
    # (a dict literal: compiled code cannot build dicts with dict(**keywords))
    return {"metric_feat": out[metric_key][sl], "logits": logits, "center_dist": center, "paths": paths,
            "targets": batch["targets"][sl], "domains": batch["domains"][sl], "present": present}


def loss_settings(cfg):
    """The loss settings the objectives read, as plain Python values: built once from the config, so that
    the differentiated (possibly compiled) step functions never read the yacs config (a compiled graph
    cannot: compat/jit.py). Checks MODEL.HEADS.NECK_FEAT."""
    losses = cfg.MODEL.LOSSES
    cl = losses.CLUSTER
    return {"metric_key": metric_feature_key(cfg.MODEL.HEADS.NECK_FEAT),
            "ce_epsilon": float(losses.CE.EPSILON), "ce_scale": float(losses.CE.SCALE),
            "tri_margin": float(losses.TRI.MARGIN), "tri_scale": float(losses.TRI.SCALE),
            "center_scale": float(losses.CENTER.SCALE), "center_meta_scale": float(losses.CENTER.META_SCALE),
            "cluster": bool(cl.ENABLED), "intra_margin": float(cl.INTRA_MARGIN),
            "inter_margin": float(cl.INTER_MARGIN), "centroid": str(cl.CENTROID), "sct_scale": float(losses.SCT.SCALE)}


def _cluster_terms(c, s):
    """(intra, inter) cluster losses, or None. (Returned, not written into the caller's dict: compiled code
    passes containers by value, so a callee's writes would be lost there without an error.)"""
    if c["paths"] is None or not s["cluster"]:
        return None
    return (intra_cluster_loss(c["paths"], c["domains"], s["intra_margin"], s["centroid"], c["present"]),
            inter_cluster_loss(c["paths"], c["domains"], s["inter_margin"], s["centroid"], c["present"]))


def _chunk_terms(kind, c, s, offsets):
    terms = {}
    if kind == "basic":
        terms["loss_cls"] = cross_entropy_per_domain(c["logits"], c["targets"], c["domains"], offsets,
                                                     s["ce_epsilon"], s["ce_scale"], present=c["present"])
        terms["loss_triplet"] = triplet_loss(c["metric_feat"], c["targets"], s["tri_margin"]) * s["tri_scale"]
        cluster = _cluster_terms(c, s)
        if cluster is not None:
            terms["loss_intra"] = cluster[0]
            terms["loss_inter"] = cluster[1]
        if c["center_dist"] is not None and s["center_scale"] > 0:
            terms["loss_center"] = center_loss(c["center_dist"], c["targets"]) * s["center_scale"]
    elif kind == "mtrain":
        terms["loss_triplet_add"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "add")
        terms["loss_triplet_mtrain"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "mtrain",
                                                         s["tri_margin"])
        terms["loss_sct"] = domain_sct_loss(c["metric_feat"], c["domains"], present=c["present"]) * s["sct_scale"]
        cluster = _cluster_terms(c, s)
        if cluster is not None:
            terms["loss_intra"] = cluster[0]
            terms["loss_inter"] = cluster[1]
    elif kind == "mtest":
        terms["loss_triplet_mtest"] = triplet_loss_meta(c["metric_feat"], c["targets"], c["domains"], "mtest",
                                                        s["tri_margin"])
        cluster = _cluster_terms(c, s)
        if cluster is not None:
            terms["loss_intra"] = cluster[0]
            terms["loss_inter"] = cluster[1]
        if c["center_dist"] is not None and s["center_meta_scale"] > 0:
            terms["loss_center"] = center_loss(c["center_dist"], c["targets"]) * s["center_meta_scale"]
    else:
        raise ValueError("unknown step kind %r" % (kind,))
    return terms


def _check_split(n, num_splits):
    if n % num_splits:
        raise UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch "
                        "sizes multiples of NUM_SPLITS" % (n, num_splits))


def objective(kind, out, batch, cfg, offsets, num_splits=1):
    """(total, terms) for one step kind; terms are per-chunk means, total = mean over chunks of their sum.

    `batch` holds `targets` and `domains` (N,) tensors and optionally `present`: per chunk, the sorted domain
    ids it holds (compiled steps must pass it: they cannot read labels on the host, compat/jit.py).
    `cfg`: the config; compiled code calls `step_objective` with `loss_settings(cfg)` instead."""
    return step_objective(kind, out, batch, loss_settings(cfg), offsets, num_splits)


def step_objective(kind, out, batch, settings, offsets, num_splits=1):
    """`objective` on the plain `loss_settings` (what the step functions capture: reid/engine/steps.py)."""
    metric_key = settings["metric_key"]
    n = int(out[metric_key].shape[0])
    num_splits = max(int(num_splits), 1)
    if not torch.compiler.is_compiling():  # host-side check: op by op only
        _check_split(n, num_splits)
    per_chunk = []
    for index, sl in enumerate(_chunks(num_splits, n)):
        per_chunk.append(_chunk_terms(kind, _take(out, batch, sl, index, metric_key), settings, offsets))
    # every chunk has the same terms; plain loops with reads only (compiled code cannot parse dict
    # comprehensions, and membership tests on a dict being filled failed to compile)
    terms, total = {}, None
    for key in per_chunk[0].keys():
        value = per_chunk[0][key]
        for other in per_chunk[1:]:
            value = value + other[key]
        value = value / num_splits
        terms[key] = value
        total = value if total is None else total + value
    return total, terms
