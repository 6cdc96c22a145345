"""Feature extraction with the active backend: eval mode, no gradients, batched, optional flip averaging."""
import numpy as np

import compat
from compat import torch
from reid.errors import UserError


def _to_features(out):
    if isinstance(out, (list, tuple)) and out:
        out = out[0]
    if isinstance(out, dict) or not torch.is_tensor(out) or out.dim() != 2:
        raise UserError("the model must return an (N, D) feature tensor in eval mode for evaluation, got %s"
                        % (type(out).__name__ if not torch.is_tensor(out) else "shape %s" % (tuple(out.shape),)))
    return out


def _column(batch, key, n):
    value = batch.get(key)
    if value is None:
        return np.full(n, -1, np.int64)
    return np.asarray(value.detach().cpu().numpy() if torch.is_tensor(value) else value).reshape(-1).astype(np.int64)


def _compiled_forward(model):
    """The eval forward compiled once per model (MindSpore; eager on torch), batches padded to one size. A
    model with a `graph_key` (build_model) keeps its graph in the compile cache (compat.jit.set_cache_dir)."""
    cache = getattr(model, "compiled", None)
    if cache is None:
        return model
    if "eval" not in cache:
        compat.jit.prepare(model)

        def eval_forward(images):
            return model(images)
        key = getattr(model, "graph_key", None)
        graph = compat.jit.compiled(eval_forward, "eval_forward", owner=model,
                                    key=None if key is None else "eval mode\n" + key)
        size = {}

        def run(images):
            # one input shape = one graph: a short last batch is padded with zeros (eval BN is per sample)
            n = int(images.shape[0])
            size.setdefault("n", n)
            if n >= size["n"]:
                return graph(images)
            # zeros like the batch's own (its device too: torch on a GPU)
            pad = torch.zeros_like(images[:1]).repeat(size["n"] - n, 1, 1, 1)
            return graph(torch.cat((images, pad), 0))[:n]
        cache["eval"] = run
        cache["eval_graph"] = getattr(graph, "graph", None)  # MindSpore: build time, whether it was loaded
    return cache["eval"]


def extract_features(model, loader, flip=False, compiled=None):
    """Run `model` over `loader` (dicts with ``images`` (N,3,H,W) 0..255, ``targets``, ``camids``,
    ``img_paths``) and return ``(features (N, D) float32, pids, camids, paths)`` as numpy / list.

    The model is put in eval mode (running BN statistics) and restored to its previous mode afterwards.
    ``flip=True`` averages the features of each image and of its horizontal mirror (fast-reid's TEST.FLIP).
    ``compiled``: run the compiled eval forward (MindSpore graph mode, compat/jit.py); None follows the
    model's TEST.JIT setting (`model.jit_eval`, on by default), False runs op by op.
    """
    was_training = bool(getattr(model, "training", False))
    model.eval()
    use_jit = bool(getattr(model, "jit_eval", False)) if compiled is None else bool(compiled)
    forward = _compiled_forward(model) if use_jit else model
    feats, pids, camids, paths = [], [], [], []
    try:
        with torch.no_grad():
            for batch in loader:
                images = batch["images"]
                if not torch.is_tensor(images):  # onto the model's device (compat.to_device: the current one)
                    images = compat.to_device(torch.tensor(np.asarray(images, np.float32)))
                out = _to_features(forward(images))
                if flip:
                    out = (out + _to_features(forward(torch.flip(images, dims=[3])))) / 2.0
                out = np.asarray(out.detach().cpu().numpy(), dtype=np.float32)
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
