"""Domain-level losses: MetaBIN's shuffled-center L_SCT and ACL's domain-aware cluster losses on the router
weights (docs/method.md#loss-sct, #loss-cluster). Loops run over the (at most a handful of) domains, never
over samples."""
import compat
from compat import F
from compat.errors import UserError
from reid.losses.utils import host_ints, normalize, safe_norm, safe_sqrt

CENTROIDS = ("scalar", "vector")


@compat.eager_only
def _present(domains):
    return sorted(set(host_ints(domains, "domains").tolist()))


def _domain_masks(domains, present=None):
    """[((N,) float mask, count)] for the domains present, in increasing id order (`present`: those ids
    when the caller knows them, as compiled steps must, as ints or 0-d tensors; else read from `domains`). The
    count is a tensor computed from the mask, not a host number: constants whose value changes from batch to
    batch would make MindSpore's cached backward graph dynamic (compat/autograd.py)."""
    if present is None:
        present = _present(domains)
    out = ()  # a tuple: a list of tuples of tensors fails to compile in places (compat/jit.py)
    for d in present:  # d: an int, or in compiled steps a 0-d tensor (reid/engine/steps.py)
        mask = (domains == d).float()
        out = out + ((mask, mask.sum()),)
    return out


def domain_sct_loss(embedding, domains, norm_feat=True, present=None):
    """L_SCT (`domain_SCT_loss`, type 'cosine_sim'): mean over present domains of mean_i cos(center_d, f_i),
    center_d = the mean feature of domain d. Minimising it spreads each domain's features apart.

    The original stacked the per-domain features and so required equal per-domain counts; this takes any.
    """
    if norm_feat:
        embedding = normalize(embedding, axis=-1)
    masks = _domain_masks(domains, present)
    _check_not_empty(len(masks), "domain_sct_loss")
    feat_norm = safe_norm(embedding, 1)
    total = None
    for mask, count in masks:
        center = (embedding * mask.unsqueeze(1)).sum(0) / count
        cos = (embedding * center.unsqueeze(0)).sum(1) / (feat_norm * safe_norm(center, 0))
        term = (cos * mask).sum() / count
        total = term if total is None else total + term
    return total / len(masks)


@compat.eager_only
def _check_not_empty(count, name):
    if not count:
        raise UserError("%s got an empty batch" % name)


@compat.eager_only
def _check_centroid(centroid):
    if centroid not in CENTROIDS:
        raise UserError("MODEL.LOSSES.CLUSTER.CENTROID must be one of %s, got %r" % (", ".join(CENTROIDS), centroid))


def _centroid(p, mask, count, centroid):
    _check_centroid(centroid)
    member = p * mask.unsqueeze(1)
    if centroid == "scalar":  # the original's p[domain == d].mean(): one number over all rows and dimensions
        return member.sum() / (count * int(p.shape[1]))
    return member.sum(0) / count


def intra_cluster_loss(paths, domains, margin=0.1, centroid="scalar", present=None):
    """L_intra: mean over present domains d of mean_{i in d} ReLU(||p_i - m_d||_2 - margin)^2 on p = L2-normalised
    router weights. centroid 'scalar' reproduces the original (m_d is the mean of every element of the
    domain's rows, broadcast); 'vector' uses the per-dimension centroid."""
    p = compat.normalize(paths, 2, 1)
    masks = _domain_masks(domains, present)
    _check_not_empty(len(masks), "intra_cluster_loss")
    total = None
    for mask, count in masks:
        m = _centroid(p, mask, count, centroid)
        dist = safe_norm(p - m, 1)
        term = ((F.relu(dist - margin) ** 2) * mask).sum() / count
        total = term if total is None else total + term
    return total / len(masks)


def inter_cluster_loss(paths, domains, margin=0.3, centroid="scalar", present=None):
    """L_inter: mean over pairs of present domains of ReLU(margin - ||m_i - m_j||)^2 (same centroids as
    intra_cluster_loss). With fewer than 2 domains present it returns the original's constant fall-back,
    domains.float().mean(), which carries no gradient."""
    p = compat.normalize(paths, 2, 1)
    masks = _domain_masks(domains, present)
    if len(masks) < 2:
        return domains.float().mean()
    means = [_centroid(p, mask, count, centroid) for mask, count in masks]
    total, count = None, 0
    for i in range(len(means)):
        for j in range(i + 1, len(means)):
            diff = means[i] - means[j]
            dist = safe_sqrt(diff * diff) if centroid == "scalar" else safe_norm(diff, 0)
            term = F.relu(margin - dist) ** 2
            total = term if total is None else total + term
            count += 1
    return total / count
