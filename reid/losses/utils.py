"""Pieces shared by the ACL losses: distances, normalisation, domain bookkeeping, DataParallel-style chunking.

Everything here is torch-style code on `compat`, vectorised over samples (no Python loops over rows).
"""
import numpy as np

import compat
from compat import torch
from compat.errors import UserError


def normalize(x, axis=-1):
    """x / (||x||_2 + 1e-12): fast-reid's `normalize` (the epsilon is added, unlike F.normalize's clamp)."""
    return x / (compat.vector_norm(x, 2.0, axis) + 1e-12)


def euclidean_dist(x, y):
    """(m, n) Euclidean distances sqrt(clamp(|x|^2 + |y|^2 - 2 x.y, 1e-12)) (so the diagonal is 1e-6, not 0)."""
    xx = (x * x).sum(1).reshape(-1, 1)  # (no keepdim=: compiled code runs MindSpore's tensor methods)
    yy = (y * y).sum(1).reshape(1, -1)
    dist = xx + yy - 2 * torch.matmul(x, y.t())
    return dist.clamp(min=1e-12).sqrt()


def cosine_dist(x, y):
    """(m, n) cosine distances 2 - 2 cos(x_i, y_j)."""
    return 2 - 2 * torch.matmul(compat.normalize(x, 2, 1), compat.normalize(y, 2, 1).t())


def safe_sqrt(sq):
    """sqrt with value 0 and gradient 0 where sq == 0 (torch.norm's backward convention; plain sqrt gives NaN)."""
    positive = (sq.detach() > 0).float()
    return (sq + (1.0 - positive)).sqrt() * positive


def safe_norm(x, dim):
    """L2 norm over `dim` whose gradient is 0 (not NaN) at the zero vector, like torch.norm's backward."""
    return safe_sqrt((x * x).sum(dim))


def host_ints(t, name):
    """A 1-D integer tensor (or array/list) as a numpy int64 array, for bookkeeping that decides Python branches."""
    arr = np.asarray(compat.to_numpy(t) if compat.is_tensor(t) else t)
    if arr.ndim != 1:
        raise UserError("%s must be a 1-D vector of integer labels, got shape %s" % (name, arr.shape))
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise UserError("%s must hold integer labels, got dtype %s" % (name, arr.dtype))
    return arr.astype(np.int64)


def present_domains(domains):
    """Sorted list of the domain ids present in a batch (a classifier of an absent domain gets no gradient)."""
    return [int(d) for d in np.unique(host_ints(domains, "domains"))]


def _chunk(obj, i, size):
    if compat.is_tensor(obj):
        return obj[i * size:(i + 1) * size]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_chunk(v, i, size) for v in obj)
    return obj  # None, numbers, strings: shared by every chunk


def _batch_size(objs):
    for obj in objs:
        if compat.is_tensor(obj):
            return int(obj.shape[0])
        if isinstance(obj, (list, tuple)):
            n = _batch_size(obj)
            if n is not None:
                return n
    return None


def split_mean(loss_fn, num_splits, *tensors, **kw):
    """Mean of `loss_fn` over `num_splits` contiguous, equal chunks of the batch (nn.DataParallel emulation).

    The original ran every loss inside each of 4 DataParallel replicas and averaged the 4 scalars
    (acl-dgreid.md C.5). Tensors (also inside lists/tuples, e.g. per-domain logits) are sliced along dim 0;
    other positional and keyword arguments are passed to every chunk unchanged. num_splits 1 = whole batch.
    """
    num_splits = int(num_splits)
    if num_splits <= 1:
        return loss_fn(*tensors, **kw)
    n = _batch_size(tensors)
    if n is None:
        raise UserError("split_mean needs at least one tensor argument to split")
    if n % num_splits:
        raise UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch size "
                        "a multiple of NUM_SPLITS" % (n, num_splits))
    size = n // num_splits
    total = None
    for i in range(num_splits):
        loss = loss_fn(*[_chunk(t, i, size) for t in tensors], **kw)
        total = loss if total is None else total + loss
    return total / num_splits
