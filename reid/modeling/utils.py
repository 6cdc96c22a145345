"""Parameter counting and names of the state (numpy state transfer: reid/modeling/pretrained.py)."""
import numpy as np


def count_parameters(module, trainable_only=False):
    """Number of parameter elements (buffers excluded); `trainable_only` skips requires_grad=False ones."""
    total = 0
    for _, p in module.named_parameters():
        if trainable_only and not p.requires_grad:
            continue
        total += int(np.prod(tuple(p.shape), dtype=np.int64))
    return total


def named_state(module):
    """{name: parameter or buffer} with `named_parameters()` / `named_buffers()` names."""
    state = dict(module.named_parameters())
    state.update(dict(module.named_buffers()))
    return state

