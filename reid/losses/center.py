"""Center loss on the head's squared distances to the class centers (docs/method.md#loss-center)."""

from compat import torch, F
from reid.errors import UserError
from reid.losses.utils import host_ints


def center_loss(center_dist, targets):
    """mean_i ||f_i - c_{y_i}||^2 from `center_dist` (N, num_classes) squared distances and global `targets` (N,).

    Reproduces the original's clamp(1e-12, 1e12) on the *masked* (N, C) matrix: every masked-out entry adds
    1e-12, i.e. a constant (C-1)*1e-12 per sample with no gradient.
    """
    n, num_classes = int(center_dist.shape[0]), int(center_dist.shape[1])
    if not torch.compiler.is_compiling():  # host reads: op by op only
        _check_center(targets, n, num_classes)
    mask = F.one_hot(targets.long(), num_classes).float()
    return (center_dist * mask).clamp(min=1e-12, max=1e12).sum() / n


def _check_center(targets, n, num_classes):
    tgt = host_ints(targets, "targets")
    if tgt.size != n:
        raise UserError("center_loss: %d targets for %d rows of center distances" % (tgt.size, n))
    if n == 0:
        raise UserError("center_loss got an empty batch")
    if tgt.min() < 0 or tgt.max() >= num_classes:
        raise UserError("center_loss: labels must lie in [0, %d) (the number of centers), got %d..%d"
                        % (num_classes, int(tgt.min()), int(tgt.max())))
