from reid.modeling.backbones.acl_resnet import ACLResNet, CODEBlock, ExpertBottleneck, HyperRouter, SELayer  # noqa: F401
from reid.modeling.backbones.resnet import Bottleneck, ResNet  # noqa: F401
