"""Label-smoothed cross-entropy, per source domain (docs/method.md#loss-ce).

fast-reid's `cross_entropy_loss`: soft target 1-eps on the true class and eps/(C-1) on the others, per-sample
loss sum(-target * log_softmax), and the batch sum divided by the number of samples whose loss is non-zero
(at least 1): in practice a mean. ACL applies it per domain, on that domain's classifier and samples with
local labels, times `scale`, and averages over the domains present in the batch.
"""
import numpy as np

from compat import torch, F
from reid.errors import UserError
from reid.losses.utils import host_ints


def _smoothed_targets(local_labels, num_classes, epsilon):
    onehot = F.one_hot(local_labels, num_classes).float()
    if num_classes == 1:  # the original's eps/(C-1) is overwritten by the true class when C == 1
        return onehot * (1.0 - epsilon)
    return onehot * (1.0 - epsilon) + (1.0 - onehot) * (epsilon / (num_classes - 1))


def _per_sample_loss(logits, targets, epsilon):
    log_probs = F.log_softmax(logits, dim=1)
    return (-_smoothed_targets(targets, int(logits.shape[1]), float(epsilon)) * log_probs).sum(1)


def _mean_over_non_zero(per_sample):
    # the divisor is a count of the (detached) non-zero per-sample losses, as in the original's no_grad block
    return per_sample.sum() / (per_sample != 0).float().sum().clamp(min=1.0)


def _check_epsilon(epsilon):
    if not 0.0 <= float(epsilon) < 1.0:
        raise UserError("MODEL.LOSSES.CE.EPSILON must be in [0, 1), got %r" % (epsilon,))


def cross_entropy_loss(logits, targets, epsilon=0.1):
    """fast-reid CE with label smoothing on one classifier: `logits` (N, C), `targets` (N,) in [0, C)."""
    if not torch.compiler.is_compiling():
        _check_epsilon(epsilon)
    return _mean_over_non_zero(_per_sample_loss(logits, targets, epsilon))


def _check_per_domain(targets, domains, offsets, sizes):
    """The label checks of cross_entropy_per_domain (op by op only; the data layer guarantees them for compiled
    steps). Returns the present domain ids."""
    tgt = host_ints(targets, "targets")
    dom = host_ints(domains, "domains")
    if tgt.shape != dom.shape:
        raise UserError("targets (%d) and domains (%d) must have one entry per sample" % (tgt.size, dom.size))
    if len(offsets) != len(sizes):
        raise UserError("need one label offset per classifier: %d offsets for %d classifiers"
                        % (len(offsets), len(sizes)))
    present = [int(d) for d in np.unique(dom)]
    if not present:
        raise UserError("cross_entropy_per_domain got an empty batch")
    for d in present:
        if not 0 <= d < len(sizes):
            raise UserError("domain id %d has no classifier (there are %d source domains)" % (d, len(sizes)))
        local = tgt[dom == d] - int(offsets[d])
        if local.min() < 0 or local.max() >= sizes[d]:
            raise UserError("labels of domain %d fall outside its classifier's %d classes after subtracting offset "
                            "%d; training labels must be relabelled domain by domain in DATASETS.NAMES order"
                            % (d, sizes[d], int(offsets[d])))
    return present


def _per_domain_by_weights(logits_list, targets, domains, offsets, epsilon, scale):
    """The same loss inside compiled steps, which build one graph whatever domains the batch holds
    (reid/engine/steps.py): every classifier's term, weighted 1 where the batch holds its domain and 0 where
    not, over the sum of the weights. An absent domain's term is exactly 0 (all its rows are masked out), so
    this is the mean over the present domains."""
    total, weights = None, None
    for k in range(len(logits_list)):
        mask = (domains == k).long()
        per_sample = _per_sample_loss(logits_list[k], (targets.long() - int(offsets[k])) * mask, epsilon)
        weight = (mask.float().sum() > 0).float()
        term = _mean_over_non_zero(per_sample * mask.float()) * scale * weight
        total = term if total is None else total + term
        weights = weight if weights is None else weights + weight
    return total / weights


def cross_entropy_per_domain(logits_list, targets, domains, offsets, epsilon=0.1, scale=0.5, return_present=False,
                             present=None):
    """ACL's classification loss: mean over present domains d of scale * CE(logits_list[d][rows of d], y - offsets[d]).

    logits_list: one (N, n_d) tensor per source domain (every sample through every classifier);
    targets: (N,) global labels (relabelled domain by domain); domains: (N,) source index of each sample;
    offsets: first global label of each domain. With return_present, returns (loss, present domain ids):
    a classifier whose domain is absent got no gradient in the original (torch's None), see the trainer.
    present: the sorted domain ids the batch holds, when the caller knows them; else they are read from
    `domains`. Compiled steps, which cannot read labels on the host, weigh every classifier by whether the batch
    holds its domain instead (`_per_domain_by_weights`).
    """
    if torch.compiler.is_compiling():
        return _per_domain_by_weights(logits_list, targets, domains, offsets, epsilon, scale)
    found = _check_per_domain(targets, domains, list(offsets), [int(l.shape[1]) for l in logits_list])
    if present is None:
        present = found
    total = None
    for d in present:
        # Every row goes through the classifier and the rows of other domains are masked out, instead of
        # selecting the domain's rows: the graph keeps its shapes whatever the batch holds, which MindSpore's
        # cached backward needs (compat/autograd.py); the loss and its gradients are the same.
        mask = (domains == d).long()
        per_sample = _per_sample_loss(logits_list[d], (targets.long() - int(offsets[d])) * mask, epsilon)
        term = _mean_over_non_zero(per_sample * mask.float()) * scale
        total = term if total is None else total + term
    loss = total / len(present)
    return (loss, present) if return_present else loss
