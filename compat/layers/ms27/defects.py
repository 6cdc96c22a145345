"""The ms27 stack's runtime fixes (mindnlp 0.5.1's `mindtorch` on stable MindSpore 2.7): the rows of its table
(compat/layers/ms27/__init__.py) that are fixed where the layer itself is patched.

mindnlp's `mindtorch` is the torch module itself (`mindtorch.nn`, `mindtorch.optim`), and its `Tensor` is
`mindspore.Tensor` with methods patched in globally. Each shim below closes one defect of that layer (or of
what its global patches do to MindSpore, or of MindSpore 2.7 itself where the stack meets it), checks for the
gap first and says what it did; tests/test_compat_ms27.py shows each defect without its shim and the fix with
it, repros/ms27_defects.py each defect without compat.
`before_import()` runs after `import mindspore` and before the layer's import, `apply(torch)` right after it
(the layer's `before_import` / `after_import`, called by compat/backend.py).
"""
import math

_SAVED = {}  # what the layer replaces, kept before its import


def _dtype_class():
    from mindspore._c_expression.typing import Type
    return Type


def before_import():
    """Keep MindSpore's own `str()` of its dtypes, which the layer's import replaces."""
    _SAVED.setdefault("dtype_str", _dtype_class().__str__)


def apply(torch):
    """Apply the shims this layer needs (`torch` = the top-level `mindtorch`); return what was done."""
    done = []
    for shim in (_identity_cast, _mindspore_dtype_names, _tensor_device_default, _move_to_same_device,
                 _vector_norm, _cross_entropy, _batch_norm_arguments, _map_workers_quit,
                 _float_buffers_as_parameters, _manual_seed_seeds_mindspore, _float_full_precision):
        what = shim(torch)
        if what:
            done.append(what)
    return done


def _float_buffers_as_parameters(torch):
    """A MindSpore graph writes only Parameters: a float buffer a module registers (`register_buffer`, e.g. the
    running statistics a batch norm keeps) becomes a Parameter without gradient, which compiled steps update in
    place (and `compat.jit.prepare` names); the module still holds it as a buffer (`named_buffers`, its
    state_dict). Model code registers its buffers as on torch."""
    import mindspore
    module = torch.nn.Module
    original = module.register_buffer
    if getattr(original, "_float_buffers_as_parameters", False):
        return None

    def register_buffer(self, name, tensor, persistent=True):
        if (tensor is not None and not isinstance(tensor, mindspore.Parameter)
                and tensor.dtype == mindspore.float32):
            tensor = torch.nn.Parameter(tensor, requires_grad=False)
        return original(self, name, tensor, persistent)
    register_buffer._float_buffers_as_parameters = True
    register_buffer.__doc__ = original.__doc__
    module.register_buffer = register_buffer
    return "float buffers registered as Parameters without gradient"


def _manual_seed_seeds_mindspore(torch):
    """mindtorch's `torch.manual_seed` seeds the layer's own generator only (mindtorch/random.py, its
    `mindspore.set_seed` commented out): MindSpore's global seed, which its initializers, its random ops
    outside the layer and `mindspore.dataset` draw from (and numpy's, which `mindspore.set_seed` sets too), stays
    as it was. Here `torch.manual_seed(seed)` first calls `mindspore.set_seed(seed)` (for a seed MindSpore takes:
    an int >= 0), then the layer's own, the order `compat.manual_seed` seeds in."""
    import mindspore
    original = torch.manual_seed
    if getattr(original, "_seeds_mindspore", False):
        return None

    def manual_seed(seed):
        if isinstance(seed, int) and seed >= 0:
            mindspore.set_seed(seed)
        return original(seed)
    manual_seed._seeds_mindspore = True
    manual_seed.compat_original = original   # (tests show the defect with it)
    manual_seed.__doc__ = original.__doc__
    torch.manual_seed = manual_seed
    return "torch.manual_seed also sets MindSpore's global seed"


def _float_full_precision(torch):
    """mindtorch's `float(tensor)` rounds the value to 5 decimal places (`round(float(item), 5)`): a loss logged
    through it keeps 6 significant digits, a gradient norm of 3e-6 reads 0.0, and `'%.7f' % t` prints zeros
    after the fifth. torch's `float()` is the tensor's value as a Python float, as `.item()` is here too."""
    def __float__(self):
        return float(self.item())
    return _replace_method(torch, "__float__", lambda original: __float__) and "float(tensor) keeps the full value"


def _replace_method(torch, name, make):
    """Put `make(the layer's method)` in place of the layer's Tensor method `name` on every class that has the
    layer's patch (`_patched_classes`), keeping the layer's as its `compat_original`; False where there is
    none, or it is replaced already."""
    classes = _patched_classes(torch, name)
    if not classes or getattr(vars(torch.Tensor)[name], "compat_original", None) is not None:
        return False
    original = vars(torch.Tensor)[name]
    method = make(original)
    method.compat_original = original
    for cls in classes:
        setattr(cls, name, method)
    return True


