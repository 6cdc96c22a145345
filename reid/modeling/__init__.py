"""The ACL network and the bag-of-tricks baseline as torch-style modules (see docs/model.md).

`build_model(cfg)` -> module with `.backbone` and `.heads`; `fast_weights(model, {name: tensor})` and
`bn_mode(model, mode)` switch every meta layer at once.
"""
from reid.modeling.layers import (MetaModule, MetaConv2d, MetaLinear, MetaBatchNorm, MetaInstanceNorm,  # noqa: F401
                                  MetaIBN, MetaGate, MetaCenters, GeM, AvgPool, fast_weights, bn_mode,
                                  set_num_splits, BN_MODES)
from reid.modeling.backbones import (ACLResNet, CODEBlock, ExpertBottleneck, HyperRouter, SELayer,  # noqa: F401
                                     Bottleneck, ResNet)
from reid.modeling.heads import MetaEmbeddingHead  # noqa: F401
from reid.modeling.meta_arch import ReIDModel  # noqa: F401
from reid.modeling.registry import META_ARCH_REGISTRY, BACKBONE_REGISTRY, HEAD_REGISTRY  # noqa: F401
from reid.modeling.build import build_model, build_backbone  # noqa: F401
from reid.modeling.pretrained import load_pretrained_backbone, numpy_state, load_numpy_state  # noqa: F401
from reid.modeling.utils import count_parameters  # noqa: F401
