"""Cost of one compat.optim.SGD step over a few hundred parameter tensors (ACL has ~300), MindSpore and torch
measured in one run (one backend after the other, each in its own environment: tests/crossenv.py).

    python bench/optim_step.py [--blocks 100 --steps 10]      # from either environment

Parameters: `blocks` x (3x3 conv 64->64 weight, norm weight, norm bias), momentum 0.9, weight decay 5e-4.
Timed on the same parameters and gradients:
* compat.optim.SGD (MindSpore: one fused `ops.SGD` kernel per tensor; torch: torch's own per-tensor ops);
* MindSpore: the same update composed from torch-API ops (mul/add/assign), the obvious alternative, and
  `mindspore.nn.SGD` (MindSpore's native optimizer, a graph-compiled Cell) as a floor;
* torch: `torch.optim.SGD` with `.grad` set.
Prints mean milliseconds per step (first step excluded), each row's ratio to compat.optim.SGD on the same
backend, and the MindSpore / torch ratio of compat.optim.SGD.
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(step, steps):
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def measure(blocks, steps):
    """{implementation: seconds per step} on the active backend (a crossenv case)."""
    import compat
    from compat.optim import SGD
    rng = np.random.RandomState(0)
    shapes = [(64, 64, 3, 3), (64,), (64,)] * blocks
    init = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads_np = [rng.randn(*s).astype(np.float32) for s in shapes]
    params = [compat.nn.Parameter(compat.as_tensor(v)) for v in init]
    grads = [compat.as_tensor(g) for g in grads_np]
    opt = SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    results = {"compat.optim.SGD": timed(lambda: opt.step(grads), steps)}

    if compat.IS_MINDSPORE:
        import mindspore
        buffers = [compat.torch.zeros_like(p) for p in params]

        def composed():
            for i, (p, g) in enumerate(zip(params, grads)):
                d = g + p * 5e-4
                buffers[i] = buffers[i] * 0.9 + d
                compat.assign_(p, p - buffers[i] * 0.01)
        results["torch-API ops composed"] = timed(composed, steps)
        for i, p in enumerate(params):  # mindspore.nn optimizers demand unique parameter names
            p.name = "param%d" % i
        native = mindspore.nn.SGD(params, learning_rate=0.01, momentum=0.9, weight_decay=5e-4)
        results["mindspore.nn.SGD (native)"] = timed(lambda: native(tuple(grads)), steps)
    else:
        torch = compat.torch
        ref_params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in init]
        for p, g in zip(ref_params, grads):
            p.grad = g
        ref = torch.optim.SGD(ref_params, lr=0.01, momentum=0.9, weight_decay=5e-4)
        results["torch.optim.SGD"] = timed(ref.step, steps)
    return {"seconds": results, "tensors": len(params), "values": int(sum(v.size for v in init))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from bench.timing import on_both_backends
    got = on_both_backends("bench.optim_step:measure", dict(blocks=args.blocks, steps=args.steps))
    print("%d parameter tensors, %.1fM values" % (got["torch"]["tensors"], got["torch"]["values"] / 1e6))
    for backend in ("mindspore", "torch"):
        rows = got[backend]["seconds"]
        base = rows["compat.optim.SGD"]
        for name, seconds in rows.items():
            print("%-9s %-28s %8.2f ms/step   %5.2fx compat.optim.SGD" % (backend, name, seconds * 1e3, seconds / base))
    ms, tr = got["mindspore"]["seconds"]["compat.optim.SGD"], got["torch"]["seconds"]["compat.optim.SGD"]
    print("compat.optim.SGD MindSpore / torch: %.3gx" % (ms / tr))


if __name__ == "__main__":
    main()
