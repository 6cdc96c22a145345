"""Functional ops whose MSAdapter versions compute wrong gradients; torch gets its own op unchanged.

normalize: MSAdapter 0.1.0's `F.normalize` takes the norm through Python's builtin `abs()` on a MindSpore
tensor, whose gradient is missing, so d/dx treats the norm partly as a constant (forward values are right,
gradients are not). Built here from `torch.norm`, whose gradient is correct.
"""
import compat as _c


def normalize(x, p=2.0, dim=1, eps=1e-12):
    """torch.nn.functional.normalize: x / max(||x||_p over `dim`, eps), with correct gradients on MindSpore."""
    if not _c.IS_MINDSPORE:
        return _c.F.normalize(x, p, dim, eps)
    return x / _c.torch.norm(x, p, dim, keepdim=True).clamp(min=eps)
