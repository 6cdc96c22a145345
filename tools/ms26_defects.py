"""Two MindSpore 2.6.0.dev20250323 defects met by compiled training steps, each reduced to MindSpore alone (no
project code, no torch-API layer); docs/mindtorch.md says which graph each one stopped and what compat does instead.
It imports MindSpore directly on purpose, unlike everything outside compat/: a report to MindSpore's developers
must show the defect without our adaptation layer in between.

    python tools/ms26_defects.py [side-effects|dict-aux|all] [--blocks 8,16,32,64] [--branches 4] [--timeout 120]

side-effects: a differentiated graph (`mindspore.value_and_grad` inside `mindspore.jit`) over residual blocks whose
    training-mode BatchNorm writes its moving statistics (the kernel's side effect on its Parameters, as every
    BatchNorm(is_training=True) has). Its first call (build + first run) is timed per block count, each in a fresh
    process under --timeout; the same graph with the kernel made pure (signature and side-effect flag dropped on
    the instance, constant statistics) for comparison. The side-effect graph's first call grows faster than
    linearly with its batch norms; the demo network's basic-step graph (57 batch norms in CODE blocks, IBN
    layers and heads) did not finish it.
dict-aux: the objective's loss terms in a dict, returned as the aux output (has_aux) of a differentiated graph:
    the build fails ("input's type 'Tuple[...,Func]' does not match expected type 'Tensor'"); the same terms as a
    tuple build.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _ms():
    import mindspore
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    return mindspore


def side_effects_case(blocks, pure, branches=1):
    """First-call seconds of the residual network's compiled value_and_grad: `blocks` blocks of two conv +
    BatchNorm layers, the second as `branches` parallel ones summed (as a mixture of experts is)."""
    ms = _ms()
    from mindspore import Parameter, Tensor, ops
    from mindspore.ops import operations as P
    rs = np.random.RandomState(0)
    c = 8
    conv = P.Conv2D(c, 3, pad_mode="same")
    bn = P.BatchNorm(is_training=True, epsilon=1e-5, momentum=0.1)
    if pure:
        bn.set_signatures(tuple())
        bn.del_prim_attr("side_effect_mem")
    zeros, ones = Tensor(np.zeros(c, np.float32)), Tensor(np.ones(c, np.float32))
    layers = []
    for i in range((1 + branches) * blocks):
        layers.append((Parameter(Tensor(rs.randn(c, c, 3, 3).astype(np.float32) * 0.2), name="w%d" % i),
                       Parameter(Tensor(np.ones(c, np.float32)), name="g%d" % i),
                       Parameter(Tensor(np.zeros(c, np.float32)), name="b%d" % i),
                       Parameter(Tensor(np.zeros(c, np.float32)), name="m%d" % i, requires_grad=False),
                       Parameter(Tensor(np.ones(c, np.float32)), name="v%d" % i, requires_grad=False)))
    weights = [p for layer in layers for p in layer[:3]]

    def norm(x, layer):
        if pure:
            return bn(conv(x, layer[0]), layer[1], layer[2], zeros, ones)[0]
        return bn(conv(x, layer[0]), layer[1], layer[2], layer[3], layer[4])[0]

    def loss_fn(x):
        for i in range(blocks):
            first = (1 + branches) * i
            y = ops.relu(norm(x, layers[first]))
            mixed = norm(y, layers[first + 1])
            for k in range(1, branches):
                mixed = mixed + norm(y, layers[first + 1 + k])
            x = ops.relu(mixed + x)
        return x.mean()

    grad_fn = ms.value_and_grad(loss_fn, None, weights)

    def step(x):
        return grad_fn(x)

    x = Tensor(rs.rand(4, c, 16, 8).astype(np.float32))
    start = time.perf_counter()
    loss, _ = ms.jit(step)(x)
    loss.asnumpy()
    return time.perf_counter() - start


def dict_aux_case():
    """The objective's structure: loss terms in a dict filled by a callee, summed over its keys, returned with the
    total as aux of the differentiated function; the same with the terms as a tuple."""
    ms = _ms()
    from mindspore import Parameter, Tensor
    w = Parameter(Tensor(np.ones(3, np.float32)), name="w")

    def terms_of(x):
        terms = {}
        terms["a"] = (x * w).sum()
        terms["b"] = (x * w * w).sum()
        return terms

    def with_dict(x):
        terms = terms_of(x)
        total = None
        for key in terms.keys():
            total = terms[key] if total is None else total + terms[key]
        return total, terms

    def with_tuple(x):
        terms = terms_of(x)
        values = tuple(terms.values())
        return values[0] + values[1], values

    x = Tensor(np.arange(3, dtype=np.float32))
    here = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="ms26-dict-aux-"))  # a failed build writes rank_0/om/analyze_fail.ir here
    for fn in (with_dict, with_tuple):
        grad_fn = ms.value_and_grad(fn, None, [w], has_aux=True)

        def step(x):
            return grad_fn(x)
        try:
            (loss, _), grads = ms.jit(step)(x)
            print("dict-aux: %-10s builds: loss %.1f, gradient %s" % (fn.__name__, float(loss.asnumpy()),
                                                                      grads[0].asnumpy()))
        except Exception as exc:  # the defect: report it and go on
            print("dict-aux: %-10s fails: %s: %s" % (fn.__name__, type(exc).__name__, str(exc).splitlines()[0][:150]))
    os.chdir(here)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", default="all", choices=("side-effects", "dict-aux", "all"))
    parser.add_argument("--blocks", default="8,16,32,64", help="residual block counts for side-effects")
    parser.add_argument("--branches", type=int, default=4, help="parallel conv + BatchNorm branches per block")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per side-effects graph")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("%.2f" % side_effects_case(int(args.child[0]), args.child[1] == "pure", args.branches))
        return
    import mindspore
    print("MindSpore %s" % mindspore.__version__)
    if args.case in ("side-effects", "all"):
        for blocks in (int(b) for b in args.blocks.split(",")):
            for kind in ("side-effect", "pure"):
                try:
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(blocks), kind,
                                          "--branches", str(args.branches)],
                                         capture_output=True, text=True, timeout=args.timeout)
                    said = out.stdout.strip().splitlines()
                    what = "%s s" % said[-1] if out.returncode == 0 and said else "failed: %s" % out.stderr[-300:]
                except subprocess.TimeoutExpired:
                    what = "not done after %.0f s (stopped)" % args.timeout
                print("side-effects: %2d residual blocks of %d branches, BatchNorm %-11s first call %s"
                      % (blocks, args.branches, kind, what), flush=True)
    if args.case in ("dict-aux", "all"):
        dict_aux_case()


if __name__ == "__main__":
    main()
