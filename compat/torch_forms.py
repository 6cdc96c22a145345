"""torch.nn.functional's signatures over compat's forms, which the torch-API layer's `F` takes in place of its
own (the layer's `functional`, compat/layers/), op by op and in graphs alike: model code calls
`F.batch_norm`, `F.instance_norm`, `F.normalize` as on torch. On torch nothing here is used.

- batch_norm / instance_norm: MindSpore's fused kernel with torch's running-statistics rule (compat/norm.py),
  inside graphs the forms a graph can hold (running-statistics updates handed out through gradients where a
  graph cannot write them);
- max_pool2d in ceil mode: the plain pooling kernel on a map padded with -inf (compat/functional.py);
- normalize: torch's eps default (1e-12; the layer's is 1e-6) and a norm whose gradient is right
  (compat/functional.py), in the forms MindSpore's graph compiler and ONNX writer take.
"""
from compat import functional as _functional, norm as _norm


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm: training False normalises with the running statistics; training True
    with the batch statistics, updating the running statistics given (torch's rule, unbiased variance), none
    where they are None."""
    if not training:
        return _norm.batch_norm(input, running_mean, running_var, weight, bias, "eval", momentum, eps)
    if running_mean is None:
        return _norm.batch_norm(input, None, None, weight, bias, "hold", momentum, eps)
    return _norm.batch_norm(input, running_mean, running_var, weight, bias, "general", momentum, eps)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """torch.nn.functional.instance_norm with input statistics (no running statistics)."""
    return _norm.instance_norm(input, weight, bias, eps)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """torch.nn.functional.normalize: input / max(||input||_p over dim, eps)."""
    return _functional.normalize(input, p, dim, eps)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool2d; ceil mode without padding as compat.functional.max_pool2d_ceil (the layer
    runs ceil mode through a 3-D pooling kernel that also computes indices, several times slower)."""
    if ceil_mode and padding == 0 and dilation == 1 and not return_indices:
        return _functional.max_pool2d_ceil(input, kernel_size, kernel_size if stride is None else stride)
    return _LAYER["max_pool2d"](input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


FUNCTIONAL = ("batch_norm", "instance_norm", "normalize", "max_pool2d")
_LAYER = {}  # the layer's own functions these replace


def install(F):
    """Put the forms above into the layer's `F` (once); returns F."""
    for name in FUNCTIONAL:
        form, previous = globals()[name], getattr(F, name, None)   # (the layer has no instance_norm)
        if previous is not form:
            _LAYER[name] = previous
            # the layer's own function, before any fix of compat's (tests show its defect with it)
            form.compat_original = getattr(previous, "compat_original", previous)
            setattr(F, name, form)
    return F