def _identity_cast(torch):
    """The older layers' conversion of a MindSpore result into their own tensor class, which compat calls after
    every MindSpore op it runs (`torch.cast_to_adapter_tensor`); this layer's Tensor is `mindspore.Tensor`."""
    if hasattr(torch, "cast_to_adapter_tensor"):
        return None
    torch.cast_to_adapter_tensor = _same_tensor
    return "cast_to_adapter_tensor = identity"


def _same_tensor(t):
    return t


def _mindspore_dtype_names(torch):
    """The layer's import sets `str()` of every MindSpore dtype to its `repr()` ('mindspore.float32' instead of
    'Float32'), for the whole process. MindSpore writes that string into files as the type name:
    `mindspore.save_checkpoint` then writes `.ckpt` files that no MindSpore reads back (`load_checkpoint`:
    `ValueError: 'mindspore.float32'`), on this stack or any other. MindSpore's own `str()` goes back; the
    layer's `repr()` (what it prints for a dtype) stays."""
    original = _SAVED.get("dtype_str")
    dtype = _dtype_class()
    if original is None or dtype.__str__ is original:
        return None
    _SAVED["layer_dtype_str"] = dtype.__str__
    dtype.__str__ = original
    return "MindSpore's str() of dtypes restored"


def _patched_classes(torch, name):
    """The classes whose attribute `name` is mindtorch's patch: `mindspore.Tensor` (= `torch.Tensor`), and
    MindSpore's `StubTensor` where this MindSpore still has it (mindtorch patches both)."""
    member = vars(torch.Tensor).get(name)
    classes = [torch.Tensor]
    try:
        from mindspore.common._stub_tensor import StubTensor
        classes.append(StubTensor)
    except ImportError:
        pass
    return [cls for cls in classes if member is not None and vars(cls).get(name) is member]


def _tensor_device_default(torch):
    """mindtorch keeps a tensor's device in `_device`, set by its own ops and constructors; a tensor made by a
    MindSpore op outside the layer (compat's fused batch norm, `mindspore.ops.assign`'s result, a compiled
    graph's outputs) has none, and the layer's next op on it raises `ValueError: Tensor must have device`.
    Such a tensor is where MindSpore put it: the layer's device in context (its default, 'cpu')."""
    from mindtorch._bind import get_device_in_context
    classes = _patched_classes(torch, "device")
    if not classes or getattr(vars(torch.Tensor)["device"], "fget", None) is _device_or_context:
        return None
    _SAVED["device_in_context"] = get_device_in_context
    _SAVED["layer_device"] = vars(torch.Tensor)["device"]
    for cls in classes:
        cls.device = property(_device_or_context)
    return "Tensor.device defaults to the layer's device in context"


def _device_or_context(tensor):
    try:
        return tensor._device
    except AttributeError:
        return _SAVED["device_in_context"]()


def _move_to_same_device(torch):
    """mindtorch's `Tensor.to('cpu')` (and `.to(device=...)`, `.cpu()`) copies the tensor through numpy even
    when it is on the CPU already: the copy is a new leaf, so whatever was computed before it has no gradient
    any more. The layer's binary ops (`a - b`, `a + b`, ...) first move both operands to their common device
    that way, so the gradient of `a - b` of two CPU tensors is zero too. A move to the device a tensor is on
    is the tensor itself, as in torch."""
    def same_device_move(original):
        def _move_to(self, device, non_blocking=False):
            if device.type != "meta" and self.device == device:
                return self
            return original(self, device, non_blocking)
        return _move_to

    if not _replace_method(torch, "_move_to", same_device_move):
        return None
    return "Tensor._move_to returns the tensor itself when it is on that device"


def _vector_norm(torch):
    """mindtorch's CPU `linalg_vector_norm` (behind `torch.linalg.vector_norm`, `torch.norm`, `Tensor.norm`)
    hands MindSpore's `LpNorm` the order as `int(ord)` and the dims as given: over all elements (`dim=None`,
    `x.norm()`) it raises ("the type of 'axis' should be one of int, tuple, list"), `ord=inf` raises
    (`int(inf)`), and a fractional order is truncated (`ord=2.5` computes the 2-norm). Here: all dims when none
    are given, max / min of |x| for +-inf, the count of non-zeros for 0, `LpNorm` for integral orders (the
    layer's own kernel and gradient) and sum(|x|^p)^(1/p) for the others."""
    from mindtorch._apis import cpu
    if getattr(cpu.linalg_vector_norm, "compat_original", None) is not None:
        return None
    import mindspore
    from mindspore import ops
    original = cpu.linalg_vector_norm

    def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
        if dtype is not None:
            x = x.astype(dtype)
        if dim is None:
            dim = tuple(range(x.ndim))
            if not dim:  # a 0-d tensor: its absolute value
                return ops.abs(x) if ord != 0 else ops.cast(x != 0, x.dtype)
        order = float(ord)
        if math.isinf(order):
            return (ops.amax if order > 0 else ops.amin)(ops.abs(x), dim, keepdim)
        if order == 0:
            return ops.sum(ops.cast(x != 0, x.dtype), dim, keepdim)
        if order.is_integer() and order > 0:
            return original(x, int(order), dim, keepdim)
        return ops.pow(ops.sum(ops.pow(ops.abs(x), order), dim, keepdim), mindspore.Tensor(1.0 / order, x.dtype))

    linalg_vector_norm.compat_original = original
    cpu.linalg_vector_norm = linalg_vector_norm
    return "CPU linalg_vector_norm takes dim=None, inf and fractional orders"


