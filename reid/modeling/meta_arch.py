"""Meta-architectures: ACL and the bag-of-tricks baseline. Both normalise 0..255 images inside the model,
run the backbone and the embedding head (contract in docs/architecture.md and docs/model.md)."""
import numpy as np

from compat import torch, nn
from reid.errors import UserError

from reid.modeling.layers import set_num_splits


def _check_images(shape):
    if len(shape) != 4 or shape[1] != 3:
        raise UserError("the model expects images of shape (N, 3, H, W), got %s" % (tuple(shape),))


class ReIDModel(nn.Module):
    """backbone + heads. forward(images (N, 3, H, W) float 0..255):
    train -> dict(features, neck_feat, feat_norm, logits, center_dist, paths); eval -> (N, D) features."""

    def __init__(self, backbone, heads, pixel_mean, pixel_std, num_splits=1, jit_eval=False, graph_key=None):
        super().__init__()
        mean, std = np.asarray(pixel_mean, np.float32), np.asarray(pixel_std, np.float32)
        if mean.shape != (3,) or std.shape != (3,) or np.any(std <= 0):
            raise UserError("MODEL.PIXEL_MEAN / MODEL.PIXEL_STD must be 3 values each (RGB, 0..255 scale, std > 0), "
                            "got %r / %r" % (list(pixel_mean), list(pixel_std)))
        self.backbone = backbone
        self.heads = heads
        # plain-dict constants (not buffers: they are no state to save)
        object.__setattr__(self, "_pixel", {"mean": mean.reshape(1, 3, 1, 1), "std": std.reshape(1, 3, 1, 1)})
        self.num_splits = num_splits
        self._pixel["tensors"] = (torch.tensor(self._pixel["mean"]), torch.tensor(self._pixel["std"]))
        # TEST.JIT: evaluation runs the compiled forward (compat/jit.py); `compiled` caches it, built on first
        # use. `graph_key`: what a compiled graph of this model bakes in beyond its parameters' shapes (the
        # model config, reid.modeling.build.graph_key), naming its entry in the compile cache; None: not cached
        self.jit_eval = bool(jit_eval)
        object.__setattr__(self, "compiled", {})
        object.__setattr__(self, "graph_key", graph_key)

    @property
    def num_splits(self):
        return self._pixel["num_splits"]

    @num_splits.setter
    def num_splits(self, value):
        set_num_splits(self, value)
        self._pixel["num_splits"] = value

    @property
    def num_classes(self):
        """Identities per source domain (one classifier each)."""
        return list(self.heads.num_classes)

    @property
    def domain_offsets(self):
        """Global label of each domain's first identity: [0, n_0, n_0 + n_1, ...]."""
        return [int(v) for v in np.cumsum([0] + self.num_classes[:-1])]

    def _to_device(self, device):
        """The pixel constants on `device` (moved once, where the images are)."""
        mean, std = self._pixel["tensors"]
        if mean.device != device:
            self._pixel["tensors"] = (mean.to(device), std.to(device))

    def preprocess(self, images):
        if not torch.compiler.is_compiling():  # (compiled code reads the constants as they were when it was built)
            _check_images(images.shape)
            self._to_device(images.device)
        mean, std = self._pixel["tensors"]
        return (images - mean.expand_as(images)) / std.expand_as(images)

    def forward(self, images):
        features, paths = self.backbone(self.preprocess(images))
        return self.heads(features, paths)  # compiled, train mode: a tuple (reid.modeling.heads.train_dict)
