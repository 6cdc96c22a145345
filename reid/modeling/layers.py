"""Meta layers: torch-style layers whose parameters can be swapped for *fast weights* by name.

ACL's meta step evaluates the network at θ' = θ - α·g. Instead of the original's positional gradient list
(consumed in forward order), every layer here reads its parameters through `MetaModule._get(name)`, which
returns the tensor registered for that parameter by `fast_weights(model, {full_name: tensor})`, else the
parameter itself. Full names are `model.named_parameters()` names, identical on both backends.

Each layer keeps a plain dict (`_fast`, created once in `__init__` with `object.__setattr__`) whose contents
the context managers mutate; nothing assigns tensor attributes to a module at forward time (on MindSpore a
Cell would register them). The same holds for the batch-norm running-statistics mode (`_bn`).

Initial values are drawn with numpy's global RNG (`np.random`), so the same seed gives the same network on
both backends.
"""
import contextlib
import math

import numpy as np

from compat import torch, nn, F
from reid.errors import UserError

BN_MODES = ("general", "hold", "eval")


def new_parameter(array, requires_grad=True):
    """A parameter holding a float32 copy of `array`, on the current device."""
    return nn.Parameter(torch.tensor(np.asarray(array, dtype=np.float32)), requires_grad=requires_grad)


def conv_init(shape):
    """The original's conv init: N(0, sqrt(2 / (k*k*out_channels)))."""
    out_channels, _, kh, kw = shape
    return np.random.normal(0.0, math.sqrt(2.0 / (kh * kw * out_channels)), shape)


