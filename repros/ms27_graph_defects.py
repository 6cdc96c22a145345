"""What stands between mindnlp 0.5.1's `mindtorch` and MindSpore 2.7's compiled execution and export, each reduced
to a few lines of MindSpore (and the layer, where it is the layer's) without project code; docs/ms27.md
(#compiled-execution) says what each one broke here and what compat does instead. The sibling of
repros/ms27_defects.py (the layer's op-by-op defects). It imports MindSpore and mindtorch directly on purpose,
unlike everything outside compat/: a report to the maintainers must show the defect without our adaptation
layer in between.

    python repros/ms27_graph_defects.py [CASE ...]      (default: all; .venv/bin/python)

Each case prints one line: `DEFECT` with what went wrong, or `ok` where this version does it right. The cases
build graphs: a minute or two in all on a 2-core CPU.
"""
import argparse
import contextlib
import os
import tempfile

import numpy as np


def _ms():
    os.environ.setdefault("GLOG_v", "3")
    import mindspore
    return mindspore


def _layer():
    _ms()
    import mindtorch
    cpu = mindtorch.device("cpu")
    # (the layer's tensors from plain MindSpore ops have no device: repros/ms27_defects.py device)
    mindtorch.Tensor.device = property(lambda self: getattr(self, "_device", cpu))
    return mindtorch


@contextlib.contextmanager
def _scratch():
    """A failed build writes rank_0/om/analyze_fail.ir into the working directory: keep it out of the caller's."""
    here = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="ms27-graph-defects-"))
    try:
        yield
    finally:
        os.chdir(here)


def _first_line(exc):
    return "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:160])


def _builds(ms, torch, forward, what):
    """"ok" where `mindspore.jit(forward)` builds and runs on a (1, 3) tensor of ones, else the defect line
    naming `what`."""
    with _scratch():
        try:
            ms.jit(forward)(torch.tensor(np.ones((1, 3), np.float32)))
        except Exception as exc:  # the defect: report it
            return "DEFECT: %s: %s" % (what, _first_line(exc))
    return "ok"


def jit_ops():
    """With the layer's Module.__call__ out of the way (its `try` is repros/ms27_defects.py jit-module), the graph
    parser still refuses every op of the layer: each goes through its dispatcher, which the parser cannot read."""
    ms = _ms()
    torch = _layer()

    def forward(x):
        return torch.nn.functional.relu(x)
    return _builds(ms, torch, forward, "mindspore.jit(lambda x: F.relu(x))")


def jit_container():
    """A ModuleList inside a graph: the parser takes any object with MindSpore's class marker (`__ms_class__`,
    which every layer Module has) for a class instance, and cannot iterate one."""
    ms = _ms()
    torch = _layer()
    layers = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])

    def forward(x):
        return [x for _ in layers]
    return _builds(ms, torch, forward, "iterating a ModuleList in mindspore.jit")


def inplace_storage():
    """A graph reads a layer Parameter as a weight, live: `ops.assign` reaches it. The layer's in-place methods
    (`mul_`, `add_`, `copy_`) give the tensor new storage instead, and the built graph goes on reading the old
    one (its values, or whatever reuses that memory later)."""
    ms = _ms()
    torch = _layer()
    w = torch.nn.Parameter(torch.tensor(np.ones(3, np.float32)))

    def forward(x):
        return ms.ops.mul(x, w)
    graph = ms.jit(forward)
    x = ms.Tensor(np.ones(3, np.float32))
    graph(x)
    ms.ops.assign(w, w * 2)
    after_assign = graph(x).asnumpy()
    with torch.no_grad():
        w.mul_(2.0)
    after_mul_ = graph(x).asnumpy()
    if not np.allclose(after_assign, 2.0):
        return "DEFECT: the graph missed ops.assign (%s, want 2)" % after_assign
    if not np.allclose(after_mul_, 4.0):
        return "DEFECT: after w.mul_(2) the graph gives %s, the weight is %s" % (after_mul_, w.asnumpy())
    return "ok"


