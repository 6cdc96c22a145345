"""The ms27 stack: mindnlp 0.5.1's top-level `mindtorch` on stable MindSpore 2.7 (`.venv`, the default).

mindnlp's `mindtorch` is the torch module itself (`mindtorch.nn`, `mindtorch.optim`); its `Tensor` is
`mindspore.Tensor` with methods patched in globally. What compat does because of it, row by row (the repro
cases are in repros/ms27_defects.py and repros/ms27_graph_defects.py, on MindSpore and the layer alone):

| defect | what it breaks | the fix | the test |
|---|---|---|---|
| launch-thread | every older-kind op (`Assign`) waits for MindSpore's launch thread: op-by-op steps several times slower | `before_import`: synchronous launch | test_compat_ms27.py::test_ops_launch_synchronously |
| dtype-str | `.ckpt` files written after the layer's import are read back by no MindSpore | defects._mindspore_dtype_names | test_compat_ms27.py::test_checkpoints_written_after_the_layer_import_read_back |
| device | a tensor from a MindSpore op (compat's batch norm, a graph's output) fails the layer's next op | defects._tensor_device_default | test_compat_ms27.py::test_tensors_from_mindspore_ops_have_the_layers_device |
| move-to | `.to()` the device a tensor is on cuts its gradient (so does `a - b`) | defects._move_to_same_device | test_compat_ms27.py::test_a_move_to_the_device_a_tensor_is_on_keeps_its_gradient |
| vector-norm | the CPU norm refuses dim=None and inf, truncates fractional orders | defects._vector_norm | test_compat_ms27.py::test_vector_norm_defects_of_the_layer_kernel_and_the_fractional_gradient |
| cross-entropy | `F.cross_entropy` and its gradient off by many float32 roundings | defects._cross_entropy | test_compat_ms27.py::test_cross_entropy_is_as_accurate_as_torch |
| batch-norm | `nn.BatchNorm*` swaps the affine and the running statistics | defects._batch_norm_arguments | test_compat_ms27.py::test_batch_norm_modules_use_their_affine_and_running_statistics |
| float | `float(tensor)` rounds to 5 decimal places: logged losses keep 6 digits, 3e-6 reads 0.0 | defects._float_full_precision | test_compat_ms27.py::test_float_of_a_tensor_is_its_full_value |
| map-exit | a loader with workers (a MindSpore `map` with worker processes) takes 5 s more to end | defects._map_workers_quit | test_compat_ms27.py::test_a_loader_with_workers_ends_without_waiting_for_its_clean_up_process |
| manual-seed | `torch.manual_seed` leaves MindSpore's global seed (its initializers, its random ops) as it was | defects._manual_seed_seeds_mindspore | test_compat_ms27.py::test_manual_seed_also_seeds_mindspore |
| module-bprop | a custom backward on a Module is never called | compat.custom_op.custom_op (a Cell) | test_compat_ms27.py::test_a_module_bprop_is_ignored_and_custom_op_uses_a_cell |
| backward | `loss.backward()` leaves no gradient | compat.autograd.value_and_grad | test_compat_ms27.py::test_backward_leaves_no_gradient_and_value_and_grad_gives_it |
| sgd | `optim.SGD.step()` has no CPU kernel | compat.optim.SGD | test_compat_ms27.py::test_the_layers_sgd_has_no_cpu_kernel_and_compats_steps |
| jit-module, jit-ops, jit-container | no layer Module, op or ModuleList parses in a graph | graph.swap (`graph_forms`) | test_compiled_ms27.py::test_layer_modules_build_only_with_the_graph_forms |
| inplace-storage | the layer's in-place methods give new storage: a built graph reads the old one | compat.tensor.assign_ | test_compiled_ms27.py::test_a_graph_misses_the_layers_in_place_writes_and_follows_compat_assign |
| export-parameters | MINDIR refuses the layer's Parameters; ONNX writes them without values | compat.export._exportable (`BUILDS_THROUGH_FORMS`) | test_compiled_ms27.py::test_export_needs_mindspore_parameters_in_a_cell |
| onnx-ops | MindSpore 2.7's ONNX writer lacks MeanExt, a lower-bound clamp, LpNorm | compat.functional.normalize (`EXPORT_CLAMP_AS_MAXIMUM`) | test_compiled_ms27.py::test_onnx_export_takes_the_forms_the_inference_network_uses |
| dict-aux | a dict aux output of a differentiated graph fails to build (MindSpore 2.7) | compat.jit.value_and_grad (tuples) | test_compiled.py::test_model_jit_compiles_steps_on_mindspore |

`DEFECTS` below is the same table as data (tests/test_compat_layers.py checks both against each other, the
fixes and the tests). The repros' trace-* and bytecode-module cases are alternatives to parsing that compat
does not take (docs/ms27.md).
"""
import importlib
import importlib.util
import os

