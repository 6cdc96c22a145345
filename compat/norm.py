"""Batch and instance normalisation with exact PyTorch semantics on both backends.

Layer-neutral: on MindSpore both ops run MindSpore's fused `ops.BatchNorm` kernel (forward and
backward), never the layer's norms, which get these wrong (mindnlp's mindtorch: affine and statistics
swapped; the layer's table in compat/layers/), and composing the
same maths from the layer's ops costs several times more per layer (docs/performance.md#kernels). torch's
running-statistics rule is applied on top: the kernel, given momentum 0, writes back the statistics it is given
unchanged and returns the batch mean and variance (its 4th and 5th outputs; `probe_kernel` tells which
variance), from which the running tensors get torch's update with the unbiased variance.
Instance norm is the same kernel on the (1, N*C, H, W) view. On torch the native kernels are used.

batch_norm modes (the ACL "type_running_stats"):
  'general'  batch statistics; running_mean / running_var updated in place with torch's momentum
             convention (new = (1-m)*old + m*batch) and the UNBIASED batch variance
  'hold'     batch statistics; running statistics neither read nor written
  'eval'     running statistics
(The model's DataParallel emulation, statistics per contiguous chunk, is model code: reid's MetaBatchNorm
runs one F.batch_norm per chunk.)
"""
import numpy as np

import compat as _c
from compat.graph_mode import eager_only, in_graph, in_grad_graph

MODES = ("general", "hold", "eval")


def _reduce_dims(ndim):
    if ndim not in (2, 3, 4):
        raise ValueError("batch_norm expects (N,C), (N,C,L) or (N,C,H,W) input, got %d dims" % ndim)
    return (0,) + tuple(range(2, ndim))


def batch_norm(x, running_mean, running_var, weight=None, bias=None, mode="general", momentum=0.1, eps=1e-5):
    if mode not in MODES:
        raise ValueError("batch_norm mode must be one of general, hold, eval; got %r" % (mode,))
    if in_graph() and _c.IS_MINDSPORE and (in_grad_graph() or (running_mean is None and mode == "hold")):
        # (a 'hold' batch norm without running statistics, as torch's F.batch_norm(x, None, None, ..., True)
        # takes it: the pure kernel, which writes nothing, in any graph)
        return _stateless_graph_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps)
    if in_graph() and _c.IS_MINDSPORE and weight is not None and bias is not None:
        return _graph_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps)
    F = _c.F
    ndim = x.dim()
    if mode == "eval":
        if _c.IS_MINDSPORE:
            return _ms_batch_norm(x, weight, bias, eps, "eval", running_mean, running_var, momentum)
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)

    if not _c.IS_MINDSPORE:
        if mode == "general":
            return F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
        return F.batch_norm(x, None, None, weight, bias, True, 0.0, eps)

    _reduce_dims(ndim)
    return _ms_batch_norm(x, weight, bias, eps, mode, running_mean, running_var, momentum)


def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """Per-sample, per-channel normalisation over the spatial dims (affine, no running statistics)."""
    if not _c.IS_MINDSPORE:
        return _c.F.instance_norm(x, None, None, weight, bias, True, 0.1, eps)
    if in_graph():
        return _graph_instance_norm(x, weight, bias, eps)
    shape = tuple(x.shape)
    n = shape[0]
    # the affine goes into the kernel as per-(sample, channel) scale/offset: fewer ops than a separate affine
    scale = weight.repeat(n) if weight is not None and n > 1 else weight
    offset = bias.repeat(n) if bias is not None and n > 1 else bias
    y = _ms_batch_norm(x.reshape((1, n * shape[1]) + shape[2:]), scale, offset, eps, "hold")
    return y.reshape(shape)


# --------------------------------------------------------------------------- MindSpore fused kernel
_MS = {}


def _graph_instance_norm(x, weight, bias, eps):
    """Compiled instance norm: the same fused training kernel as op by op, on the (1, N*C, H, W) view, through
    `_stateless_bn` (the kernel without its Parameter-only signature: a graph cannot make Parameters of
    N*C channels). Its per-(sample, channel) scale / offset are the affine tiled N times, its statistics
    inputs constants that momentum 0 writes back unchanged. Forward and gradients equal the op-by-op kernel's
    bit for bit; the reductions it replaces (two means, five full-size elementwise ops) cost several times
    more at full size (per layer shape: docs/performance.md#kernels)."""
    shape = x.shape
    n, nc = shape[0], shape[0] * shape[1]
    # MindSpore primitives only (not the layer's Tensor methods and casts, specialised per call site)
    x4 = _RESHAPE(x, _instance_shape_c(shape))
    ones, zeros = _FILL(_mstype.float32, (nc,), 1.0), _FILL(_mstype.float32, (nc,), 0.0)
    scale = _TILE(weight, (n,)) if weight is not None else ones
    offset = _TILE(bias, (n,)) if bias is not None else zeros
    y = _stateless_bn_c(eps)(x4, scale, offset, zeros, ones)[0]
    return _TO_TORCH(_RESHAPE(y, shape))


