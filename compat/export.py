"""Writing a network to a deployment file and running such files: the framework calls of `reid.deploy`.

Formats by backend:
  torch      ONNX through `torch.onnx.export` (the TorchScript-based exporter, `dynamo=False`: the newer
             torch.export-based one needs onnxscript, whose onnx/ml_dtypes releases require numpy 2),
             batch dimension dynamic.
  mindspore  MINDIR and ONNX through `mindspore.export`, which compiles the network in graph mode; the batch
             size is fixed at export (reshapes by the batch size are part of the exported graph).
Runners, on either backend: ONNX files through onnxruntime; MINDIR files through `mindspore.load` and
`nn.GraphCell`, MindSpore backend only.
"""
import contextlib
import os
import warnings

import numpy as np

import compat as _c
from compat.checkpoint import honour_umask
from compat.errors import UserError

FORMATS = ("onnx", "mindir")
SUFFIX = {"onnx": ".onnx", "mindir": ".mindir"}
ONNX_OPSET = 17                       # what torch.onnx.export writes; MindSpore's exporter picks its own
INPUT_NAME, OUTPUT_NAME = "images", "features"


def check_format(fmt, action="export"):
    """The format name, lower-case, if this backend can `action` ('export' or 'run') it; else a UserError."""
    key = str(fmt).strip().lower()
    if key not in FORMATS:
        raise UserError("unknown model format %r; use one of: %s" % (fmt, ", ".join(FORMATS)))
    if key == "mindir" and not _c.IS_MINDSPORE:
        raise UserError("MindIR files can only be %s with the MindSpore backend (--backend mindspore); the torch "
                        "backend %s ONNX" % ("written" if action == "export" else "run",
                                             "writes" if action == "export" else "runs"))
    return key


def export(net, example, path, fmt):
    """Write the eval-mode `net` (input: `example`, a float32 numpy batch) to `path` (which must end with the
    format's suffix). Returns {"dynamic_batch": bool}."""
    fmt = check_format(fmt)
    if not path.endswith(SUFFIX[fmt]):
        raise ValueError("export path %r must end with %s" % (path, SUFFIX[fmt]))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    example = np.ascontiguousarray(example, np.float32)
    if _c.IS_MINDSPORE:
        import mindspore
        # mindspore.export appends the suffix itself; an export may switch JIT fallback off for the process
        with _c.jit.fallback_kept(), _exportable(net) as cell:
            mindspore.export(cell, mindspore.Tensor(example), file_name=path[:-len(SUFFIX[fmt])],
                             file_format=fmt.upper())
        honour_umask(path)      # MindSpore leaves its files readable by their owner alone
        return {"dynamic_batch": False}
    torch = _c.torch
    try:
        import onnx  # noqa: F401  (torch.onnx.export serialises through it)
    except ImportError:
        raise UserError("ONNX export on the torch backend needs the 'onnx' package; install requirements-torch.txt "
                        "(make setup-torch)") from None
    with warnings.catch_warnings():
        # the exporter warns about its own deprecation and about Python ints taken from static shapes (H, W)
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(example),), path, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}})
    return {"dynamic_batch": True}


@contextlib.contextmanager
def _exportable(net):
    """What `mindspore.export` is given for `net`: the network itself where its modules are MindSpore Cells.
    mindnlp's mindtorch (the ms27 stack) has modules that are no Cells, which the
    ONNX exporter refuses ("only support nn.Cell object"), and Parameters that are no `mindspore.Parameter`,
    which the MINDIR exporter refuses ("a mindspore.Parameter that wasn't created in nn.Cell") and the ONNX
    exporter writes without their values (the file computes something else, without an error). There, for the
    export only, every parameter of `net` is replaced by a `mindspore.Parameter` of the same value and name,
    held by a Cell whose construct calls `net`, and the graph is built with the layer's graph forms in place
    (`compat.jit.building`); the parameters go back afterwards."""
    if not _c.layer.BUILDS_THROUGH_FORMS:
        yield net
        return
    import mindspore
    swapped = []
    for prefix, module in net.named_modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                full = (prefix + "." if prefix else "") + name
                q = mindspore.Parameter(mindspore.Tensor(_c.to_numpy(p)), name=full, requires_grad=False)
                swapped.append((module, name, p))
                module._parameters[name] = q
    try:
        with _c.jit.building(export=True):
            yield _NetCell(net, [module._parameters[name] for module, name, _ in swapped])
    finally:
        for module, name, p in reversed(swapped):
            module._parameters[name] = p


class OnnxRunner:
    """An ONNX file in onnxruntime (CPU): run(images (N,3,H,W) float32 numpy) -> features numpy."""

    def __init__(self, path, threads=0):
        try:
            import onnxruntime
        except ImportError:
            raise UserError("running ONNX files needs the 'onnxruntime' package; install the requirements file of "
                            "this backend (make setup)") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = int(threads)
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = list(inp.shape)   # ints, or names / None for dynamic dimensions
        self.batch = inp.shape[0] if isinstance(inp.shape[0], int) else None

    def run(self, images):
        return self.session.run(None, {self.input_name: np.ascontiguousarray(images, np.float32)})[0]


@contextlib.contextmanager
def _graph_mode():
    """A graph loaded from MINDIR runs only in GRAPH_MODE; the rest of the process stays op by op."""
    import mindspore
    previous = mindspore.get_context("mode")
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    try:
        yield
    finally:
        mindspore.set_context(mode=previous)


class MindIRRunner:
    """A MINDIR file as a `mindspore.nn.GraphCell`: run(images numpy) -> features numpy (fixed batch)."""

    def __init__(self, path):
        check_format("mindir", action="run")
        import mindspore
        graph = mindspore.load(path)
        self.cell = mindspore.nn.GraphCell(graph)

    def run(self, images):
        import mindspore
        with _graph_mode():
            return self.cell(mindspore.Tensor(np.ascontiguousarray(images, np.float32))).asnumpy()


class CompiledRunner:
    """An eval-mode network compiled by `mindspore.jit` (MindSpore) or run as is (torch): run(numpy) -> numpy.
    What exporting compiles, without the file: bench/infer.py measures it."""

    def __init__(self, net):
        self.net = net
        if _c.IS_MINDSPORE:
            import mindspore

            def forward(images):
                return net(images)
            # a layer that builds through its graph forms: built with them in place (compat.jit.compiled)
            self._call = (_c.jit.compiled(forward, "runner") if _c.layer.BUILDS_THROUGH_FORMS
                          else mindspore.jit(forward))
        else:
            self._call = net

    def run(self, images):
        with _c.no_grad(), _c.jit.fallback_kept():
            return _c.to_numpy(self._call(_c.as_tensor(np.asarray(images, np.float32))))


def make_runner(path, fmt):
    fmt = check_format(fmt, action="run")
    return OnnxRunner(path) if fmt == "onnx" else MindIRRunner(path)


def framework_version():
    return str(_c.info()["framework_version"])   # torch.__version__ is a str subclass of torch


if _c.IS_MINDSPORE:
    import mindspore as _ms

    class _NetCell(_ms.nn.Cell):
        """A Cell that holds `weights` (MindSpore Parameters, registered as its own) and runs `net` (`_exportable`)."""

        def __init__(self, net, weights):
            super().__init__()
            self.net = net
            self.weights = _ms.ParameterTuple(weights)

        def construct(self, images):
            return self.net(images)
