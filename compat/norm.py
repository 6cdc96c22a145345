"""Batch and instance normalisation with exact PyTorch semantics on both backends.

MSAdapter gets these wrong or lacks them on CPU: its BatchNorm keeps a *biased* running variance,
`F.batch_norm(training=True)` never updates the running tensors it is given, and `F.instance_norm` /
`InstanceNorm2d` fail. So on MindSpore both ops are built from basic reductions; on torch the native
kernels are used where they have the same semantics.

batch_norm modes (the ACL "type_running_stats"):
  'general'  batch statistics; running_mean / running_var updated in place with torch's momentum
             convention (new = (1-m)*old + m*batch) and the UNBIASED batch variance
  'hold'     batch statistics; running statistics neither read nor written
  'eval'     running statistics
`num_splits` > 1 emulates nn.DataParallel over that many contiguous chunks: statistics per chunk, running
statistics updated from chunk 0 only (the replica whose buffers alias the module's).
"""
import compat as _c
from compat.errors import UserError
from compat.tensor import assign_

MODES = ("general", "hold", "eval")


def _reduce_dims(ndim):
    if ndim not in (2, 3, 4):
        raise ValueError("batch_norm expects (N,C), (N,C,L) or (N,C,H,W) input, got %d dims" % ndim)
    return (0,) + tuple(range(2, ndim))


def _affine(y, weight, bias, ndim):
    shape = (1, -1) + (1,) * (ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _update_running(running_mean, running_var, mean, var_biased, count, momentum):
    if running_mean is None:
        return
    mean = mean.detach()
    var_unbiased = var_biased.detach() * (float(count) / max(count - 1, 1))
    assign_(running_mean, running_mean * (1.0 - momentum) + mean * momentum)
    assign_(running_var, running_var * (1.0 - momentum) + var_unbiased * momentum)


def batch_norm(x, running_mean, running_var, weight=None, bias=None, mode="general", momentum=0.1, eps=1e-5,
               num_splits=1):
    if mode not in MODES:
        raise ValueError("batch_norm mode must be one of %s, got %r" % (MODES, mode))
    torch, F = _c.torch, _c.F
    ndim = x.dim()
    if mode == "eval":
        if _c.IS_MINDSPORE:
            shape = (1, -1) + (1,) * (ndim - 2)
            y = (x - running_mean.reshape(shape)) / torch.sqrt(running_var.reshape(shape) + eps)
            return _affine(y, weight, bias, ndim)
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)

    num_splits = int(num_splits)
    n = x.shape[0]
    if num_splits > 1:
        if n % num_splits:
            raise UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch "
                            "size a multiple of NUM_SPLITS" % (n, num_splits))
        return _split_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps, num_splits)

    if not _c.IS_MINDSPORE:
        if mode == "general":
            return F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
        return F.batch_norm(x, None, None, weight, bias, True, 0.0, eps)

    dims = _reduce_dims(ndim)
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dims, keepdim=True)
    y = centred / torch.sqrt(var + eps)
    if mode == "general":
        count = x.numel() // x.shape[1]
        _update_running(running_mean, running_var, mean.reshape(-1), var.reshape(-1), count, momentum)
    return _affine(y, weight, bias, ndim)


def _split_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps, num_splits):
    torch = _c.torch
    ndim = x.dim()
    shape = tuple(x.shape)
    chunks = x.reshape((num_splits, shape[0] // num_splits) + shape[1:])
    dims = (1,) + tuple(range(3, ndim + 1))
    mean = chunks.mean(dims, keepdim=True)
    centred = chunks - mean
    var = (centred * centred).mean(dims, keepdim=True)
    y = (centred / torch.sqrt(var + eps)).reshape(shape)
    if mode == "general":
        count = chunks[0].numel() // shape[1]
        _update_running(running_mean, running_var, mean[0].reshape(-1), var[0].reshape(-1), count, momentum)
    return _affine(y, weight, bias, ndim)


def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """Per-sample, per-channel normalisation over the spatial dims (affine, no running statistics)."""
    if not _c.IS_MINDSPORE:
        return _c.F.instance_norm(x, None, None, weight, bias, True, 0.1, eps)
    ndim = x.dim()
    dims = tuple(range(2, ndim))
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dims, keepdim=True)
    y = centred / _c.torch.sqrt(var + eps)
    return _affine(y, weight, bias, ndim)
