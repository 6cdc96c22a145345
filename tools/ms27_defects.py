"""Defects of mindnlp 0.5.1's `mindtorch` (the torch-API layer of the MindSpore 2.7 stack, `.venv-ms27`), each
reduced to a few lines of the layer on MindSpore alone (no project code); docs/ms27.md says what each one broke
here and how compat/shims_ms27.py (or compat itself) closes it. It imports MindSpore and mindtorch directly on
purpose, unlike everything outside compat/: a report to the layer's maintainers must show the defect without
our adaptation layer in between.

    python tools/ms27_defects.py [CASE ...]      (default: all; .venv-ms27/bin/python)

Each case prints one line: `DEFECT` with what went wrong, or `ok` where this layer version does it right.
"""
import argparse
import os
import tempfile

import numpy as np


def _layer():
    os.environ.setdefault("GLOG_v", "3")
    import mindtorch
    return mindtorch


def dtype_str():
    """`import mindtorch` sets str() of every MindSpore dtype to its repr(); save_checkpoint writes that string
    as the type name, and load_checkpoint cannot read the file back."""
    import mindspore
    _layer()
    path = os.path.join(tempfile.mkdtemp(prefix="ms27-defects-"), "w.ckpt")
    mindspore.save_checkpoint([{"name": "w", "data": mindspore.Tensor(np.ones(2, np.float32))}], path)
    try:
        mindspore.load_checkpoint(path)
    except ValueError as exc:
        return "DEFECT: str(mindspore.float32) = %r; load_checkpoint of a file just saved: ValueError: %s" % (
            str(mindspore.float32), str(exc).splitlines()[0])
    return "ok"


def device():
    """A tensor made by a MindSpore op (not the layer's) has no device; the layer's next op on it raises. So do
    MindSpore's own functions that apply Tensor operators (which the layer patches) to such results."""
    import mindspore
    torch = _layer()
    a = torch.tensor([1.0, 2.0])
    found = []
    for label, call in (("mindspore.ops.add(a, a) * a", lambda: mindspore.ops.add(a, a) * a),
                        ("mindspore.ops.logsumexp(a, 0)", lambda: mindspore.ops.logsumexp(a, 0))):
        try:
            call()
        except ValueError as exc:
            found.append("%s: ValueError: %s" % (label, exc))
    return "DEFECT: " + "; ".join(found) if found else "ok"


def move_to():
    """`.to('cpu')` of a tensor already on the CPU copies it through numpy: the gradient stops there. The layer's
    binary ops move both operands to a common device first, so `a - b` of two CPU tensors loses it too."""
    import mindspore
    torch = _layer()
    x = torch.nn.Parameter(torch.tensor([3.0, 1.0]))
    found = []
    for label, loss, want in (("sum((2x).to('cpu')^2)", lambda: ((x * 2).to("cpu") ** 2).sum(), 8 * x.asnumpy()),
                              ("sum(x - x.sum())", lambda: (x - x.sum()).sum(), np.array([-1.0, -1.0]))):
        _, (grad,) = mindspore.value_and_grad(loss, None, [x])()
        if not np.allclose(grad.asnumpy(), want):
            found.append("d/dx %s = %s (want %s)" % (label, grad.asnumpy(), want))
    return "DEFECT: " + "; ".join(found) if found else "ok"


def vector_norm():
    """The CPU vector norm: all elements (dim=None) raises, ord=inf raises, a fractional order is truncated."""
    torch = _layer()
    x = torch.tensor([[3.0, -4.0]])
    found = []
    for label, call in (("x.norm()", lambda: x.norm()),
                        ("vector_norm(x, inf)", lambda: torch.linalg.vector_norm(x, float("inf"))),
                        ("vector_norm(x, 2.5, dim=1)", lambda: torch.linalg.vector_norm(x, 2.5, 1))):
        try:
            value = float(call().asnumpy().reshape(-1)[0])
            want = {"x.norm()": 5.0, "vector_norm(x, inf)": 4.0}.get(label, (3 ** 2.5 + 4 ** 2.5) ** 0.4)
            if abs(value - want) > 1e-4:
                found.append("%s = %.4f (want %.4f)" % (label, value, want))
        except Exception as exc:  # the defect: report it and go on
            found.append("%s: %s" % (label, type(exc).__name__))
    return "DEFECT: " + "; ".join(found) if found else "ok"


