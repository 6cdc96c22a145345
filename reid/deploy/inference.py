"""The network that is exported: the eval-mode forward of a trained ReID model, images in, BNNeck feature out.

`InferenceNet(model)` takes over the model's backbone and head and swaps every meta layer for an inference
version that an exporter can compile: no fast-weight lookup, no running-statistics modes, no user-input
checks. It computes what `model.eval()(images)` computes:
  - batch norm with running statistics is folded into one per-channel scale and shift;
  - instance norm is written as mean / variance reductions (MindSpore exports it; its own instance-norm
    kernel does not);
  - the stem's ceil-mode max pooling is a floor-mode pooling of the map padded at the bottom/right (ceil-mode
    pooling does not export from MindSpore 2.0);
  - GeM pooling's lower bound is a maximum against a constant, and means keep their dims by position (what
    MindSpore 2.7's ONNX exporter takes);
  - the classifiers and class centers (training only) are left out.
The backbone's blocks (bottlenecks, CODE blocks, IBN, router, SE) keep their own forward code.
Shapes other than the batch size are fixed by the input size the net is built for.
"""
import numpy as np

import compat
from compat import nn, F, torch
from reid.errors import UserError

from reid.modeling import layers as meta


def _constant(array):
    """A frozen float32 tensor the exporters store with the weights."""
    # on the current device, the model's (compat.to_device)
    return nn.Parameter(compat.to_device(torch.tensor(np.asarray(array, np.float32))), requires_grad=False)


def _numpy(tensor):
    return np.asarray(tensor.detach().cpu().numpy(), np.float64)


class InferenceConv2d(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.weight = _constant(_numpy(conv.weight))
        self.bias = _constant(_numpy(conv.bias)) if conv.bias is not None else None
        self.stride, self.padding, self.groups = conv.stride, conv.padding, conv.groups

    def _get(self, name):
        # the CODE block's expert bottleneck reads its first conv weight through the meta-layer accessor
        return self.weight

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, 1, self.groups)


class InferenceLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.weight = _constant(_numpy(linear.weight))
        self.bias = _constant(_numpy(linear.bias)) if linear.bias is not None else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class InferenceBatchNorm(nn.Module):
    """Batch norm with running statistics as y = x * scale + shift (per channel), on (N,C) or (N,C,H,W)."""

    def __init__(self, bn):
        super().__init__()
        scale = _numpy(bn.weight) / np.sqrt(_numpy(bn.running_var) + bn.eps)
        shift = _numpy(bn.bias) - _numpy(bn.running_mean) * scale
        self.scale2, self.shift2 = _constant(scale.reshape(1, -1)), _constant(shift.reshape(1, -1))
        self.scale4, self.shift4 = _constant(scale.reshape(1, -1, 1, 1)), _constant(shift.reshape(1, -1, 1, 1))

    def forward(self, x):
        if x.dim() == 4:
            return x * self.scale4 + self.shift4
        return x * self.scale2 + self.shift2


class InferenceInstanceNorm(nn.Module):
    """Affine instance norm as reductions over H, W (biased variance, as torch)."""

    def __init__(self, norm):
        super().__init__()
        self.eps = float(norm.eps)
        self.weight = _constant(_numpy(norm.weight).reshape(1, -1, 1, 1))
        self.bias = _constant(_numpy(norm.bias).reshape(1, -1, 1, 1))

    def forward(self, x):
        if x.shape[2] == 1:        # the original's zero output for maps of height 1 (see MetaInstanceNorm)
            return x * 0.0
        # keepdim by position: MindSpore 2.7 compiles the keyword form to an op its ONNX exporter lacks (MeanExt)
        centred = x - x.mean((2, 3), True)
        var = (centred * centred).mean((2, 3), True)
        return centred / torch.sqrt(var + self.eps) * self.weight + self.bias


class InferenceGeM(nn.Module):
    """GeM pooling with its lower bound as a maximum against a constant (MindSpore 2.7's ONNX exporter refuses
    a clamp with a lower bound only); the same values."""

    def __init__(self, gem):
        super().__init__()
        self.p = float(gem.p)
        self.floor = _constant(np.full((1, 1, 1, 1), gem.eps))

    def forward(self, x):
        return torch.maximum(x, self.floor.expand_as(x)).pow(self.p).mean((2, 3)).pow(1.0 / self.p)