def _cross_entropy(torch):
    """mindtorch's `F.cross_entropy` on the CPU is `nll_loss(log_softmax(x))` through MindSpore's `LogSoftmax` kernel,
    whose output is off by many times float32 rounding, and so is the gradient (docs/ms27.md); MindSpore's own
    `ops.cross_entropy` computes x - logsumexp and is as accurate as torch. Class-index targets go to
    `ops.cross_entropy` here too; probability targets keep the layer's version."""
    F = torch.nn.functional
    if getattr(F.cross_entropy, "compat_original", None) is not None:
        return None
    from mindspore import ops
    original = F.cross_entropy

    def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                      reduction="mean", label_smoothing=0.0):
        if size_average is not None or reduce is not None:  # torch's deprecated pair, as torch reads it
            reduction = "mean" if size_average in (None, True) and reduce in (None, True) else (
                "sum" if reduce in (None, True) else "none")
        if target.dtype.is_floating_point:
            return original(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing)
        return ops.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)

    cross_entropy.compat_original = original
    F.cross_entropy = cross_entropy
    return "F.cross_entropy with class indices is MindSpore's ops.cross_entropy"


def _batch_norm_arguments(torch):
    """mindtorch's `F.batch_norm` (behind `nn.BatchNorm1d/2d/3d`) takes torch's argument order (input,
    running_mean, running_var, weight, bias, ...) and hands it on unchanged to its device kernels, which take
    (input, weight, bias, running_mean, running_var, ...): the running statistics become the affine and the
    affine the statistics. A training-mode BatchNorm2d outputs 1.0 everywhere (scale 0, offset 1) and the
    kernel writes its moving statistics into the weight and bias. The arguments go in the kernels' order here;
    the kernels themselves then give torch's output and running statistics (unbiased variance). compat's own
    norms (compat.batch_norm, which reid/ uses) call MindSpore's kernel directly and never met this."""
    F = torch.nn.functional
    if getattr(F.batch_norm, "compat_original", None) is not None:
        return None
    from mindtorch.executor import execute
    original = F.batch_norm

    def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                   eps=1e-05):
        channels = input.shape[1]

        def filled(value):
            return (torch.ones if value else torch.zeros)(channels, dtype=input.dtype, device=input.device)

        weight = filled(1) if weight is None else weight
        bias = filled(0) if bias is None else bias
        if running_mean is None or running_var is None:  # batch statistics only: scratch statistics
            running_mean, running_var, training = filled(0), filled(1), True
        return execute("batch_norm", input, weight, bias, running_mean, running_var, training, momentum, eps)[0]

    batch_norm.compat_original = original
    F.batch_norm = batch_norm
    return "F.batch_norm passes the kernels' argument order"


def _map_workers_quit(torch):
    """MindSpore 2.7's own dataset pipelines (not the layer): a `map` with worker processes starts a clean-up
    process beside them, and at the pipeline's end (`_PythonMultiprocessing._abort_monitor`) waits up to 5 s
    for it to quit before killing it. The quit event it should set first is guarded by a check of an attribute
    that does not exist (`hasattr(self, 'eof')`), so it is never set: every loader with workers (compat.data's
    batches, DATALOADER.NUM_WORKERS > 0) took 5 s more to end, twice per evaluation (query and gallery). The
    event is set before MindSpore's own shutdown runs; the clean-up process sees it within 0.1 s and quits."""
    import inspect
    from mindspore.dataset.engine import datasets
    pool = getattr(datasets, "_PythonMultiprocessing", None)
    original = getattr(pool, "_abort_monitor", None)
    if original is None or getattr(original, "compat_original", None) is not None:
        return None
    try:
        unguarded = "hasattr(self, 'eof')" in inspect.getsource(original)
    except (OSError, TypeError):
        return None
    if not unguarded:
        return None

    def _abort_monitor(self):
        event = getattr(self, "eof_clean_process", None)
        if event is not None:
            event.set()
        return original(self)

    _abort_monitor.compat_original = original
    pool._abort_monitor = _abort_monitor
    return "dataset map workers' clean-up process told to quit at the pipeline's end"
