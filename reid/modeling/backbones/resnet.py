"""ResNet-50 / ResNet-50-IBN-a with meta layers: the bag-of-tricks baseline backbone and the parts the ACL
backbone shares (stem, bottleneck, stage builder).

Widths scale with `base_width` (64 = ResNet-50): stage s has `base_width * 2**s` planes and four times that
output channels. Names follow torchvision / IBN-Net (`conv1`, `bn1`, `layer1.0.bn1.IN.weight`,
`layer1.0.downsample.0.weight` ...), so ImageNet checkpoints load by name.
"""
from compat import nn, F
from reid.errors import UserError

from reid.modeling.layers import MetaBatchNorm, MetaConv2d, MetaIBN, MetaInstanceNorm

RESNET50_BLOCKS = (3, 4, 6, 3)
DEPTH_BLOCKS = {"26x": (2, 2, 2, 2), "50x": RESNET50_BLOCKS, "101x": (3, 4, 23, 3)}


def stage_blocks(depth):
    """MODEL.BACKBONE.DEPTH -> bottleneck blocks per stage."""
    if depth not in DEPTH_BLOCKS:
        raise UserError("MODEL.BACKBONE.DEPTH must be one of %s, got %r"
                        % (", ".join(sorted(DEPTH_BLOCKS, key=lambda d: int(d[:-1]))), depth))
    return DEPTH_BLOCKS[depth]


def make_norm(kind, channels):
    if kind == "BN":
        return MetaBatchNorm(channels)
    if kind == "IN":
        return MetaInstanceNorm(channels)
    if kind == "IBN":
        return MetaIBN(channels)
    raise ValueError("unknown norm kind %r" % kind)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here) -> 1x1 bottleneck with residual.

    `norm`: 'BN' everywhere, 'IBN' (IBN-a: bn1 is IBN, bn2/bn3 BN) or 'IN' (all instance norm: the ACL
    static branch). `zero_init_residual`: bn3's scale starts at 0, so the block starts as relu(identity)
    (MODEL.BACKBONE.ZERO_INIT_RESIDUAL for the stage blocks, ZERO_INIT_CODE for the CODE static branch).
    """
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, norm="BN", downsample=None, zero_init_residual=False):
        super().__init__()
        inner = "IN" if norm == "IN" else "BN"
        self.conv1 = MetaConv2d(inplanes, planes, 1)
        self.bn1 = make_norm(norm, planes)
        self.conv2 = MetaConv2d(planes, planes, 3, stride=stride, padding=1)
        self.bn2 = make_norm(inner, planes)
        self.conv3 = MetaConv2d(planes, planes * self.expansion, 1)
        if zero_init_residual:
            norm3 = MetaInstanceNorm if inner == "IN" else MetaBatchNorm
            self.bn3 = norm3(planes * self.expansion, weight_init=0.0)
        else:
            self.bn3 = make_norm(inner, planes * self.expansion)
        self.downsample = downsample

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


def make_stage(inplanes, planes, blocks, stride, norm, zero_init_residual=False):
    """`blocks` bottlenecks; the first carries the stride and a 1x1 conv + BN projection when needed."""
    downsample = None
    if stride != 1 or inplanes != planes * Bottleneck.expansion:
        downsample = nn.Sequential(MetaConv2d(inplanes, planes * Bottleneck.expansion, 1, stride=stride),
                                   MetaBatchNorm(planes * Bottleneck.expansion))
    layers = [Bottleneck(inplanes, planes, stride, norm, downsample, zero_init_residual)]
    for _ in range(1, blocks):
        layers.append(Bottleneck(planes * Bottleneck.expansion, planes, 1, norm, None, zero_init_residual))
    return nn.Sequential(*layers)


def check_width(base_width, multiple=1):
    if isinstance(base_width, bool) or not isinstance(base_width, int) or base_width < 1 or base_width % multiple:
        raise UserError("MODEL.BACKBONE.BASE_WIDTH must be a positive integer%s, got %r (64 = full ResNet-50)"
                        % (" divisible by %d (MODEL.BACKBONE.NUM_EXPERTS)" % multiple if multiple > 1 else "",
                           base_width))


def check_stride(last_stride):
    if last_stride not in (1, 2):
        raise UserError("MODEL.BACKBONE.LAST_STRIDE must be 1 or 2, got %r" % (last_stride,))


def stage_channels(base_width, stage):
    """Output channels of stage 0..3: its bottlenecks' width (base_width x 2^stage) times their expansion; the
    last stage's is the network's feature size."""
    return base_width * 2 ** stage * Bottleneck.expansion


def add_stem_and_stages(module, base_width, last_stride, with_ibn, blocks, after_stage=None, zero_init_residual=False):
    """Register the stem (`conv1`, `bn1`) and the bottleneck stages `layer1..4` on `module` (IBN-a in stages
    1-3 when with_ibn); `after_stage(i, channels)` runs after stage i is registered (ACL registers its CODE
    block there, so parameter order is stage, block, stage, ...). `zero_init_residual`: every stage block's
    last BN starts at scale 0 (see Bottleneck). Returns the output channels."""
    module.conv1 = MetaConv2d(3, base_width, 7, stride=2, padding=3)
    module.bn1 = MetaBatchNorm(base_width)
    inplanes = base_width
    for i, (n, stride) in enumerate(zip(blocks, (1, 2, 2, last_stride))):
        norm = "IBN" if with_ibn and i < 3 else "BN"
        setattr(module, "layer%d" % (i + 1),
                make_stage(inplanes, base_width * 2 ** i, n, stride, norm, zero_init_residual))
        inplanes = stage_channels(base_width, i)
        if after_stage is not None:
            after_stage(i, inplanes)
    return inplanes


def stem_forward(module, x):
    return F.max_pool2d(F.relu(module.bn1(module.conv1(x))), 3, 2, 0, 1, True)  # ceil mode, as the original


class ResNet(nn.Module):
    """Plain ResNet-50 (optionally IBN-a in stages 1-3). forward(x) -> (feature map, None)."""

    def __init__(self, base_width=64, last_stride=1, with_ibn=False, blocks=RESNET50_BLOCKS, zero_init_residual=False):
        super().__init__()
        check_width(base_width)
        check_stride(last_stride)
        self.base_width, self.with_ibn, self.blocks = base_width, with_ibn, tuple(blocks)
        self.feat_dim = add_stem_and_stages(self, base_width, last_stride, with_ibn, self.blocks,
                                            zero_init_residual=zero_init_residual)

    def stem(self, x):
        return stem_forward(self, x)

    def forward(self, x):
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return x, None
