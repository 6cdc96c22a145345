"""Functional ops in the forms MindSpore needs (op by op, in a graph being built, in an exported file); torch gets
its own op unchanged.

normalize: x / max(||x||, eps) from `torch.norm`, whose gradient is right on every layer, and in the forms
MindSpore's graph compiler and ONNX writer take.
"""
import compat as _c
from compat.graph_mode import exporting, in_graph


def normalize(x, p=2.0, dim=1, eps=1e-12):
    """torch.nn.functional.normalize: x / max(||x||_p over `dim`, eps), with correct gradients on MindSpore."""
    if not _c.IS_MINDSPORE:
        return _c.F.normalize(x, p, dim, eps)
    if in_graph() and _EXPORT_CLAMP_AS_MAXIMUM:
        # the same values; MindSpore 2.7's ONNX exporter refuses a clamp with a lower bound only
        return x / _ms_ops.maximum(vector_norm(x, p, dim), eps)
    return x / vector_norm(x, p, dim).clamp(min=eps)


def vector_norm(x, p=2.0, dim=1):
    """||x||_p over `dim`, keepdim. Compiled on MindSpore, `torch.norm` would run as interpreted Python (and
    fail): there it is the same maths from elementwise ops and a sum, whose gradient is right away from 0."""
    if in_graph() and _LP_NORM_IN_GRAPHS and not exporting() and _positive_integral_c(p):
        # the layer's own kernel for torch.norm (LpNorm, ms27): compiled and op by op round alike (an exported
        # file takes the reductions below: MindSpore 2.7 exports no LpNorm to ONNX)
        return _lp_norm_c(dim, p)(x)
    if in_graph():  # compiled, the torch-API layer's reductions run as interpreted Python: MindSpore's ops
        from_ms = _c.torch.cast_to_adapter_tensor
        if p == 2.0:
            return from_ms(_ms_ops.sqrt(_SUM_KEEPDIM(x * x, dim)))
        return from_ms(_ms_ops.pow(_SUM_KEEPDIM(_ms_ops.pow(_ms_ops.abs(x), p), dim), 1.0 / p))
    return _c.torch.norm(x, p, dim, keepdim=True)


def _positive_integral(p):
    return float(p).is_integer() and p > 0


def _lp_norm(dim, p):
    """The LpNorm primitive of (dim, integral p), keeping dims, made once per configuration."""
    key = (int(dim), int(p))
    if key not in _LP_NORMS:
        _LP_NORMS[key] = _ms_P.LpNorm(axis=int(dim), p=int(p), keep_dims=True, epsilon=1e-12)
    return _LP_NORMS[key]


_LP_NORMS = {}


def max_pool2d_ceil(x, kernel_size, stride):
    """F.max_pool2d(x, kernel_size, stride, ceil_mode=True) on (N, C, H, W), no padding. A torch-API layer
    may run ceil mode through a 3-D pooling kernel that also computes argmax indices, several times a plain
    pooling at full size: on MindSpore the map is instead padded at the bottom / right
    with -inf up to the size whose floor-mode pooling has the ceil-mode output size, then pooled by the plain
    kernel. Same windows, same maxima (torch's rule that the last window starts inside the input holds: at most
    stride - 1 rows / columns are added)."""
    if not _c.IS_MINDSPORE:
        return _c.F.max_pool2d(x, kernel_size, stride, 0, 1, True)
    n, c, h, w = x.shape
    extra_h = -(h - kernel_size) % stride    # rows / columns the last ceil-mode window hangs over the edge
    extra_w = -(w - kernel_size) % stride
    if extra_h:
        x = _ms_ops.concat((x, _ms_ops.fill(x.dtype, (n, c, extra_h, w), float("-inf"))), 2)
    if extra_w:
        x = _ms_ops.concat((x, _ms_ops.fill(x.dtype, (n, c, h + extra_h, extra_w), float("-inf"))), 3)
    pool = _prim_cache(_ms_P.MaxPool)(kernel_size=kernel_size, strides=stride, pad_mode="valid")
    return _c.torch.cast_to_adapter_tensor(pool(x))


def scale_rows(x, s):
    """x (R, M) times s (R, 1), one factor per row: the values of `x * s.expand_as(x)` and its gradients (d/dx:
    the incoming gradient times s per row; d/ds: the row sums of the incoming gradient times x), which is what
    runs on torch (a view) and op by op on MindSpore. Compiled on MindSpore, the factors' full-size map is built
    by Tile, several times faster than MindSpore's CPU BroadcastTo (bench/reductions.py), with the backward
    written out (a Cell's bprop) in the kernels autodiff runs for the broadcast product, so the gradients are
    the same to the last bit; autodiff through Tile would sum the factors' gradient in Tile's own backward,
    slower and in another order. The backward builds the map again from s rather than keeping it."""
    if not (_c.IS_MINDSPORE and in_graph()):
        return x * s.expand_as(x)
    return _c.torch.cast_to_adapter_tensor(_SCALE_ROWS(x, s))


_LP_NORM_IN_GRAPHS = _EXPORT_CLAMP_AS_MAXIMUM = False  # the active layer's (compat/layers/), read in graphs
if _c.IS_MINDSPORE:
    _LP_NORM_IN_GRAPHS, _EXPORT_CLAMP_AS_MAXIMUM = _c.layer.LP_NORM_IN_GRAPHS, _c.layer.EXPORT_CLAMP_AS_MAXIMUM
    from mindspore import ops as _ms_ops
    from mindspore.ops import operations as _ms_P
    from mindspore.ops._primitive_cache import _get_cache_prim as _prim_cache
    _SUM_KEEPDIM = _ms_ops.ReduceSum(keep_dims=True)
    _lp_norm_c = _ms_ops.constexpr(_lp_norm, check=False)
    _positive_integral_c = _ms_ops.constexpr(_positive_integral, check=False)
    import mindspore as _mindspore

    class _ScaleRows(_mindspore.nn.Cell):
        """scale_rows on MindSpore: x (R, M) * s (R, 1) tiled along the rows, with its backward written out."""

        def __init__(self):
            super().__init__()
            self.mul, self.tile = _ms_P.Mul(), _ms_P.Tile()

        def construct(self, x, s):
            return self.mul(x, self.tile(s, (1, x.shape[1])))

        def bprop(self, x, s, out, dout):
            return self.mul(dout, self.tile(s, (1, x.shape[1]))), _SUM_KEEPDIM(self.mul(dout, x), -1)

    _SCALE_ROWS = _ScaleRows()
