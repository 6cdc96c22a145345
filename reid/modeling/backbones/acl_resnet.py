"""The ACL backbone: ResNet-50-IBN-a whose last bottleneck in every stage is replaced by a CODE block
(docs/method.md#backbone, #code-block).

CODE block on x (N, C, H, W), K experts, p = C/4:
  static branch   `adaptor_base`: bottleneck C -> p -> p -> C with instance norm everywhere, residual x
  dynamic branch  `adaptor_sub`: K independent bottlenecks C -> p/K -> p/K (3x3) -> C, each with residual x,
                  held as grouped convs (groups=K); its bn1 is IBN over p channels, so experts 0..K/2-1 get
                  instance norm and the rest batch norm (the original's quirk)
  router          `router` (HyperRouter): g = GAP(x); h = ReLU(L2norm(fc1 g)); W = fc2(h) as (C, K) per
                  sample; w = softmax_K(gᵀW)
  fusion (DSF)    F_D = Σ_k w_k expert_k(x); x = σ(γ)·BN_inv(F_S) + (1-σ(γ))·BN_spec(F_D); then SE.
The backbone returns the final map and the (N, 4K) router weights ("paths").

`zero_init_code` (MODEL.BACKBONE.ZERO_INIT_CODE, not the original's init): the last norm scale of the static
branch (instance norm) and of every expert (bn3) starts at 0, so both branches start as relu(x) = x (x comes
out of a ReLU and the router weights sum to 1) and the block starts as SE(gate(BN_inv(x), BN_spec(x))): a
normalised copy of its input instead of a sum of random branches. Trained from scratch, this is what lets
ACL's network learn as fast as the plain ResNet (docs/demo.md).

Left out as dead code of the original: the router's `fc_classifier` (its logits reach no loss) and the
side outputs `map1..4` (BN + L2norm of each stage, discarded by the meta-architecture).
"""
from compat import torch, nn, F
from reid.errors import UserError

from reid.modeling.backbones.resnet import Bottleneck, add_stem_and_stages, check_stride, check_width, stem_forward
from reid.modeling.layers import MetaBatchNorm, MetaConv2d, MetaGate, MetaIBN, MetaLinear, scale_channels, spatial_mean

ACL_MAIN_BLOCKS = (2, 3, 5, 2)   # ResNet-50's 3/4/6/3 minus the block each CODE block replaces


class SELayer(nn.Module):
    """Squeeze-and-excitation: x · σ(fc2(ReLU(fc1(GAP x)))), bias-free linears, reduction 16."""

    def __init__(self, channels, reduction=16):
        super().__init__()
        hidden = max(1, int(channels / reduction))
        self.fc1 = MetaLinear(channels, hidden)
        self.fc2 = MetaLinear(hidden, channels)

    def forward(self, x):
        return scale_channels(x, torch.sigmoid(self.fc2(F.relu(self.fc1(spatial_mean(x))))))


class HyperRouter(nn.Module):
    """Domain-aware adaptor: per-sample C x K hyper-matrix, softmax weights over the K experts."""

    def __init__(self, channels, num_experts, reduction=16):
        super().__init__()
        self.channels, self.num_experts = channels, num_experts
        hidden = max(1, channels // reduction)
        self.fc1 = MetaLinear(channels, hidden)
        self.fc2 = MetaLinear(hidden, channels * num_experts)

    def forward(self, x):
        n = x.shape[0]
        g = spatial_mean(x)
        h = F.relu(F.normalize(self.fc1(g), 2.0, -1))
        w = self.fc2(h).reshape(n, self.channels, self.num_experts)
        logits = torch.bmm(g.reshape(n, 1, self.channels), w).reshape(n, self.num_experts)
        return F.softmax(logits, -1)


class ExpertBottleneck(nn.Module):
    """K grouped bottleneck experts on C channels (the original's Bottleneck2 on x repeated K times).

    The original feeds x.repeat(1, K, 1, 1) to a 1x1 conv with groups=K; since every group sees the same x,
    that equals an ungrouped 1x1 conv of x with the same (p, C, 1, 1) weight, and the residual is x
    broadcast over the experts. So x is never repeated. forward(x) -> (N, K, C, H, W).
    """

    def __init__(self, channels, num_experts, with_ibn=True, zero_init=False):
        super().__init__()
        planes = channels // 4
        if planes % num_experts:
            raise UserError("CODE block with %d channels cannot hold %d experts; make BASE_WIDTH a multiple of "
                            "MODEL.BACKBONE.NUM_EXPERTS" % (channels, num_experts))
        self.channels, self.num_experts = channels, num_experts
        # declared grouped over K*C inputs, the original's parameter shape; forward applies it ungrouped to x
        self.conv1 = MetaConv2d(channels * num_experts, planes, 1, groups=num_experts)
        # an IBN over all p channels: experts 0..K/2-1 get instance norm, the rest batch norm (the original's quirk)
        self.bn1 = MetaIBN(planes) if with_ibn else MetaBatchNorm(planes)
        self.conv2 = MetaConv2d(planes, planes, 3, padding=1, groups=num_experts)
        self.bn2 = MetaBatchNorm(planes)
        self.conv3 = MetaConv2d(planes, channels * num_experts, 1, groups=num_experts)
        self.bn3 = MetaBatchNorm(channels * num_experts, weight_init=0.0 if zero_init else 1.0)

    def forward(self, x):
        n, c, h, w = x.shape
        out = F.relu(self.bn1(F.conv2d(x, self.conv1._get("weight"))))   # = the grouped conv1 on x repeated K times
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out)).reshape(n, self.num_experts, c * h * w)
        # the residual x of every expert, broadcast over the experts as a batched product with a column of ones
        # (exact): its gradient, the sum over the experts, is a matrix product too, where the gradient of an
        # expand is a sum over a middle axis, several times slower on MindSpore's CPU kernels (bench/reductions.py)
        ones = torch.ones(n, self.num_experts, 1).type_as(x)   # (type_as: x's dtype and device)
        out = out + torch.bmm(ones, x.reshape(n, 1, c * h * w))
        return F.relu(out).reshape(n, self.num_experts, c, h, w)