def _instance_shape(shape):
    """(1, N*C, H, W) for an (N, C, H[, W]) input: instance norm as batch norm over N*C channels."""
    return (1, shape[0] * shape[1]) + tuple(shape[2:]) + (1,) * (4 - len(shape))


def _stateless_bn(eps):
    """The training BatchNorm kernel as a pure op: the kernel's own class with its signature and side-effect flag
    dropped on the instance (MindSpore 2.7 finds no graph evaluator for a subclass of the kernel's class)."""
    key = ("stateless", float(eps))
    if key not in _BN_PRIMS:
        prim = _P.BatchNorm(is_training=True, epsilon=float(eps), momentum=0.0)
        prim.set_signatures(tuple())
        prim.del_prim_attr("side_effect_mem")
        _BN_PRIMS[key] = prim
    return _BN_PRIMS[key]


@eager_only
def _eager_kernel_inputs(channels, weight, bias, running_mean, running_var):
    """(weight, bias, mean, var) for the training kernel op by op: scratch Parameters (one set per channel
    count) where the caller gives no running statistics as Parameters, ones / zeros for a missing affine."""
    import mindspore
    if isinstance(running_mean, mindspore.Parameter) and isinstance(running_var, mindspore.Parameter):
        stats = (running_mean, running_var)
    else:
        if channels not in _MS:
            zeros, ones = np.zeros(channels, np.float32), np.ones(channels, np.float32)
            _MS[channels] = (mindspore.Parameter(mindspore.Tensor(zeros), name="bn_scratch_mean_%d" % channels,
                                                 requires_grad=False),
                             mindspore.Parameter(mindspore.Tensor(ones), name="bn_scratch_var_%d" % channels,
                                                 requires_grad=False))
        stats = _MS[channels]
    if weight is None:
        weight = mindspore.Tensor(np.ones(channels, np.float32))
    if bias is None:
        bias = mindspore.Tensor(np.zeros(channels, np.float32))
    return weight, bias, stats[0], stats[1]


def _unbiased_batch_var(saved_var, x4, count):
    """The unbiased batch variance, detached, from the training kernel's 5th output. What that output holds
    differs between MindSpore builds and devices (the biased variance on some CPU builds; others may save
    the unbiased variance or an inverse standard deviation), so `probe_kernel` asks the kernel once, before
    any graph is built, and the choice below is made when the graph is built. Where the output is neither
    variance, the variance is recomputed from the input by reductions."""
    kind = _saved_var_kind()  # a compile-time constant inside compiled code
    if kind == "biased":
        return _ops.stop_gradient(saved_var) * (float(count) / max(count - 1, 1))
    if kind == "unbiased":
        return _ops.stop_gradient(saved_var)
    xd = _ops.stop_gradient(x4)
    centred = xd - xd.mean((0, 2, 3), True)
    return (centred * centred).sum((0, 2, 3)) / float(max(count - 1, 1))


def probe_kernel():
    """Ask MindSpore's training batch-norm kernel what its 5th output holds, on two values whose statistics
    tell the cases apart (biased variance 4, unbiased 8, inverse standard deviation ~0.5). Eager, once per
    process; compat.jit.prepare calls it before any graph is built. Returns 'biased', 'unbiased' or 'other'."""
    if "saved_var_kind" not in _MS:
        import mindspore
        x = mindspore.Tensor(np.array([-2.0, 2.0], np.float32).reshape(2, 1, 1, 1))
        ones, zeros = mindspore.Tensor(np.ones(1, np.float32)), mindspore.Tensor(np.zeros(1, np.float32))
        mean = mindspore.Parameter(mindspore.Tensor(np.zeros(1, np.float32)), name="bn_probe_mean", requires_grad=False)
        var = mindspore.Parameter(mindspore.Tensor(np.ones(1, np.float32)), name="bn_probe_var", requires_grad=False)
        saved = float(_P.BatchNorm(is_training=True, epsilon=1e-5, momentum=0.0)(x, ones, zeros, mean, var)[4]
                      .asnumpy().reshape(-1)[0])
        _MS["saved_var_kind"] = "biased" if abs(saved - 4.0) < 1e-3 else "unbiased" if abs(saved - 8.0) < 1e-3 \
            else "other"
    return _MS["saved_var_kind"]


