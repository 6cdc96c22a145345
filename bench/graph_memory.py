"""What a compiled MindSpore graph keeps in resident memory, by layer kind: pure MindSpore networks of 6 layers of
one kind, forward + backward (`value_and_grad` in one `mindspore.jit` function), compiled three times under
three names (three graphs, as a training run built one per step kind before the basic and meta-train steps
shared theirs). Each graph is called twice; the
resident memory each graph adds is printed: the first includes the memory pool's growth to the network's
working set, every later one only what that graph keeps for itself (the pool is shared between graphs).

Kinds (feature maps of 64 channels, 64x32, batch --batch):
  relu          ReLU
  conv3x3       3x3 convolution (oneDNN's gemm convolution: forward, backward-data and backward-weights
                kernels, each with buffers of its own)
  scale         x * w, w a per-channel (1, C, 1, 1) parameter: an implicitly broadcasting multiply
  scale-expand  x * w.broadcast_to(x.shape): the same product, broadcast first
Each kind runs in its own process. Printed last: a further graph's memory, implicit broadcast against broadcast
first, and the difference in feature maps per layer. MindSpore only (torch has no graphs; its broadcasting
costs no memory of its own).

    python bench/graph_memory.py [--batch 32]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KINDS = ("relu", "conv3x3", "scale", "scale-expand")
LAYERS, CHANNELS, HEIGHT, WIDTH = 6, 64, 64, 32


def graphs_kept(kind, batch, graphs=3):
    """Resident MB each of `graphs` compiled forward + backward graphs of a `kind` network added."""
    import gc

    import numpy as np
    import mindspore
    from mindspore import Parameter, Tensor, nn, ops

    import compat  # noqa: F401  (sets MindSpore's context and thread pool as the project runs it)
    from bench.timing import _rss_mb

    class Scale(nn.Cell):
        def __init__(self, expand):
            super().__init__()
            self.expand = expand
            self.w = Parameter(Tensor(np.ones((1, CHANNELS, 1, 1), np.float32)))

        def construct(self, x):
            if self.expand:
                return x * ops.broadcast_to(self.w, x.shape)
            return x * self.w

    def layer():
        if kind == "relu":
            return nn.ReLU()
        if kind == "conv3x3":
            return nn.Conv2d(CHANNELS, CHANNELS, 3, pad_mode="pad", padding=1)
        return Scale(expand=kind == "scale-expand")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([layer() for _ in range(LAYERS)])
            self.w0 = Parameter(Tensor(np.ones((1, CHANNELS, 1, 1), np.float32)))

        def construct(self, x):
            x = x * ops.broadcast_to(self.w0, x.shape)   # a parameter before the first layer: every kind has one
            for each in self.layers:
                x = each(x)
            return (x * x).mean()

    net = Net()
    grad = mindspore.value_and_grad(net, None, net.trainable_params())
    x = Tensor(np.random.RandomState(0).randn(batch, CHANNELS, HEIGHT, WIDTH).astype(np.float32))

    def named(i):
        def step(x):
            return grad(x * float(i + 1))
        step.__name__ = "graph_memory_%d" % i   # one name per graph: MindSpore caches graphs by name
        return mindspore.jit(step)

    added, before = [], _rss_mb(os.getpid())
    for i in range(graphs):
        step = named(i)
        for _ in range(2):
            loss, _ = step(x)
            loss.asnumpy()
            del loss
            gc.collect()
        now = _rss_mb(os.getpid())
        added.append(now - before)
        before = now
    return {"added_mb": added, "feature_map_mb": batch * CHANNELS * HEIGHT * WIDTH * 4 / 2.0 ** 20}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    from bench.timing import run_isolated
    got = {kind: run_isolated("mindspore", "bench.graph_memory:graphs_kept", {"kind": kind, "batch": args.batch})
           for kind in KINDS}
    print("6 layers per network, feature map %.1f MB (batch %d, %d channels, %dx%d); resident MB each graph "
          "added:" % (got["relu"]["feature_map_mb"], args.batch, CHANNELS, HEIGHT, WIDTH))
    for kind in KINDS:
        added = got[kind]["added_mb"]
        print("  %-13s first graph %6.0f   further graphs %s" % (kind, added[0], " ".join("%6.0f" % a
                                                                                       for a in added[1:])))
    further = {kind: sum(got[kind]["added_mb"][1:]) / len(got[kind]["added_mb"][1:]) for kind in KINDS}
    per_layer = (further["scale"] - further["scale-expand"]) / LAYERS / got["scale"]["feature_map_mb"]
    print("a further graph, implicit broadcast against broadcast first: %.0f / %.0f MB, i.e. %.1f feature maps "
          "per scale layer (two broadcasting kernels: the product and its input gradient)"
          % (further["scale"], further["scale-expand"], per_layer))


if __name__ == "__main__":
    main()
