"""Batch and instance normalisation with exact PyTorch semantics on both backends.

MSAdapter gets these wrong or lacks them on CPU: its BatchNorm keeps a *biased* running variance,
`F.batch_norm(training=True)` never updates the running tensors it is given, and `F.instance_norm` /
`InstanceNorm2d` fail. On MindSpore both ops therefore run MindSpore's fused `ops.BatchNorm` kernel (forward
and backward; composing the same maths from adapter ops costs ~5x more per layer) and torch's running-
statistics rule is applied on top: the kernel writes the batch mean and *biased* variance into scratch
statistics (momentum 1), from which the running tensors get torch's update with the unbiased variance.
Instance norm is the same kernel on the (1, N*C, H, W) view. On torch the native kernels are used.

batch_norm modes (the ACL "type_running_stats"):
  'general'  batch statistics; running_mean / running_var updated in place with torch's momentum
             convention (new = (1-m)*old + m*batch) and the UNBIASED batch variance
  'hold'     batch statistics; running statistics neither read nor written
  'eval'     running statistics
`num_splits` > 1 emulates nn.DataParallel over that many contiguous chunks: statistics per chunk, running
statistics updated from chunk 0 only (the replica whose buffers alias the module's).
"""
import numpy as np

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
    F = _c.F
    ndim = x.dim()
    if mode == "eval":
        if _c.IS_MINDSPORE:
            return _ms_batch_norm(x, weight, bias, eps, running_mean, running_var)
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

    _reduce_dims(ndim)
    update = (running_mean, running_var, momentum) if mode == "general" else None
    return _ms_batch_norm(x, weight, bias, eps, update=update)


def _split_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps, num_splits):
    if _c.IS_MINDSPORE:
        size = x.shape[0] // num_splits
        update = (running_mean, running_var, momentum) if mode == "general" else None
        outs = [_ms_batch_norm(x[i * size:(i + 1) * size], weight, bias, eps, update=update if i == 0 else None)
                for i in range(num_splits)]
        return _c.torch.cat(outs, 0)
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
    shape = tuple(x.shape)
    n = shape[0]
    # the affine goes into the kernel as per-(sample, channel) scale/offset: fewer ops than a separate affine
    scale = weight.repeat(n) if weight is not None and n > 1 else weight
    offset = bias.repeat(n) if bias is not None and n > 1 else bias
    y = _ms_batch_norm(x.reshape((1, n * shape[1]) + shape[2:]), scale, offset, eps)
    return y.reshape(shape)


# --------------------------------------------------------------------------- MindSpore fused kernel
_MS = {}


def _ms_constants(channels):
    """Per channel count: ones, zeros and the scratch statistics the fused kernel writes into."""
    if channels not in _MS:
        import mindspore
        zeros, ones = np.zeros(channels, np.float32), np.ones(channels, np.float32)
        _MS[channels] = dict(
            ones=mindspore.Tensor(ones), zeros=mindspore.Tensor(zeros),
            mean=mindspore.Parameter(mindspore.Tensor(zeros), name="bn_scratch_mean_%d" % channels,
                                     requires_grad=False),
            var=mindspore.Parameter(mindspore.Tensor(ones), name="bn_scratch_var_%d" % channels, requires_grad=False))
    return _MS[channels]


def _ms_kernel(training, eps):
    key = ("kernel", training, float(eps))
    if key not in _MS:
        from mindspore import ops
        # momentum 1: the scratch statistics become the batch mean and biased variance of this call
        _MS[key] = ops.BatchNorm(is_training=training, epsilon=float(eps), momentum=1.0)
    return _MS[key]


def _to_unbiased(count):
    """Factor that turns the kernel's scratch variance into the unbiased one: count/(count-1) where the kernel
    writes the biased variance (MindSpore 2.0), 1 where it already writes the unbiased one (MindSpore 2.6).
    Asked of the kernel once, on two values whose variances differ (biased 1, unbiased 2)."""
    if "kernel_var_unbiased" not in _MS:
        import mindspore
        const = _ms_constants(1)
        x = mindspore.Tensor(np.array([-1.0, 1.0], np.float32).reshape(2, 1, 1, 1))
        _ms_kernel(True, 1e-5)(x, const["ones"], const["zeros"], const["mean"], const["var"])
        _MS["kernel_var_unbiased"] = bool(const["var"].asnumpy()[0] > 1.5)
    return 1.0 if _MS["kernel_var_unbiased"] else float(count) / max(count - 1, 1)


def _ms_batch_norm(x, weight, bias, eps, running_mean=None, running_var=None, update=None):
    """Fused batch norm on MindSpore. With running tensors: evaluation (normalise with them). Without: batch
    statistics; `update=(running_mean, running_var, momentum)` then applies torch's running-statistics rule
    (unbiased variance) from the scratch statistics, right after the kernel wrote them (ops run in order)."""
    torch = _c.torch
    shape = tuple(x.shape)
    channels = shape[1]
    x4 = x.reshape(shape + (1,) * (4 - len(shape))) if len(shape) < 4 else x
    const = _ms_constants(channels)
    scale = weight if weight is not None else const["ones"]
    offset = bias if bias is not None else const["zeros"]
    if running_mean is not None:
        y = torch.cast_to_adapter_tensor(_ms_kernel(False, eps)(x4, scale, offset, running_mean, running_var)[0])
        return y if len(shape) == 4 else y.reshape(shape)
    y = _ms_kernel(True, eps)(x4, scale, offset, const["mean"], const["var"])[0]
    if update is not None:
        from mindspore import ops
        rm, rv, momentum = update
        count = int(np.prod(shape)) // channels  # from the shape: Tensor.numel() is a device op + sync on MindSpore
        ops.assign(rm, ops.lerp(rm, const["mean"], float(momentum)))
        ops.assign(rv, ops.lerp(rv, const["var"] * _to_unbiased(count), float(momentum)))
    y = torch.cast_to_adapter_tensor(y)
    return y if len(shape) == 4 else y.reshape(shape)
