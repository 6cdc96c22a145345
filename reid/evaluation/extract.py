"""Feature extraction with the active backend: eval mode, no gradients, batched, optional flip averaging."""
import numpy as np

import compat
from compat import torch
from compat.errors import UserError


def _to_features(out):
    if isinstance(out, (list, tuple)) and out:
        out = out[0]
    if isinstance(out, dict) or not compat.is_tensor(out) or out.dim() != 2:
        raise UserError("the model must return an (N, D) feature tensor in eval mode for evaluation, got %s"
                        % (type(out).__name__ if not compat.is_tensor(out) else "shape %s" % (tuple(out.shape),)))
    return out


def _column(batch, key, n):
    value = batch.get(key)
    if value is None:
        return np.full(n, -1, np.int64)
    return np.asarray(compat.to_numpy(value) if compat.is_tensor(value) else value).reshape(-1).astype(np.int64)


def extract_features(model, loader, flip=False):
    """Run `model` over `loader` (dicts with ``images`` (N,3,H,W) 0..255, ``targets``, ``camids``,
    ``img_paths``) and return ``(features (N, D) float32, pids, camids, paths)`` as numpy / list.

    The model is put in eval mode (running BN statistics) and restored to its previous mode afterwards.
    ``flip=True`` averages the features of each image and of its horizontal mirror (fast-reid's TEST.FLIP).
    """
    was_training = bool(getattr(model, "training", False))
    model.eval()
    feats, pids, camids, paths = [], [], [], []
    try:
        with compat.no_grad():
            for batch in loader:
                images = batch["images"]
                if not compat.is_tensor(images):
                    images = compat.as_tensor(np.asarray(images, np.float32))
                out = _to_features(model(images))
                if flip:
                    out = (out + _to_features(model(torch.flip(images, dims=[3])))) / 2.0
                out = np.asarray(compat.to_numpy(out), dtype=np.float32)
                n = out.shape[0]
                feats.append(out)
                pids.append(_column(batch, "targets", n))
                camids.append(_column(batch, "camids", n))
                paths.extend(list(batch.get("img_paths", [""] * n)))
    finally:
        model.train(was_training)
    if not feats:
        raise UserError("the evaluation loader yielded no images; check the test dataset")
    return np.concatenate(feats), np.concatenate(pids), np.concatenate(camids), paths
