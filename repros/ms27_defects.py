"""Defects of mindnlp 0.5.1's `mindtorch` (the torch-API layer of the default stack, `.venv`) and of MindSpore
2.7 itself met by compiled training steps, each reduced to a few lines of the layer on MindSpore, or of
MindSpore alone (no project code); docs/ms27.md says what each one broke here and how compat/layers/ms27/defects.py (or
compat itself) closes it. It imports MindSpore and mindtorch directly on purpose, unlike everything outside
compat/: a report to the layer's or MindSpore's maintainers must show the defect without our adaptation layer
in between.

    python repros/ms27_defects.py [CASE ...]      (default: all; .venv/bin/python)

Each case prints one line: `DEFECT` with what went wrong, or `ok` where this version does it right. The three
MindSpore-alone cases:

dict-aux: the objective's loss terms in a dict, returned as the aux output (has_aux) of a differentiated graph:
    the build fails; the same terms as a tuple build (compat.jit.value_and_grad passes tuples).
side-effects: the first call (build + first run) of a differentiated graph (`mindspore.value_and_grad` inside
    `mindspore.jit`) over residual blocks whose training-mode BatchNorms write their moving statistics, against
    the same graph with the kernel made pure, each in a fresh process (--blocks, --timeout). A MindSpore whose
    runtime links such graphs slowly (2.6's did not finish the demo network's basic-step graph) shows a first
    call far longer with the writes; compat builds step graphs without them (compat.jit.grad_graph_forms).
map-exit: a dataset `map` with two worker processes, read to its end: MindSpore's shutdown waits for the
    pipeline's clean-up process, which it never told to quit, then kills it.
"""
import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time

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


def float_round():
    """float() of a tensor is rounded to 5 decimal places: 3e-6 reads 0.0."""
    torch = _layer()
    t = torch.tensor(np.float32(3e-6))
    got = float(t)
    if got != float(np.float32(3e-6)):
        return "DEFECT: float(tensor(3e-6)) = %r, .item() = %r" % (got, t.item())
    return "ok: float(tensor(3e-6)) = %r" % got


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


def _ms():
    os.environ.setdefault("GLOG_v", "3")
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


def side_effects(blocks=32, branches=4, timeout=120.0):
    """The side-effect graph's first call against the pure one's, each in a process of its own."""
    seconds = {}
    for kind in ("side-effect", "pure"):
        try:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(blocks), kind,
                                  "--branches", str(branches)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "DEFECT: %d blocks of %d branches, BatchNorm %s: first call not done after %.0f s" % (
                blocks, branches, kind, timeout)
        said = out.stdout.strip().splitlines()
        if out.returncode != 0 or not said:
            return "DEFECT: BatchNorm %s graph failed: %s" % (kind, out.stderr.strip().splitlines()[-1:])
        seconds[kind] = float(said[-1])
    what = "%d blocks of %d branches, first call %.1f s with the BatchNorms' writes, %.1f s without" % (
        blocks, branches, seconds["side-effect"], seconds["pure"])
    return ("DEFECT: " if seconds["side-effect"] > 2 * seconds["pure"] else "ok: ") + what


def dict_aux():
    """Loss terms in a dict filled by a callee, summed over its keys, returned with the total as aux of the
    differentiated function, compiled; the same with the terms as a tuple."""
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
    os.chdir(tempfile.mkdtemp(prefix="ms27-dict-aux-"))  # a failed build writes rank_0/om/analyze_fail.ir here
    said = {}
    try:
        for fn in (with_dict, with_tuple):
            grad_fn = ms.value_and_grad(fn, None, [w], has_aux=True)

            def step(x):
                return grad_fn(x)
            try:
                (loss, _), grads = ms.jit(step)(x)
                said[fn.__name__] = "builds (loss %.1f)" % float(loss.asnumpy())
            except Exception as exc:  # the defect: report it
                said[fn.__name__] = "fails: %s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:120])
    finally:
        os.chdir(here)
    broken = said["with_dict"].startswith("fails")
    return "%sdict aux %s; tuple aux %s" % ("DEFECT: " if broken else "ok: ", said["with_dict"], said["with_tuple"])


def map_exit():
    """A `map` with worker processes (python_multiprocessing) over six rows, read to its end; MindSpore 2.7's
    shutdown of the pipeline (`_PythonMultiprocessing._abort_monitor`) joins its clean-up process with a 5 s
    timeout without first setting the event that tells it to quit (guarded by `hasattr(self, 'eof')`, an
    attribute that is never set), then kills it."""
    import mindspore.dataset as ds
    from mindspore.dataset.engine import datasets
    pool = datasets._PythonMultiprocessing
    terminate, killed = pool._terminate_processes, []

    def recording(processes):
        killed.extend(p.name for p in processes if p.name == "MapCleanProcess" and p.exitcode is None)
        return terminate(processes)
    pool._terminate_processes = staticmethod(recording)
    try:
        rows = ds.GeneratorDataset([(np.int64(i),) for i in range(6)], column_names=["i"], shuffle=False)
        rows = rows.map(lambda i: i * 2, input_columns=["i"], num_parallel_workers=2, python_multiprocessing=True)
        iterator = rows.create_tuple_iterator(num_epochs=1, output_numpy=True)
        got = [int(i) for (i,) in iterator]
        start = time.time()
        del iterator, rows   # the pipeline's end: its worker pool shuts down
        gc.collect()
        took = time.time() - start
    finally:
        pool._terminate_processes = staticmethod(terminate)
    if killed:
        return "DEFECT: rows %s, then %.1f s to shut down; the clean-up process was killed after the wait" % (
            got, took)
    return "ok: rows %s, shut down in %.1f s" % (got, took)


CASES = {"dtype-str": dtype_str, "device": device, "move-to": move_to, "vector-norm": vector_norm,
         "cross-entropy": cross_entropy, "batch-norm": batch_norm, "float": float_round, "module-bprop": module_bprop,
         "backward": backward, "sgd": sgd, "jit-module": jit_module, "dict-aux": dict_aux,
         "side-effects": side_effects, "map-exit": map_exit}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help="all (the default) or any of: %s"
                        % ", ".join(sorted(CASES)))
    parser.add_argument("--blocks", type=int, default=32, help="residual blocks for side-effects")
    parser.add_argument("--branches", type=int, default=4, help="parallel conv + BatchNorm branches per block")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per side-effects graph")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("%.2f" % side_effects_case(int(args.child[0]), args.child[1] == "pure", args.branches))
        return
    unknown = [c for c in args.cases if c not in CASES and c != "all"]
    if unknown:
        parser.error("unknown case %s; use all or any of: %s" % (", ".join(unknown), ", ".join(sorted(CASES))))
    import mindspore
    from importlib.metadata import version
    print("MindSpore %s, mindnlp %s (mindtorch)" % (mindspore.__version__, version("mindnlp")))
    for name in (sorted(CASES) if not args.cases or "all" in args.cases else args.cases):
        call = CASES[name]
        if name == "side-effects":
            print("%-14s %s" % (name, call(args.blocks, args.branches, args.timeout)), flush=True)
        else:
            print("%-14s %s" % (name, call()), flush=True)


if __name__ == "__main__":
    main()
