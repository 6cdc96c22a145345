"""The ACL embedding head (docs/method.md#head): GeM pooling (p fixed), BNNeck with a frozen bias, one
bias-free classifier per source domain, learned class centers."""
import numpy as np

from compat import torch, nn, F
from reid.errors import UserError

from reid.modeling.layers import AvgPool, GeM, MetaBatchNorm, MetaCenters, MetaLinear

POOL_LAYERS = ("gem", "avg")
TRAIN_OUTPUTS = ("features", "neck_feat", "feat_norm", "logits", "center_dist", "paths")


def train_dict(outputs):
    """The train-mode output dict from the tuple a compiled forward returns (TRAIN_OUTPUTS order)."""
    features, neck, feat_norm, logits, center_dist, paths = outputs
    return {"features": features, "neck_feat": neck, "feat_norm": feat_norm, "logits": logits,
            "center_dist": center_dist, "paths": paths}


def check_num_classes(num_classes):
    values = list(num_classes) if isinstance(num_classes, (list, tuple)) else None
    if not values or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in values):
        raise UserError("MODEL.HEADS.NUM_CLASSES must be a non-empty list of positive identity counts, one per "
                        "source domain, got %r" % (num_classes,))
    return values


class MetaEmbeddingHead(nn.Module):
    """features (N, C, H, W) ->
    train: dict(features (N, C) pooled, neck_feat (N, C) after BNNeck, feat_norm (N, C) L2-normalised
                neck_feat, logits [ (N, n_d) per domain ], center_dist (N, Σ n_d) or None, paths: the
                backbone's router weights passed through, or None)
    eval:  neck_feat (N, C), BNNeck with running statistics.
    """

    def __init__(self, feat_dim, num_classes, pool="gem", gem_p=3.0, scale=1.0, with_centers=True):
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        if pool not in POOL_LAYERS:
            raise UserError("MODEL.HEADS.POOL_LAYER must be one of %s, got %r" % (", ".join(POOL_LAYERS), pool))
        self.feat_dim, self.scale = feat_dim, float(scale)
        self.pool = GeM(gem_p) if pool == "gem" else AvgPool()
        self.bottleneck = MetaBatchNorm(feat_dim, bias_freeze=True)   # BNNeck: its bias stays 0, as the original's
        self.classifiers = nn.ModuleList(
            [MetaLinear(feat_dim, n, weight=np.random.normal(0.0, 0.01, (n, feat_dim))) for n in self.num_classes])
        self.center = MetaCenters(feat_dim, sum(self.num_classes)) if with_centers else None

    def forward(self, features, paths=None):
        if not self.training:
            return self.bottleneck(self.pool(features))
        outputs = self._train_outputs(features, paths)
        if torch.compiler.is_compiling():
            # compiled: a tuple in TRAIN_OUTPUTS order (a dict returned by a module call arrives as a tensor
            # inside a MindSpore graph); compiled callers rebuild the dict with `train_dict`
            return outputs
        return train_dict(outputs)

    def _train_outputs(self, features, paths):
        pooled = self.pool(features)
        neck = self.bottleneck(pooled)
        logits = [c(neck) for c in self.classifiers]
        if self.scale != 1.0:
            logits = [l * self.scale for l in logits]
        return (pooled, neck, F.normalize(neck, 2.0, 1), logits,
                self.center(neck) if self.center is not None else None, paths)