def _graph_batch_var(saved_var, x4):
    """`_unbiased_batch_var` inside a graph being built, in MindSpore primitives where the kernel saved a
    variance (the choice made when the graph is built): the unbiased batch variance of x4, detached."""
    kind = _saved_var_kind()
    if kind == "biased":
        return _STOP_GRADIENT(saved_var) * _bessel_c(x4.shape)
    if kind == "unbiased":
        return _STOP_GRADIENT(saved_var)
    return _unbiased_batch_var(saved_var, x4, _count_c(x4.shape))


def _graph_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps):
    """`_ms_batch_norm` inside a graph being built, written with MindSpore primitives only (each built once per
    configuration in Python: one constant node): the same kernel, outputs and running-statistics update as op
    by op, without the torch-API layer's tensor methods and casts, which a graph specialises per call site
    (a fraction of their nodes per layer; compat/jit.py)."""
    shape = x.shape
    x4 = _RESHAPE(x, _shape4_c(shape)) if len(shape) < 4 else x
    if mode == "eval":
        y = _bn_prim_c(False, eps)(x4, weight, bias, running_mean, running_var)[0]
    else:
        out = _bn_prim_c(True, eps)(x4, weight, bias, running_mean, running_var)
        y = out[0]
        if mode == "general":  # torch's update, old + momentum x (batch - old) (lerp's own arithmetic)
            batch_mean, batch_var = _graph_batch_statistics(out, x4)
            _ASSIGN(running_mean, _LERP(running_mean, batch_mean, float(momentum)))
            _ASSIGN(running_var, _LERP(running_var, batch_var, float(momentum)))
    if len(shape) < 4:
        y = _RESHAPE(y, shape)
    return _TO_TORCH(y)


def _stateless_graph_batch_norm(x, running_mean, running_var, weight, bias, mode, momentum, eps):
    """Batch norm inside a differentiated graph (`compat.jit.value_and_grad`, `in_grad_graph()`), which writes
    no Parameter: the training kernel runs as a pure op (`_stateless_bn`, which writes no moving statistics and
    takes tensors for the affine, fast weights among them), and in mode 'general' torch's running-statistics
    update leaves the graph as the gradient of the running statistics (`_STATISTICS_TAP`), which
    `compat.jit.value_and_grad(..., state=...)` adds to them after the call. A write inside the graph (an
    Assign) gives the same statistics but another graph structure, which rounds the backward differently
    (docs/ms27.md#step-graphs): the tap keeps the compiled steps' recorded trajectories."""
    shape = x.shape
    x4 = _RESHAPE(x, _shape4_c(shape)) if len(shape) < 4 else x
    channels = _channels_c(shape)
    ones, zeros = _FILL(_mstype.float32, channels, 1.0), _FILL(_mstype.float32, channels, 0.0)
    scale = weight if weight is not None else ones
    offset = bias if bias is not None else zeros
    if mode == "eval":
        y = _bn_prim_c(False, eps)(x4, scale, offset, running_mean, running_var)[0]
    else:
        out = _stateless_bn_c(eps)(x4, scale, offset, zeros, ones)
        y = out[0]
        if mode == "general":
            batch_mean, batch_var = _graph_batch_statistics(out, x4)
            # torch's update as lerp's own arithmetic, old + m * (batch - old), of which the tap hands out the step
            step_mean = _STOP_GRADIENT((batch_mean - running_mean) * float(momentum))
            step_var = _STOP_GRADIENT((batch_var - running_var) * float(momentum))
            y = _STATISTICS_TAP(y, running_mean, running_var, step_mean, step_var)
    if len(shape) < 4:
        y = _RESHAPE(y, shape)
    return _TO_TORCH(y)


def _graph_batch_statistics(out, x4):
    """The batch statistics torch's running-statistics update takes, from a training kernel's outputs on x4:
    the batch mean and the unbiased batch variance, detached."""
    return _STOP_GRADIENT(out[3]), _graph_batch_var(out[4], x4)


def _channels(shape):
    return (int(shape[1]),)


def _shape4(shape):
    return tuple(shape) + (1,) * (4 - len(shape))


def _count(shape):
    """Values per channel of a batch of `shape` (N, C, ...)."""
    count = 1
    for i, n in enumerate(shape):
        if i != 1:
            count *= int(n)
    return count


def _bessel(shape):
    """count / (count - 1): biased -> unbiased variance (the factor op by op multiplies by)."""
    count = _count(shape)
    return float(count) / max(count - 1, 1)


def _bn_prim(training, eps):
    """The BatchNorm primitive of one configuration, made once per process (op by op gets the same through
    MindSpore's primitive cache)."""
    key = (bool(training), float(eps))
    if key not in _BN_PRIMS:
        if training:
            _BN_PRIMS[key] = _P.BatchNorm(is_training=True, epsilon=float(eps), momentum=0.0)
        else:
            _BN_PRIMS[key] = _P.BatchNorm(is_training=False, epsilon=float(eps))
    return _BN_PRIMS[key]


