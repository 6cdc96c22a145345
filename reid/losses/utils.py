"""Pieces shared by the ACL losses: distances, normalisation, label bookkeeping.

Everything here is plain torch, vectorised over samples (no Python loops over rows).
"""
import numpy as np

from compat import torch, F
from reid.errors import UserError


def normalize(x, axis=-1):
    """x / (||x||_2 + 1e-12): fast-reid's `normalize` (the epsilon is added, unlike F.normalize's clamp)."""
    return x / (torch.norm(x, 2.0, axis, keepdim=True) + 1e-12)


def euclidean_dist(x, y):
    """(m, n) Euclidean distances sqrt(clamp(|x|^2 + |y|^2 - 2 x.y, 1e-12)) (so the diagonal is 1e-6, not 0)."""
    xx = (x * x).sum(1).reshape(-1, 1)  # (no keepdim=: compiled code runs MindSpore's tensor methods)
    yy = (y * y).sum(1).reshape(1, -1)
    dist = xx + yy - 2 * torch.matmul(x, y.t())
    return dist.clamp(min=1e-12).sqrt()


def cosine_dist(x, y):
    """(m, n) cosine distances 2 - 2 cos(x_i, y_j)."""
    return 2 - 2 * torch.matmul(F.normalize(x, 2.0, 1), F.normalize(y, 2.0, 1).t())


def safe_sqrt(sq):
    """sqrt with value 0 and gradient 0 where sq == 0 (torch.norm's backward convention; plain sqrt gives NaN)."""
    positive = (sq > 0).float()
    return (sq + (1.0 - positive)).sqrt() * positive


def safe_norm(x, dim):
    """L2 norm over `dim` whose gradient is 0 (not NaN) at the zero vector, like torch.norm's backward."""
    return safe_sqrt((x * x).sum(dim))


def host_ints(t, name):
    """A 1-D integer tensor (or array/list) as a numpy int64 array, for bookkeeping that decides Python branches."""
    arr = np.asarray(t.detach().cpu().numpy() if torch.is_tensor(t) else t)
    if arr.ndim != 1:
        raise UserError("%s must be a 1-D vector of integer labels, got shape %s" % (name, arr.shape))
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise UserError("%s must hold integer labels, got dtype %s" % (name, arr.dtype))
    return arr.astype(np.int64)