from compat.layers import Defect

STACK = "ms27"
MODULE = "mindtorch"
BUILDS_THROUGH_FORMS = True
LP_NORM_IN_GRAPHS = True
EXPORT_CLAMP_AS_MAXIMUM = True

_T = "tests/test_compat_ms27.py::"
_G = "tests/test_compiled_ms27.py::"
DEFECTS = (
    Defect("launch-thread", "every older-kind op (`Assign`) waits for MindSpore's launch thread: op-by-op steps "
           "several times slower", "compat.layers.ms27.before_import", _T + "test_ops_launch_synchronously"),
    Defect("dtype-str", "`.ckpt` files written after the layer's import are read back by no MindSpore",
           "compat.layers.ms27.defects._mindspore_dtype_names",
           _T + "test_checkpoints_written_after_the_layer_import_read_back"),
    Defect("device", "a tensor from a MindSpore op (compat's batch norm, a graph's output) fails the layer's next "
           "op", "compat.layers.ms27.defects._tensor_device_default",
           _T + "test_tensors_from_mindspore_ops_have_the_layers_device"),
    Defect("move-to", "`.to()` the device a tensor is on cuts its gradient (so does `a - b`)",
           "compat.layers.ms27.defects._move_to_same_device",
           _T + "test_a_move_to_the_device_a_tensor_is_on_keeps_its_gradient"),
    Defect("vector-norm", "the CPU norm refuses dim=None and inf, truncates fractional orders",
           "compat.layers.ms27.defects._vector_norm",
           _T + "test_vector_norm_defects_of_the_layer_kernel_and_the_fractional_gradient"),
    Defect("cross-entropy", "`F.cross_entropy` and its gradient off by many float32 roundings",
           "compat.layers.ms27.defects._cross_entropy", _T + "test_cross_entropy_is_as_accurate_as_torch"),
    Defect("batch-norm", "`nn.BatchNorm*` swaps the affine and the running statistics",
           "compat.layers.ms27.defects._batch_norm_arguments",
           _T + "test_batch_norm_modules_use_their_affine_and_running_statistics"),
    Defect("float", "`float(tensor)` rounds to 5 decimal places: logged losses keep 6 digits, 3e-6 reads 0.0",
           "compat.layers.ms27.defects._float_full_precision", _T + "test_float_of_a_tensor_is_its_full_value"),
    Defect("map-exit", "a loader with workers (a MindSpore `map` with worker processes) takes 5 s more to end",
           "compat.layers.ms27.defects._map_workers_quit",
           _T + "test_a_loader_with_workers_ends_without_waiting_for_its_clean_up_process"),
    Defect("manual-seed", "`torch.manual_seed` leaves MindSpore's global seed (its initializers, its random ops) as "
           "it was", "compat.layers.ms27.defects._manual_seed_seeds_mindspore",
           _T + "test_manual_seed_also_seeds_mindspore"),
    Defect("module-bprop", "a custom backward on a Module is never called", "compat.custom_op.custom_op",
           _T + "test_a_module_bprop_is_ignored_and_custom_op_uses_a_cell"),
    Defect("backward", "`loss.backward()` leaves no gradient", "compat.autograd.value_and_grad",
           _T + "test_backward_leaves_no_gradient_and_value_and_grad_gives_it"),
    Defect("sgd", "`optim.SGD.step()` has no CPU kernel", "compat.optim.SGD",
           _T + "test_the_layers_sgd_has_no_cpu_kernel_and_compats_steps"),
    Defect("jit-module, jit-ops, jit-container", "no layer Module, op or ModuleList parses in a graph",
           "compat.layers.ms27.graph.swap", _G + "test_layer_modules_build_only_with_the_graph_forms"),
    Defect("inplace-storage", "the layer's in-place methods give new storage: a built graph reads the old one",
           "compat.tensor.assign_", _G + "test_a_graph_misses_the_layers_in_place_writes_and_follows_compat_assign"),
    Defect("export-parameters", "MINDIR refuses the layer's Parameters; ONNX writes them without values",
           "compat.export._exportable", _G + "test_export_needs_mindspore_parameters_in_a_cell"),
    Defect("onnx-ops", "MindSpore 2.7's ONNX writer lacks MeanExt, a lower-bound clamp, LpNorm",
           "compat.functional.normalize", _G + "test_onnx_export_takes_the_forms_the_inference_network_uses"),
    Defect("dict-aux", "a dict aux output of a differentiated graph fails to build (MindSpore 2.7)",
           "compat.jit.value_and_grad", "tests/test_compiled.py::test_model_jit_compiles_steps_on_mindspore"),
)