_BN_PRIMS = {}


def _ms_batch_norm(x, weight, bias, eps, mode, running_mean=None, running_var=None, momentum=0.1):
    """Fused batch norm on MindSpore. 'eval': normalise with the running statistics. 'hold' / 'general': batch
    statistics; 'general' then applies torch's running-statistics rule (unbiased variance) to the running
    tensors from the kernel's batch mean and biased variance (its 4th and 5th outputs on CPU).

    The training kernel insists on Parameters to write its moving statistics into: it gets the running
    statistics themselves with momentum 0, which writes back exactly the values it read (compiled code can
    only reach Parameters, so the model's running statistics are Parameters: compat.jit.state_buffer). Op by
    op, callers without such Parameters get per-channel scratch ones. Weight and bias must be Parameters in
    compiled code too (the kernel's signature marks them writable)."""
    torch = _c.torch
    shape = x.shape
    ndim = len(shape)
    x4 = x.reshape(shape + (1,) * (4 - ndim)) if ndim < 4 else x
    if mode == "eval":
        y = _prim_cache(_P.BatchNorm)(is_training=False, epsilon=eps)(x4, weight, bias, running_mean, running_var)[0]
        y = torch.cast_to_adapter_tensor(y)
        return y if ndim == 4 else y.reshape(shape)
    inputs = _eager_kernel_inputs(shape[1], weight, bias, running_mean, running_var)
    if inputs is None:  # compiled: the model's Parameters
        inputs = (weight, bias, running_mean, running_var)
    out = _prim_cache(_P.BatchNorm)(is_training=True, epsilon=eps, momentum=0.0)(x4, *inputs)
    if mode == "general":
        count = 1
        for i in range(ndim):
            if i != 1:
                count = count * shape[i]
        batch_mean = _ops.stop_gradient(out[3])
        batch_var = _unbiased_batch_var(out[4], x4, count)
        _ops.assign(running_mean, _ops.lerp(running_mean, batch_mean, float(momentum)))
        _ops.assign(running_var, _ops.lerp(running_var, batch_var, float(momentum)))
    y = torch.cast_to_adapter_tensor(out[0])
    return y if ndim == 4 else y.reshape(shape)


if _c.IS_MINDSPORE:
    import mindspore
    from mindspore import ops as _ops
    from mindspore.ops import operations as _P
    from mindspore.ops._primitive_cache import _get_cache_prim as _prim_cache
    _saved_var_kind = _ops.constexpr(probe_kernel, check=False)
    from mindspore.ops.operations import _inner_ops
    # graph-time constants (`_graph_batch_norm`): evaluated in Python while a graph is built
    _bn_prim_c = _ops.constexpr(_bn_prim, check=False)
    _shape4_c = _ops.constexpr(_shape4, check=False)
    _count_c = _ops.constexpr(_count, check=False)
    _bessel_c = _ops.constexpr(_bessel, check=False)
    _RESHAPE, _ASSIGN, _LERP, _STOP_GRADIENT = _P.Reshape(), _P.Assign(), _P.Lerp(), _P.StopGradient()
    _TILE, _FILL = _P.Tile(), _P.Fill()
    _instance_shape_c = _ops.constexpr(_instance_shape, check=False)
    _channels_c = _ops.constexpr(_channels, check=False)
    # mindnlp's mindtorch (MindSpore 2.7 has no such primitive): its tensors are MindSpore's already
    _TO_TORCH = getattr(_inner_ops, "convert_to_adapter_tensor", None) or _c.torch.cast_to_adapter_tensor
    from mindspore.common import dtype as _mstype

    _stateless_bn_c = _ops.constexpr(_stateless_bn, check=False)

    class _StatisticsTap(mindspore.nn.Cell):
        """Identity on `y` whose backward hands out two given values as the gradients of two Parameters:
        `tap(y, running_mean, running_var, step_mean, step_var)` gives `step_mean` / `step_var` as the gradients
        of the running statistics (their update, computed in the forward), `y`'s gradient unchanged. So a
        differentiated graph returns its batch norms' running-statistics updates with the other gradients and
        writes nothing (`_stateless_graph_batch_norm`). A batch norm whose output does not reach the loss gets a
        zero step and keeps its statistics (reid's batch norms all reach it; the step tests compare every
        statistic after every basic step with op by op)."""

        def construct(self, y, running_mean, running_var, step_mean, step_var):
            return y

        def bprop(self, y, running_mean, running_var, step_mean, step_var, out, dout):
            return dout, step_mean, step_var, _ops.zeros_like(step_mean), _ops.zeros_like(step_var)

    _STATISTICS_TAP = _StatisticsTap()