def linear_init(shape):
    """PyTorch's default nn.Linear weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(shape[1])
    return np.random.uniform(-bound, bound, shape)


class MetaModule(nn.Module):
    """Base of every layer that owns parameters; `_get(name)` honours active fast weights."""

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "_fast", {})

    def _get(self, name):
        if self._fast:
            value = self._fast.get(name)
            if value is not None:
                return value
        return getattr(self, name)


class MetaConv2d(MetaModule):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, groups=1, bias=False):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise UserError("conv %d->%d channels cannot be split into %d groups; pick widths divisible by the "
                            "group count" % (in_channels, out_channels, groups))
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding, self.groups = kernel_size, stride, padding, groups
        shape = (out_channels, in_channels // groups, kernel_size, kernel_size)
        self.weight = new_parameter(conv_init(shape))
        self.bias = new_parameter(np.zeros(out_channels)) if bias else None

    def forward(self, x):
        bias = self._get("bias") if self.bias is not None else None
        return F.conv2d(x, self._get("weight"), bias, self.stride, self.padding, 1, self.groups)


class MetaLinear(MetaModule):
    """Linear layer; bias-free by default, as in the original."""

    def __init__(self, in_features, out_features, bias=False, weight=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        init = linear_init((out_features, in_features)) if weight is None else weight
        self.weight = new_parameter(init)
        self.bias = new_parameter(np.random.uniform(-1, 1, out_features) / math.sqrt(in_features)) if bias else None

    def forward(self, x):
        bias = self._get("bias") if self.bias is not None else None
        return F.linear(x, self._get("weight"), bias)


class MetaBatchNorm(MetaModule):
    """Batch norm with the ACL running-statistics modes (`bn_mode`) and an optional frozen bias.

    Train mode uses `_bn["mode"]` ('general' updates the running statistics, 'hold' leaves them alone);
    eval mode always uses the running statistics. `_bn["num_splits"]` > 1 computes batch statistics per
    contiguous chunk (the original's 4-GPU DataParallel): statistics per chunk, the running statistics updated
    from the first chunk only (the replica whose buffers alias the module's).
    Works on (N, C) and (N, C, H, W) inputs.
    """

    def __init__(self, num_features, bias_freeze=False, eps=1e-5, momentum=0.1, weight_init=1.0):
        super().__init__()
        self.num_features, self.eps, self.momentum, self.bias_freeze = num_features, eps, momentum, bias_freeze
        self.weight = new_parameter(np.full(num_features, float(weight_init)))
        self.bias = new_parameter(np.zeros(num_features), requires_grad=not bias_freeze)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        object.__setattr__(self, "_bn", {"mode": "general", "num_splits": 1})

    def forward(self, x):
        weight, bias = self._get("weight"), self._get("bias")
        mode = self._bn["mode"] if self.training else "eval"
        if mode == "eval":
            return F.batch_norm(x, self.running_mean, self.running_var, weight, bias, False, 0.0, self.eps)
        # 'general' updates the running statistics, 'hold' leaves them alone
        mean, var = (self.running_mean, self.running_var) if mode == "general" else (None, None)
        splits = self._bn["num_splits"]
        if splits == 1:
            return F.batch_norm(x, mean, var, weight, bias, True, self.momentum, self.eps)
        if not torch.compiler.is_compiling():
            _check_split(x.shape[0], splits)
        # DataParallel's replicas: each contiguous chunk normalised by its own batch statistics; the running
        # statistics follow the first chunk's, the replica whose buffers are the module's
        size = x.shape[0] // splits
        chunks = (F.batch_norm(x[:size], mean, var, weight, bias, True, self.momentum, self.eps),)
        for i in range(1, splits):
            chunks = chunks + (F.batch_norm(x[i * size:(i + 1) * size], None, None, weight, bias, True,
                                            self.momentum, self.eps),)
        return torch.cat(chunks, 0)


def _check_split(n, num_splits):
    if n % num_splits:
        raise UserError("batch of %d cannot be split into MODEL.NUM_SPLITS=%d equal chunks; make the batch size a "
                        "multiple of NUM_SPLITS" % (n, num_splits))


class MetaInstanceNorm(MetaModule):
    """Affine instance norm without running statistics.

    Like the original, a map of height 1 gives zeros (its `inputs[:] *= 0` path); unreachable at the
    input sizes used here, kept for faithfulness.
    """

    def __init__(self, num_features, eps=1e-5, weight_init=1.0):
        super().__init__()
        self.num_features, self.eps = num_features, eps
        self.weight = new_parameter(np.full(num_features, float(weight_init)))
        self.bias = new_parameter(np.zeros(num_features))

    def forward(self, x):
        if x.shape[2] == 1:
            return x * 0.0
        return F.instance_norm(x, None, None, self._get("weight"), self._get("bias"), True, 0.1, self.eps)


class MetaIBN(nn.Module):
    """IBN-a normalisation: instance norm on the first floor(C/2) channels, batch norm on the rest."""

    def __init__(self, num_features):
        super().__init__()
        self.half = num_features // 2
        if self.half < 1:
            raise UserError("IBN needs at least 2 channels, got %d; increase MODEL.BACKBONE.BASE_WIDTH"
                            % num_features)
        self.IN = MetaInstanceNorm(self.half)
        self.BN = MetaBatchNorm(num_features - self.half)

    def forward(self, x):
        return torch.cat((self.IN(x[:, :self.half]), self.BN(x[:, self.half:])), 1)


def spatial_mean(x):
    """x (N, C, H, W) averaged over H and W -> (N, C), as the mean over the last axis of the (N*C, H*W) view:
    the values of `x.mean((2, 3))`. MindSpore's CPU kernels reduce over (and, in the backward, broadcast back
    along) the last axis of a matrix several times faster than over two axes of a 4-D tensor
    (bench/reductions.py); torch reduces both alike."""
    n, c, h, w = x.shape
    return x.reshape(n * c, h * w).mean(1).reshape(n, c)


def scale_channels(x, s):
    """x (N, C, H, W) times s (N, C), one factor per sample and channel, written on the (N*C, H*W) view: the
    gradient of s is then a sum over the last axis of a matrix (fast on MindSpore, see spatial_mean) rather
    than over two axes of a 4-D map, and the product is `torch.mul` of a matrix by a column, never an implicit
    broadcast over a feature map (docs/performance.md#graph-memory): compat's graph form of it tiles the column
    (faster than MindSpore's CPU BroadcastTo) with the backward written out."""
    n, c, h, w = x.shape
    return torch.mul(x.reshape(n * c, h * w), s.reshape(n * c, 1)).reshape(n, c, h, w)


class MetaGate(MetaModule):
    """Per-channel gate σ(γ): σ(γ)·a + (1 - σ(γ))·b, γ ~ N(0, 0.1²)."""

    def __init__(self, num_features):
        super().__init__()
        self.gate = new_parameter(np.random.randn(num_features) * 0.1)

    def forward(self, a, b):
        n, c = a.shape[0], a.shape[1]
        g = torch.sigmoid(self._get("gate")).reshape(1, c).broadcast_to((n, c))
        return scale_channels(a, g) + scale_channels(b, 1.0 - g)


class MetaCenters(MetaModule):
    """Learned class centers; forward gives squared Euclidean distances (N, num_classes)."""

    def __init__(self, feat_dim, num_classes, std=0.01):
        super().__init__()
        self.centers = new_parameter(np.random.normal(0.0, std, (num_classes, feat_dim)))

    def forward(self, x):
        c = self._get("centers")
        return (x * x).sum(1).reshape(-1, 1) + (c * c).sum(1).reshape(1, -1) - 2.0 * torch.matmul(x, c.t())


class GeM(nn.Module):
    """Generalized-mean pooling with a fixed exponent (p=3 in ACL): (mean(clamp(x, eps)^p))^(1/p)."""

    def __init__(self, p=3.0, eps=1e-6):
        super().__init__()
        self.p, self.eps = float(p), eps

    def forward(self, x):
        return spatial_mean(x.clamp(min=self.eps).pow(self.p)).pow(1.0 / self.p)


class AvgPool(nn.Module):
    """Global average pooling to (N, C)."""

    def forward(self, x):
        return spatial_mean(x)


# --------------------------------------------------------------------------- model-wide switches

def _meta_owners(model):
    """{full parameter name: (owning MetaModule, local name)} for every parameter of `model`."""
    owners = {}
    for prefix, module in model.named_modules():
        for local, _ in module.named_parameters(recurse=False):
            owners[(prefix + "." if prefix else "") + local] = (module, local)
    return owners


@contextlib.contextmanager
def fast_weights(model, weights):
    """Within the block, each layer uses `weights[full_name]` instead of that parameter.

    `weights` maps `model.named_parameters()` names to tensors of the parameter's shape (typically
    θ - α·g built inside the differentiated function, so the loss stays differentiable w.r.t. θ).
    Parameters not named keep their own values. Blocks nest; the inner one wins for names it sets.
    """
    owners = _meta_owners(model)
    plan = []
    for name, value in weights.items():
        if name not in owners:
            raise UserError("fast_weights: %r is not a parameter of this %s; use names from "
                            "model.named_parameters()" % (name, type(model).__name__))
        module, local = owners[name]
        if not isinstance(module, MetaModule):
            raise UserError("fast_weights: parameter %r belongs to %s, which is not a meta layer and cannot "
                            "take fast weights" % (name, type(module).__name__))
        expected = tuple(getattr(module, local).shape)
        if tuple(value.shape) != expected:
            raise UserError("fast_weights: %r has shape %s but the parameter has shape %s"
                            % (name, tuple(value.shape), expected))
        plan.append((module, local, value))
    saved = []
    try:
        for module, local, value in plan:
            saved.append((module, local, module._fast.get(local)))
            module._fast[local] = value
        yield model
    finally:
        for module, local, old in reversed(saved):
            if old is None:
                module._fast.pop(local, None)
            else:
                module._fast[local] = old


def _batch_norms(model):
    return [m for m in model.modules() if isinstance(m, MetaBatchNorm)]


@contextlib.contextmanager
def bn_mode(model, mode):
    """Running-statistics mode of every batch norm in `model` for train-mode forwards inside the block:
    'general' (default: batch statistics, running statistics updated), 'hold' (batch statistics, running
    statistics untouched) or 'eval' (running statistics). `model.eval()` always means 'eval'."""
    if mode not in BN_MODES:
        raise UserError("bn_mode must be one of %s, got %r" % (", ".join(BN_MODES), mode))
    norms = _batch_norms(model)
    saved = [m._bn["mode"] for m in norms]
    for m in norms:
        m._bn["mode"] = mode
    try:
        yield model
    finally:
        for m, old in zip(norms, saved):
            m._bn["mode"] = old


def set_num_splits(model, num_splits):
    """Compute train-mode batch statistics per `num_splits` contiguous chunks (DataParallel emulation)."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise UserError("MODEL.NUM_SPLITS must be a positive integer, got %r" % (num_splits,))
    for m in _batch_norms(model):
        m._bn["num_splits"] = num_splits
