"""Domain-level losses: MetaBIN's shuffled-center L_SCT and ACL's domain-aware cluster losses on the router
weights (docs/method.md#loss-sct, #loss-cluster). Loops run over the (at most a handful of) domains, never
over samples."""
from compat import torch, F
from reid.errors import UserError
from reid.losses.utils import host_ints, normalize, safe_norm, safe_sqrt

CENTROIDS = ("scalar", "vector")


def _present(domains):
    return sorted(set(host_ints(domains, "domains").tolist()))


def _domain_masks(domains, present=None):
    """[((N,) float mask, count, weight)] for the domain ids `present` (else the ids read from `domains`), in
    that order; an id is an int, or in compiled meta steps a 0-d tensor. The compiled basic step passes every
    source domain's id (reid/engine/steps.py: one graph whatever the batch holds): a domain the batch lacks gets
    weight 0 (its mask is empty), every other weight 1, and its count is taken as 1 so that nothing divides by
    0. Each loss below is sum_d weight_d * term_d / sum_d weight_d: over the domains present exactly the mean
    over them (times 1.0, plus 0.0), as op by op. Counts and weights are tensors computed from the masks, not
    host numbers: constants whose value changes from batch to batch would make MindSpore's cached backward
    graph dynamic (compat/autograd.py)."""
    if present is None:
        present = _present(domains)
    out = ()  # a tuple: a list of tuples of tensors fails to compile in places (compat/jit.py)
    for d in present:
        mask = (domains == d).float()
        count = mask.sum()
        out = out + ((mask, count.clamp(min=1.0), (count > 0).float()),)
    return out


def _weighted_mean(terms_and_weights):
    total, weights = None, None
    for term, weight in terms_and_weights:
        total = term * weight if total is None else total + term * weight
        weights = weight if weights is None else weights + weight
    return total / weights


def domain_sct_loss(embedding, domains, norm_feat=True, present=None):
    """L_SCT (`domain_SCT_loss`, type 'cosine_sim'): mean over present domains of mean_i cos(center_d, f_i),
    center_d = the mean feature of domain d. Minimising it spreads each domain's features apart.

    The original stacked the per-domain features and so required equal per-domain counts; this takes any.
    """
    if norm_feat:
        embedding = normalize(embedding, axis=-1)
    masks = _domain_masks(domains, present)
    if not torch.compiler.is_compiling():
        _check_not_empty(len(masks), "domain_sct_loss")
    feat_norm = safe_norm(embedding, 1)
    terms = ()
    for mask, count, weight in masks:
        center = (embedding * mask.unsqueeze(1)).sum(0) / count
        # an absent domain's center is 0: + (1 - weight) keeps its (masked-out) cosines at 0, not 0 / 0
        cos = (embedding * center.unsqueeze(0)).sum(1) / (feat_norm * safe_norm(center, 0) + (1.0 - weight))
        terms = terms + (((cos * mask).sum() / count, weight),)
    return _weighted_mean(terms)


def _check_not_empty(count, name):
    if not count:
        raise UserError("%s got an empty batch" % name)


def _check_centroid(centroid):
    if centroid not in CENTROIDS:
        raise UserError("MODEL.LOSSES.CLUSTER.CENTROID must be one of %s, got %r" % (", ".join(CENTROIDS), centroid))


def _centroid(p, mask, count, centroid):
    if not torch.compiler.is_compiling():
        _check_centroid(centroid)
    member = p * mask.unsqueeze(1)
    if centroid == "scalar":  # the original's p[domain == d].mean(): one number over all rows and dimensions
        return member.sum() / (count * int(p.shape[1]))
    return member.sum(0) / count


def intra_cluster_loss(paths, domains, margin=0.1, centroid="scalar", present=None):
    """L_intra: mean over present domains d of mean_{i in d} ReLU(||p_i - m_d||_2 - margin)^2 on p = L2-normalised
    router weights. centroid 'scalar' reproduces the original (m_d is the mean of every element of the
    domain's rows, broadcast); 'vector' uses the per-dimension centroid."""
    p = F.normalize(paths, 2.0, 1)
    masks = _domain_masks(domains, present)
    if not torch.compiler.is_compiling():
        _check_not_empty(len(masks), "intra_cluster_loss")
    terms = ()
    for mask, count, weight in masks:
        m = _centroid(p, mask, count, centroid)
        dist = safe_norm(p - m, 1)
        terms = terms + ((((F.relu(dist - margin) ** 2) * mask).sum() / count, weight),)
    return _weighted_mean(terms)


def inter_cluster_loss(paths, domains, margin=0.3, centroid="scalar", present=None):
    """L_inter: mean over pairs of present domains of ReLU(margin - ||m_i - m_j||)^2 (same centroids as
    intra_cluster_loss). With fewer than 2 domains present it returns the original's constant fall-back,
    domains.float().mean(), which carries no gradient (compiled, where every source domain's id comes in, the
    choice is made on the number of present pairs, as a tensor)."""
    p = F.normalize(paths, 2.0, 1)
    masks = _domain_masks(domains, present)
    fallback = domains.float().mean()
    if len(masks) < 2:
        return fallback
    means = [_centroid(p, mask, count, centroid) for mask, count, _ in masks]
    total, pairs = None, None
    for i in range(len(means)):
        for j in range(i + 1, len(means)):
            diff = means[i] - means[j]
            dist = safe_sqrt(diff * diff) if centroid == "scalar" else safe_norm(diff, 0)
            both = masks[i][2] * masks[j][2]
            term = F.relu(margin - dist) ** 2 * both
            total = term if total is None else total + term
            pairs = both if pairs is None else pairs + both
    has_pairs = (pairs > 0).float()  # (a blend of the two values)
    return total / pairs.clamp(min=1.0) * has_pairs + fallback * (1.0 - has_pairs)
