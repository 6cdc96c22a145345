"""MindSpore's CPU reductions by form, inside compiled graphs (mindspore.jit), at the demo network's largest CODE
block shapes (batch 64, 32 channels, 16x8 maps, 4 experts; --shape full: the full-size network's first CODE block,
batch 16, 256 channels, 64x32 maps): the multi-axis and inner-axis reductions that broadcasting ops' gradients and
the expert mix produce against the same sums written as one last-axis reduction, slice adds or a matrix product;
and the channel scale's forward and backward with its factors broadcast by BroadcastTo or Tile, under autodiff or
with the backward written out (compat.scale_rows). Prints milliseconds per call (median of --repeats x 20 calls),
each form's ratio to the first of its group and its largest difference from it (the forms sum in different orders:
last-bit differences). MindSpore only (`bench/kernels.py` puts these kernels next to torch's).

    python bench/reductions.py [--repeats 5] [--shape full]
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

N, K, C, H, W = 64, 4, 32, 16, 8
SHAPES = {"demo": (64, 4, 32, 16, 8),     # the demo network's largest CODE block
          "full": (16, 4, 256, 64, 32)}   # the full-size network's first CODE block, batch 16


def _groups():
    import mindspore
    from mindspore import Tensor, ops
    sum_keep, mean = ops.ReduceSum(keep_dims=True), ops.ReduceMean(keep_dims=True)
    bmm = ops.BatchMatMul()
    ones = Tensor(np.ones((N, 1, K), np.float32))

    def spatial_sum(x):            # the gradient of a per-(sample, channel) scale: SE, gate
        return sum_keep(x, (2, 3))

    def spatial_sum_last_axis(x):
        return sum_keep(x.reshape(N * C, H * W), -1)

    def expert_sum(x):             # the expert mix's sum over experts, and the expert residual's gradient
        return sum_keep(x, 1)

    def expert_sum_slices(x):
        return x[:, 0:1] + x[:, 1:2] + x[:, 2:3] + x[:, 3:4]

    def expert_sum_matmul(x):
        return bmm(ones, x.reshape(N, K, C * H * W))

    def spatial_mean(x):           # SE, router and GeM pooling
        return mean(x, (2, 3))

    def spatial_mean_last_axis(x):
        return mean(x.reshape(N * C, H * W), -1)

    def tile(s):                   # the gradient of a spatial mean
        return ops.tile(s, (1, 1, H, W))

    def broadcast(s):
        return ops.broadcast_to(s, (N, C, H, W))

    tile_op, mul = ops.Tile(), ops.Mul()

    class ScaleRowsBackwardWritten(mindspore.nn.Cell):   # compat.scale_rows on MindSpore
        def construct(self, x, s):
            return mul(x, tile_op(s, (1, H * W)))

        def bprop(self, x, s, out, dout):
            return mul(dout, tile_op(s, (1, H * W))), sum_keep(mul(dout, x), -1)

    scale_rows = ScaleRowsBackwardWritten()

    def scale_step(product):
        """The channel scale's forward and backward on the (N*C, H*W) view: the gradients of sum(product(x, s) * w)
        with respect to x and s, both kept in the result (s and w are Parameters: a graph folds constants)."""
        def weighted_sum(x, s):
            return (product(x, s) * w_flat).sum()
        grad = ops.grad(weighted_sum, (0, 1))

        def step(x):
            grad_x, grad_s = grad(x, s_flat)
            return grad_x[:, :1] + grad_s
        return step

    def product_broadcast_to(x, s):
        return x * ops.broadcast_to(s, (N * C, H * W))

    def product_tile(x, s):
        return x * ops.tile(s, (1, H * W))

    rng = np.random.default_rng(0)
    x_flat = Tensor(rng.random((N * C, H * W), dtype=np.float32))
    w_flat = mindspore.Parameter(Tensor(rng.random((N * C, H * W), dtype=np.float32)), "w_flat", requires_grad=False)
    s_flat = mindspore.Parameter(Tensor(rng.random((N * C, 1), dtype=np.float32)), "s_flat")
    x4 = Tensor(rng.random((N, C, H, W), dtype=np.float32))
    x5 = Tensor(rng.random((N, K, C, H, W), dtype=np.float32))
    s = Tensor(rng.random((N, C, 1, 1), dtype=np.float32))
    jit = mindspore.jit
    shape4, shape5, flat = (N, C, H, W), (N, K, C, H, W), "reshape (%d, %d)" % (N * C, H * W)
    return [
        ("sum over the %dx%d map of %s" % (H, W, shape4), x4, [
            ("ReduceSum axes (2, 3)", jit(spatial_sum)),
            (flat + ", ReduceSum axis -1", jit(spatial_sum_last_axis))]),
        ("sum over the %d experts of %s" % (K, shape5), x5, [
            ("ReduceSum axis 1", jit(expert_sum)), ("slice adds x0 + x1 + x2 + x3", jit(expert_sum_slices)),
            ("BatchMatMul with ones", jit(expert_sum_matmul))]),
        ("mean over the %dx%d map of %s" % (H, W, shape4), x4, [
            ("ReduceMean axes (2, 3)", jit(spatial_mean)),
            (flat + ", ReduceMean axis -1", jit(spatial_mean_last_axis))]),
        ("%s to %s" % ((N, C, 1, 1), shape4), s, [("Tile", jit(tile)), ("BroadcastTo", jit(broadcast))]),
        ("channel scale x * s on the %s view, forward and backward" % flat[8:], x_flat, [
            ("BroadcastTo, autodiff", jit(scale_step(product_broadcast_to))),
            ("Tile, autodiff", jit(scale_step(product_tile))),
            ("Tile, backward written out (scale_rows)", jit(scale_step(scale_rows)))]),
    ]


def _ms_per_call(fn, arg, repeats, calls=20):
    fn(arg).asnumpy()  # builds the graph
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(arg)
        out.asnumpy()
        times.append((time.perf_counter() - start) / calls * 1000.0)
    return float(np.median(times)), out.asnumpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo",
                        help="the CODE block's (N, K, C, H, W): demo (default) or full (batch 16)")
    args = parser.parse_args()
    global N, K, C, H, W
    N, K, C, H, W = SHAPES[args.shape]
    import mindspore
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    print("MindSpore %s, CPU, compiled graphs; ms per call" % mindspore.__version__)
    for title, arg, forms in _groups():
        print(title)
        first_ms, first_out = None, None
        for label, fn in forms:
            ms, out = _ms_per_call(fn, arg, args.repeats)
            if first_ms is None:
                first_ms, first_out = ms, out.reshape(-1)
                print("  %-42s %7.3f ms" % (label, ms))
            else:
                diff = float(np.abs(out.reshape(-1) - first_out).max())
                print("  %-42s %7.3f ms  (%.2fx; largest difference %.1e)" % (label, ms, ms / first_ms, diff))


if __name__ == "__main__":
    main()