# MindSpore's device names -> the layer's device label
_DEVICES = {"cpu": "cpu", "gpu": "cuda", "ascend": "npu"}


def probe():
    """mindnlp's mindtorch is the torch module itself; PyPI's own `mindtorch` releases (a package holding
    ``mindtorch/torch``, for MindSpore pre-releases; no longer a stack here) are not this layer. Found from its
    files: importing it redirects ``import torch`` to itself for the rest of the process."""
    spec = importlib.util.find_spec(MODULE)
    return spec is not None and bool(spec.submodule_search_locations) and not any(
        os.path.isdir(os.path.join(p, "torch")) for p in spec.submodule_search_locations)


def version():
    """mindnlp's mindtorch says `test_version_no_value` as its `__version__`: the wheel that ships it (mindnlp)
    gives the number."""
    from importlib.metadata import version as dist_version
    try:
        return "%s (mindnlp)" % dist_version("mindnlp")
    except Exception:
        return "unknown"


def before_import(mindspore):
    """PyNative mode with synchronous op launch (`mindspore.runtime.launch_blocking()`), set before the first op
    runs (the layer's import runs ops). By default MindSpore 2.7 hands every op to a launch thread, which on a
    machine with few cores competes with the kernels. Set after any op has run, the setting does not take:
    then every op of the older kind (an `Assign`, as optimizer, fast-weight and running-statistics updates
    run) waits for the launch thread to catch up, and a step's many small updates cost more than its kernels
    (the op-by-op step was several times slower with the launch thread, docs/ms27.md). Then MindSpore's own
    `str()` of dtypes is kept, which the layer's import replaces (defects.py)."""
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    mindspore.runtime.launch_blocking()
    from compat.layers.ms27 import defects
    defects.before_import()


def after_import(torch):
    from compat.layers.ms27 import defects
    return defects.apply(torch)


def functional(F):
    """The layer's own `nn.functional`, with compat's `batch_norm`, `instance_norm` and `normalize` in place of its
    own (compat/torch_forms.py: torch's semantics, op by op and in graphs): the layer's batch norm swaps the affine
    and the running statistics (the batch-norm row), its normalize has another eps and no graph form."""
    from compat import torch_forms
    return torch_forms.install(F)


def graph_forms(on):
    from compat.layers.ms27 import graph
    graph.swap(on)


def set_device(key):
    from mindtorch._bind import set_default_device
    set_default_device(_DEVICES[key])