def export_parameters():
    """`mindspore.export` of a Cell whose construct calls a layer Module: the MINDIR writer refuses the layer's
    Parameters (no `mindspore.Parameter` of a Cell), and the ONNX writer writes a file that computes something
    else, without an error."""
    ms = _ms()
    torch = _layer()
    linear = torch.nn.Linear(3, 2)

    class Net(ms.nn.Cell):
        def construct(self, x):
            return ms.ops.matmul(x, linear.weight.T) + linear.bias
    x = np.random.RandomState(0).rand(4, 3).astype(np.float32)
    want = Net()(ms.Tensor(x)).asnumpy()
    found = []
    with _scratch():
        try:
            ms.export(Net(), ms.Tensor(x), file_name="net", file_format="MINDIR")
        except Exception as exc:  # the defect: report it
            found.append("MINDIR: %s" % _first_line(exc))
        ms.export(Net(), ms.Tensor(x), file_name="net", file_format="ONNX")
        import onnxruntime
        session = onnxruntime.InferenceSession("net.onnx", providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
    if not np.allclose(got, want, atol=1e-5):
        found.append("ONNX: the file's output is %.3g off the Cell's" % float(np.abs(got - want).max()))
    return "DEFECT: " + "; ".join(found) if found else "ok"


def onnx_ops():
    """MindSpore 2.7's ONNX writer lacks ops that plain Tensor methods compile to: `x.mean(dims, keepdim=True)`
    (MeanExt; the positional form exports), a clamp with a lower bound only (ClampScalar), and `ops.LpNorm`."""
    ms = _ms()
    from mindspore.ops import operations as P

    class Mean(ms.nn.Cell):
        def construct(self, x):
            return x.mean((2, 3), keepdim=True)

    class Clamp(ms.nn.Cell):
        def construct(self, x):
            return x.clamp(min=0.5)

    class Norm(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = P.LpNorm(axis=1, p=2, keep_dims=True)

        def construct(self, x):
            return self.norm(x)
    x = ms.Tensor(np.random.RandomState(0).rand(2, 3, 4, 4).astype(np.float32))
    found = []
    with _scratch():
        for label, cell in (("x.mean((2, 3), keepdim=True)", Mean()), ("x.clamp(min=0.5)", Clamp()),
                            ("LpNorm", Norm())):
            try:
                ms.export(cell, x, file_name="cell", file_format="ONNX")
            except Exception as exc:  # the defect: report it
                found.append("%s: %s" % (label, _first_line(exc)))
    return "DEFECT: " + "; ".join(found) if found else "ok"


def trace_tuples():
    """`mindspore.jit(capture_mode="trace")` records a tuple argument by its address: a tuple freed and a new one
    made at the same address is taken for the old one, and the graph computes something else, without an
    error. Here the second concat's input is recorded as the first's: shape (1, 1, 2, 4), not (1, 1, 4, 4)."""
    ms = _ms()

    def grow(x):
        x = ms.ops.concat((x, x * 0), 2)
        return ms.ops.concat((x, x * 0), 3)
    x = ms.Tensor(np.ones((1, 1, 2, 2), np.float32))
    want = grow(x).shape
    with _scratch():
        got = ms.jit(grow, capture_mode="trace")(x).shape
    return "ok" if tuple(got) == tuple(want) else "DEFECT: traced concat of a concat: shape %s, op by op %s" % (
        tuple(got), tuple(want))


def trace_grad():
    """`mindspore.jit(capture_mode="trace")` over a `mindspore.value_and_grad` call: the gradient is recorded as a
    constant of the first call; later calls return it whatever the weight (the value follows)."""
    ms = _ms()
    w = ms.Parameter(ms.Tensor(np.array([1.0, 2.0], np.float32)), name="w")
    grad_fn = ms.value_and_grad(lambda x: (x * w * w).sum(), None, [w])

    def step(x):
        return grad_fn(x)
    x = ms.Tensor(np.ones(2, np.float32))
    with _scratch():
        traced = ms.jit(step, capture_mode="trace")
        traced(x)
        ms.ops.assign(w, w + 1)
        got = traced(x)[1][0].asnumpy()
    want = grad_fn(x)[1][0].asnumpy()
    return "ok" if np.allclose(got, want) else "DEFECT: traced value_and_grad after a weight change: gradient " \
        "%s, op by op %s" % (got, want)


def bytecode_module():
    """`mindspore.jit(capture_mode="bytecode", fullgraph=True)` over a layer module: it cannot capture the layer's
    Python (without fullgraph it runs, breaking the graph where it cannot: not one compiled graph)."""
    ms = _ms()
    torch = _layer()
    linear = torch.nn.Linear(3, 2)

    def forward(x):
        return linear(x)
    with _scratch():
        try:
            ms.jit(forward, capture_mode="bytecode", fullgraph=True)(torch.tensor(np.ones((1, 3), np.float32)))
        except Exception as exc:  # the defect: report it
            return "DEFECT: bytecode capture, fullgraph=True, of Linear(3, 2): %s" % _first_line(exc)
    return "ok"


CASES = {"jit-ops": jit_ops, "jit-container": jit_container, "inplace-storage": inplace_storage,
         "export-parameters": export_parameters, "onnx-ops": onnx_ops, "trace-tuples": trace_tuples,
         "trace-grad": trace_grad, "bytecode-module": bytecode_module}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help="all (the default) or any of: %s"
                        % ", ".join(sorted(CASES)))
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES and c != "all"]
    if unknown:
        parser.error("unknown case %s; use all or any of: %s" % (", ".join(unknown), ", ".join(sorted(CASES))))
    ms = _ms()
    from importlib.metadata import version
    print("MindSpore %s, mindnlp %s (mindtorch)" % (ms.__version__, version("mindnlp")))
    for name in (sorted(CASES) if not args.cases or "all" in args.cases else args.cases):
        print("%-17s %s" % (name, CASES[name]()), flush=True)


if __name__ == "__main__":
    main()
