"""Cost of one compat.optim.SGD step over a few hundred parameter tensors (ACL has ~300), in one run.

    REID_BACKEND=mindspore .venv/bin/python bench/optim_step.py [--blocks 100 --steps 10]
    REID_BACKEND=torch .venv-torch/bin/python bench/optim_step.py

Parameters: `blocks` x (3x3 conv 64->64 weight, norm weight, norm bias), momentum 0.9, weight decay 5e-4.
Timed on the same parameters and gradients:
* compat.optim.SGD (MindSpore: one fused `ops.SGD` kernel per tensor; torch: torch's own per-tensor ops);
* MindSpore: the same update composed from torch-API ops (mul/add/assign), the obvious alternative, and
  `mindspore.nn.SGD` (MindSpore's native optimizer, a graph-compiled Cell) as a floor;
* torch: `torch.optim.SGD` with `.grad` set.
Prints mean seconds per step (first step excluded) and the ratios.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compat  # noqa: E402
from compat.optim import SGD  # noqa: E402


def timed(step, steps):
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    shapes = [(64, 64, 3, 3), (64,), (64,)] * args.blocks
    init = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads_np = [rng.randn(*s).astype(np.float32) for s in shapes]
    params = [compat.nn.Parameter(compat.as_tensor(v)) for v in init]
    grads = [compat.as_tensor(g) for g in grads_np]
    print("%s backend, %d parameter tensors, %.1fM values" % (compat.BACKEND, len(params),
                                                               sum(v.size for v in init) / 1e6))
    opt = SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    results = {"compat.optim.SGD": timed(lambda: opt.step(grads), args.steps)}

    if compat.IS_MINDSPORE:
        import mindspore
        buffers = [compat.torch.zeros_like(p) for p in params]

        def composed():
            for i, (p, g) in enumerate(zip(params, grads)):
                d = g + p * 5e-4
                buffers[i] = buffers[i] * 0.9 + d
                compat.assign_(p, p - buffers[i] * 0.01)
        results["torch-API ops composed"] = timed(composed, args.steps)
        for i, p in enumerate(params):  # mindspore.nn optimizers demand unique parameter names
            p.name = "param%d" % i
        native = mindspore.nn.SGD(params, learning_rate=0.01, momentum=0.9, weight_decay=5e-4)
        results["mindspore.nn.SGD (native)"] = timed(lambda: native(tuple(grads)), args.steps)
    else:
        torch = compat.torch
        ref_params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in init]
        for p, g in zip(ref_params, grads):
            p.grad = g
        ref = torch.optim.SGD(ref_params, lr=0.01, momentum=0.9, weight_decay=5e-4)
        results["torch.optim.SGD"] = timed(ref.step, args.steps)

    base = results["compat.optim.SGD"]
    for name, seconds in results.items():
        print("%-28s %8.2f ms/step   %5.2fx compat.optim.SGD" % (name, seconds * 1e3, seconds / base))


if __name__ == "__main__":
    main()