class InferenceGate(nn.Module):
    """σ(γ)·a + (1 - σ(γ))·b with σ(γ) computed once."""

    def __init__(self, gate):
        super().__init__()
        g = 1.0 / (1.0 + np.exp(-_numpy(gate.gate)))
        self.g = _constant(g.reshape(1, -1, 1, 1))
        self.one_minus_g = _constant((1.0 - g).reshape(1, -1, 1, 1))

    def forward(self, a, b):
        return self.g * a + self.one_minus_g * b


INFERENCE_LAYERS = {meta.MetaConv2d: InferenceConv2d, meta.MetaLinear: InferenceLinear,
                    meta.MetaBatchNorm: InferenceBatchNorm, meta.MetaInstanceNorm: InferenceInstanceNorm,
                    meta.MetaGate: InferenceGate}


def swap_meta_layers(module):
    """Replace, in place, every meta layer under `module` by its inference version."""
    for name, child in list(module.named_children()):
        kind = INFERENCE_LAYERS.get(type(child))
        if kind is None:
            swap_meta_layers(child)
        elif isinstance(module, nn.Sequential):
            module[int(name)] = kind(child)    # a Sequential may run its own list, not its attributes
        else:
            setattr(module, name, kind(child))
    left = [type(m).__name__ for m in module.modules() if isinstance(m, meta.MetaModule)]
    if left:
        raise UserError("no inference version of layer %s; add one to reid/deploy/inference.py before exporting"
                        % ", ".join(sorted(set(left))))
    return module


class Stage(nn.Module):
    """One backbone stage: its bottlenecks, then (ACL) its CODE block, whose router weights are dropped."""

    def __init__(self, layer, code=None):
        super().__init__()
        self.layer = layer
        self.code = code
        self.has_code = code is not None

    def forward(self, x):
        x = self.layer(x)
        if self.has_code:
            x, _ = self.code(x)
        return x


class InferenceNet(nn.Module):
    """images (N, 3, H, W) float32 RGB in 0..255 -> eval features (N, D), as `model.eval()(images)`.

    Takes over `model`'s layers (they are swapped for inference versions in place): build it from a model
    that is not used for training or evaluation afterwards. `input_size` = (H, W) the net will be given.
    """

    def __init__(self, model, input_size):
        super().__init__()
        backbone, heads = model.backbone, model.heads
        for part in ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4"):
            if not hasattr(backbone, part):
                raise UserError("cannot export backbone %s: it is not a ResNet (stem + layer1..4)"
                                % type(backbone).__name__)
        self.input_size = tuple(int(v) for v in input_size)
        self.feat_dim = int(heads.feat_dim)
        self.mean = _constant(np.asarray(model._pixel["mean"], np.float32))
        self.inv_std = _constant(1.0 / np.asarray(model._pixel["std"], np.float64))
        swap_meta_layers(backbone)
        self.conv1, self.bn1 = backbone.conv1, backbone.bn1
        self.stages = nn.ModuleList([Stage(getattr(backbone, "layer%d" % i), getattr(backbone, "code%d" % i, None))
                                     for i in range(1, 5)])
        self.pool = InferenceGeM(heads.pool) if isinstance(heads.pool, meta.GeM) else heads.pool
        self.bottleneck = InferenceBatchNorm(heads.bottleneck)
        # the stem's max pooling (3x3, stride 2, ceil mode) as floor mode over a map padded to the ceil size
        h, w = (-(-s // 2) for s in self.input_size)      # after conv1 (7x7, stride 2, padding 3)
        self.pad_h, self.pad_w = (2 * (-(-(s - 3) // 2)) + 3 - s for s in (h, w))

    def stem(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        # ReLU output is >= 0 and every window keeps a real value, so zero padding leaves each maximum as is;
        # built from slices of x (no shape-dependent constructor) so the batch size can stay dynamic
        if self.pad_h > 0:
            x = torch.cat((x, x[:, :, :self.pad_h] * 0.0), 2)
        if self.pad_w > 0:
            x = torch.cat((x, x[:, :, :, :self.pad_w] * 0.0), 3)
        return F.max_pool2d(x, 3, 2)

    def forward(self, images):
        x = self.stem((images - self.mean) * self.inv_std)
        for stage in self.stages:
            x = stage(x)
        return self.bottleneck(self.pool(x))