def cross_entropy():
    """F.cross_entropy on the CPU goes through MindSpore's LogSoftmax kernel: its gradient is several times
    further from float64 than the same gradient, softmax(x) - onehot, computed in float32 with numpy (torch's
    and MindSpore's own ops.cross_entropy are about that close)."""
    import mindspore
    torch = _layer()
    rng = np.random.RandomState(0)
    logits = (rng.randn(6, 3) * 2).astype(np.float32)
    target = np.array([0, 2, 1, 1, 0, 2], np.int64)

    def analytic(x):
        p = np.exp(x - x.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(6), target] -= 1
        return p / 6

    want = analytic(logits.astype(np.float64))
    w = torch.nn.Parameter(torch.tensor(logits))
    _, (grad,) = mindspore.value_and_grad(lambda: torch.nn.functional.cross_entropy(w, torch.tensor(target)),
                                          None, [w])()
    layer, rounding = (float(np.abs(g - want).max()) for g in (grad.asnumpy(), analytic(logits)))
    text = "largest gradient error against float64: F.cross_entropy %.1e, float32 numpy %.1e" % (layer, rounding)
    return ("DEFECT: " if layer > 3 * rounding else "ok: ") + text


def batch_norm():
    """nn.BatchNorm2d (F.batch_norm) passes torch's argument order to kernels that take another: the running
    statistics act as scale and offset, and the kernel writes its statistics into the weight."""
    torch = _layer()
    bn = torch.nn.BatchNorm2d(4)
    x = torch.tensor(np.random.RandomState(0).randn(2, 4, 3, 3).astype(np.float32))
    y = bn(x).asnumpy()
    if np.allclose(y, 1.0):
        return "DEFECT: BatchNorm2d(4) in training mode outputs %s everywhere; its weight is now %s" % (
            y.reshape(-1)[0], bn.weight.asnumpy())
    return "ok"


def module_bprop():
    """nn.Module is not a MindSpore Cell: a custom backward (`bprop`) on a module is never called."""
    import mindspore
    torch = _layer()

    class Reverse(torch.nn.Module):
        def forward(self, x):
            return x * 1.0

        def bprop(self, x, out, dout):
            return (-dout,)

    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    _, (grad,) = mindspore.value_and_grad(lambda: Reverse()(w).sum(), None, [w])()
    if np.allclose(grad.asnumpy(), 1.0):
        return "DEFECT: gradient %s through a module whose bprop returns -dout (want [-1, -1])" % grad.asnumpy()
    return "ok"


def backward():
    """loss.backward() records nothing: the parameter's .grad stays None."""
    torch = _layer()
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    (w * w).sum().backward()
    if w.grad is None:
        return "DEFECT: after (w * w).sum().backward(), w.grad is None (want %s)" % (2 * w.asnumpy())
    return "ok"


def sgd():
    """torch.optim.SGD.step() has no CPU kernel."""
    torch = _layer()
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    w.grad = torch.tensor([0.5, 0.5])
    try:
        torch.optim.SGD([w], lr=0.1).step()
    except RuntimeError as exc:
        return "DEFECT: SGD.step(): RuntimeError: %s" % exc
    return "ok"


def jit_module():
    """`mindspore.jit` over a function that calls a module of the layer: MindSpore's graph parser meets the
    `try` statement in the layer's `Module.__call__` and refuses it."""
    import mindspore
    torch = _layer()
    linear = torch.nn.Linear(3, 2)

    def forward(x):
        return linear(x)

    here = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="ms27-defects-"))  # a failed build writes rank_0/om/analyze_fail.ir here
    try:
        mindspore.jit(forward)(torch.tensor(np.ones((1, 3), np.float32)))
    except Exception as exc:  # the defect: report it
        return "DEFECT: mindspore.jit(lambda x: Linear(3, 2)(x)): %s: %s" % (type(exc).__name__,
                                                                         str(exc).splitlines()[0][:150])
    finally:
        os.chdir(here)
    return "ok"


CASES = {"dtype-str": dtype_str, "device": device, "move-to": move_to, "vector-norm": vector_norm,
         "cross-entropy": cross_entropy, "batch-norm": batch_norm, "module-bprop": module_bprop,
         "backward": backward, "sgd": sgd, "jit-module": jit_module}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help="all (the default) or any of: %s"
                        % ", ".join(sorted(CASES)))
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES and c != "all"]
    if unknown:
        parser.error("unknown case %s; use all or any of: %s" % (", ".join(unknown), ", ".join(sorted(CASES))))
    import mindspore
    from importlib.metadata import version
    print("MindSpore %s, mindnlp %s (mindtorch)" % (mindspore.__version__, version("mindnlp")))
    for name in (sorted(CASES) if not args.cases or "all" in args.cases else args.cases):
        print("%-14s %s" % (name, CASES[name]()), flush=True)


if __name__ == "__main__":
    main()
