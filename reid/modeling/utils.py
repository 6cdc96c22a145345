"""Parameter counting and numpy state transfer by name."""
import numpy as np

import compat
from compat.errors import UserError


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


def numpy_state(module):
    """{name: numpy copy} of every parameter and buffer."""
    return {k: np.array(compat.to_numpy(v)) for k, v in named_state(module).items()}


def load_numpy_state(module, state, strict=True):
    """Copy numpy arrays into the parameters / buffers of the same name. strict: every name must be present
    on both sides. Returns the names that were loaded."""
    targets = named_state(module)
    if strict:
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise UserError("state does not match the model: missing %s, unexpected %s"
                            % (missing[:5] or "none", unexpected[:5] or "none"))
    loaded = []
    for name, target in targets.items():
        if name not in state:
            continue
        value = np.asarray(state[name], dtype=np.float32)
        if tuple(value.shape) != tuple(target.shape):
            raise UserError("%s: shape %s in the state, %s in the model" % (name, tuple(value.shape),
                                                                          tuple(target.shape)))
        compat.assign_(target, compat.as_tensor(value))
        loaded.append(name)
    return loaded
