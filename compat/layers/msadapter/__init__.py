"""The msadapter stack: MSAdapter 0.1.0's `msadapter.pytorch` on MindSpore 2.0.0 (`.venv-msadapter`, legacy).

MSAdapter's modules are MindSpore Cells and its `Tensor` a Python subclass of MindSpore 2.0's `StubTensor`;
every op is a Python wrapper around a MindSpore primitive. What compat does because of it (and of MindSpore
2.0, which only this stack runs), row by row:

| defect | what it breaks | the fix | the test |
|---|---|---|---|
| tensor-metaclass | the layer's Tensor constructor reads past every tensor it makes: a process dies now and then | defects.fix_tensor_metaclass | test_compat_shims.py::test_the_fix_bypasses_the_pybind11_metaclass_call_only_for_non_pybind11_instances |
| batch-norm | biased running variance; `F.batch_norm(training=True)` never updates the running tensors; instance norm fails | compat.norm.batch_norm (MindSpore's kernel, torch's rule) | test_compat_norm.py::test_norms_match_torch |
| normalize-gradient | `F.normalize`'s gradient treats the norm partly as a constant | compat.functional.normalize | test_losses.py::test_grads_match_torch_autograd |
| ceil-pooling | ceil-mode max pooling runs a 3-D kernel with indices: several times a plain pooling | compat.functional.max_pool2d_ceil | test_compat_functional.py::test_max_pool2d_ceil_matches_torch |
| wrapper-graphs | every op's wrapper is parsed into a graph: large graphs, slow builds, gigabytes left | graph.functional (thin ops, `functional`) | test_compiled.py::test_train_forward_and_running_statistics_compiled_equal_op_by_op |
| export-fallback | MindSpore 2.0 switches JIT fallback off for the process after an export-named graph: later graphs wrong | compat.jit.fallback_kept | test_compiled.py::test_graph_builds_refuse_a_switched_off_fallback_and_export_names |
| small-parameters | a graph keeps the build-time value of a Parameter of at most 4 elements | compat.jit._materialise | test_compiled.py::test_compiled_graph_reads_every_weight_live |
| spin-wait | the thread that runs a graph spins for as long as it runs, taking CPU from the kernels | compat.jit._run_built (helper thread) | test_compiled.py::test_built_graphs_run_on_the_low_priority_helper_thread |

`DEFECTS` below is the same table as data (tests/test_compat_layers.py checks both against each other, the
fixes and the tests). MindSpore 2.0's own rows (export-fallback, small-parameters, spin-wait, the build
memory release) are fixed in compat/jit.py behind `compat.backend.is_mindspore_2_0()`.
"""
import importlib
import importlib.util

from compat.layers import Defect

STACK = "msadapter"
MODULE = "msadapter.pytorch"
BUILDS_THROUGH_FORMS = False
LP_NORM_IN_GRAPHS = False
EXPORT_CLAMP_AS_MAXIMUM = False

_C = "tests/test_compiled.py::"
DEFECTS = (
    Defect("tensor-metaclass", "the layer's Tensor constructor reads past every tensor it makes: a process dies "
           "now and then", "compat.layers.msadapter.defects.fix_tensor_metaclass",
           "tests/test_compat_shims.py::test_the_fix_bypasses_the_pybind11_metaclass_call_only_for_non_pybind11_"
           "instances"),
    Defect("batch-norm", "biased running variance; `F.batch_norm(training=True)` never updates the running tensors; "
           "instance norm fails", "compat.norm.batch_norm", "tests/test_compat_norm.py::test_norms_match_torch"),
    Defect("normalize-gradient", "`F.normalize`'s gradient treats the norm partly as a constant",
           "compat.functional.normalize", "tests/test_losses.py::test_grads_match_torch_autograd"),
    Defect("ceil-pooling", "ceil-mode max pooling runs a 3-D kernel with indices: several times a plain pooling",
           "compat.functional.max_pool2d_ceil", "tests/test_compat_functional.py::test_max_pool2d_ceil_matches_torch"),
    Defect("wrapper-graphs", "every op's wrapper is parsed into a graph: large graphs, slow builds, gigabytes left",
           "compat.layers.msadapter.graph.functional",
           _C + "test_train_forward_and_running_statistics_compiled_equal_op_by_op"),
    Defect("export-fallback", "MindSpore 2.0 switches JIT fallback off for the process after an export-named "
           "graph: later graphs wrong", "compat.jit.fallback_kept",
           _C + "test_graph_builds_refuse_a_switched_off_fallback_and_export_names"),
    Defect("small-parameters", "a graph keeps the build-time value of a Parameter of at most 4 elements",
           "compat.jit._materialise", _C + "test_compiled_graph_reads_every_weight_live"),
    Defect("spin-wait", "the thread that runs a graph spins for as long as it runs, taking CPU from the kernels",
           "compat.jit._run_built", _C + "test_built_graphs_run_on_the_low_priority_helper_thread"),
)


def probe():
    return importlib.util.find_spec("msadapter") is not None


def version():
    top = importlib.import_module("msadapter")
    found = getattr(top, "__version__", None)
    if found is None:
        from importlib.metadata import version as dist_version
        try:
            found = dist_version("msadapter")
        except Exception:
            found = "unknown"
    return found


def before_import(mindspore):
    """Nothing: this stack's op launch stays MindSpore 2.0's default, which its tests and figures are taken
    with."""


def after_import(torch):
    from compat.layers.msadapter import defects
    done = defects.fix_tensor_metaclass(torch)
    return [done] if done else []


def functional(F):
    from compat.layers.msadapter import graph
    return graph.functional(F)


def graph_forms(on):
    """Nothing to swap: MSAdapter's modules are Cells and its ops parse (`functional` thins the hot ones)."""


def set_device(key):
    """Nothing: MSAdapter follows MindSpore's device."""