def mix_experts(experts, weights):
    """F_D = Σ_k w_k expert_k: experts (N, K, C, H, W) weighted by the router's (N, K) and summed over K, as one
    batched matrix product per sample, (1, K) @ (K, C·H·W). The product with the weights broadcast and a sum over
    K computes the same and costs several times more on MindSpore's CPU kernels: a broadcast of the weights, a
    full-size product, a reduction over a middle axis, and in the backward a full-size reduction per broadcast
    (bench/op_profile.py --compiled)."""
    n, k, c, h, w = experts.shape
    mixed = torch.bmm(weights.reshape(n, 1, k), experts.reshape(n, k, c * h * w))
    return mixed.reshape(n, c, h, w)


class CODEBlock(nn.Module):
    """Static branch + K dynamic experts mixed by the router, fused by two BNs, a sigmoid gate and SE.
    forward(x) -> (x, router weights (N, K))."""

    def __init__(self, channels, num_experts=4, with_ibn=True, zero_init=False):
        super().__init__()
        self.num_experts = num_experts
        self.adaptor_base = Bottleneck(channels, channels // 4, norm="IN", zero_init_residual=zero_init)
        self.adaptor_sub = ExpertBottleneck(channels, num_experts, with_ibn, zero_init)
        self.router = HyperRouter(channels, num_experts)
        self.invariant_norm = MetaBatchNorm(channels)
        self.specific_norm = MetaBatchNorm(channels)
        self.meta_fuse = MetaGate(channels)
        self.meta_se = SELayer(channels)

    def forward(self, x):
        invariant = self.adaptor_base(x)
        experts = self.adaptor_sub(x)
        weights = self.router(x)
        specific = mix_experts(experts, weights)
        fused = self.meta_fuse(self.invariant_norm(invariant), self.specific_norm(specific))
        return self.meta_se(fused), weights


class ACLResNet(nn.Module):
    """ResNet-50-IBN-a with main stages of 2/3/5/2 blocks, each followed by a CODE block.
    forward(x) -> (feature map (N, 32*base_width, H/16, W/16), paths (N, 4*num_experts))."""

    def __init__(self, base_width=64, last_stride=1, with_ibn=True, num_experts=4, blocks=ACL_MAIN_BLOCKS,
                 zero_init_residual=False, zero_init_code=False):
        super().__init__()
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise UserError("MODEL.BACKBONE.NUM_EXPERTS must be a positive integer, got %r" % (num_experts,))
        check_width(base_width, num_experts)
        check_stride(last_stride)
        self.base_width, self.with_ibn, self.num_experts, self.blocks = base_width, with_ibn, num_experts, tuple(blocks)

        def add_code_block(i, channels):
            setattr(self, "code%d" % (i + 1), CODEBlock(channels, num_experts, with_ibn, zero_init_code))
        self.feat_dim = add_stem_and_stages(self, base_width, last_stride, with_ibn, self.blocks, add_code_block,
                                            zero_init_residual)

    def forward(self, x):
        x = stem_forward(self, x)
        x, w1 = self.code1(self.layer1(x))
        x, w2 = self.code2(self.layer2(x))
        x, w3 = self.code3(self.layer3(x))
        x, w4 = self.code4(self.layer4(x))
        return x, torch.cat((w1, w2, w3, w4), 1)
