"""Gradient-norm clipping on explicit gradient lists (there is no `p.grad` on MindSpore).

`clip_grad_norm(grads, max_norm, norm_type=2.0) -> (clipped_grads, total_norm)` follows
`torch.nn.utils.clip_grad_norm_`: the total norm is the norm of the per-gradient norms, every gradient is
multiplied by min(max_norm / (total_norm + 1e-6), 1) (also when no clipping is needed, as torch does),
None entries are skipped and stay None. `total_norm` is a 0-d backend tensor (reading it forces a sync).
Nothing is modified in place; the inputs stay valid.
"""
import math

import compat as _c
from compat.errors import UserError


def clip_grad_norm(grads, max_norm, norm_type=2.0):
    torch = _c.torch
    grads = list(grads)
    try:
        max_norm, norm_type = float(max_norm), float(norm_type)
    except (TypeError, ValueError):
        raise UserError("clip_grad_norm: max_norm and norm_type must be numbers, got %r and %r"
                        % (max_norm, norm_type)) from None
    if math.isnan(max_norm) or max_norm < 0 or not norm_type > 0:
        raise UserError("clip_grad_norm: need max_norm >= 0 and norm_type > 0 (or inf), got %r and %r"
                        % (max_norm, norm_type))
    present = [g for g in grads if g is not None]
    if not present:
        return grads, torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(g, norm_type) for g in present]
    total_norm = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    return [None if g is None else g * clip_coef for g in grads], total_norm
