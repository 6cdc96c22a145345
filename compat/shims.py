"""Runtime shims that let PyPI `mindtorch` 0.4.0 import on the MindSpore 2.6 pre-release.

mindtorch 0.4.0 was written against MindSpore 2.3/2.4; PyPI serves no stable MindSpore 2.1-2.6, only the
`mindspore-dev` 2.6.0.dev builds, where two things it uses at import time were renamed or removed. Each shim
checks for the gap first, so on a MindSpore that still has the old name (or on MSAdapter's 2.0.0) nothing is
touched. `apply()` must run after `import mindspore` and before `import mindtorch`.
"""


def _alias_tensor_class():
    """MindSpore 2.6 renamed the C++ tensor class `mindspore._c_expression.Tensor` to `TensorPy`
    (`mindspore.Tensor` is now a Python subclass of it); mindtorch imports it under the old name."""
    from mindspore import _c_expression
    if hasattr(_c_expression, "Tensor") or not hasattr(_c_expression, "TensorPy"):
        return None
    _c_expression.Tensor = _c_expression.TensorPy
    return "mindspore._c_expression.Tensor = TensorPy"


def _pow_sequence_overloads():
    """MindSpore 2.6 dropped the (Tuple|List, Tensor) and (Tensor, Tuple|List) overloads of the `**` operator
    table (`multitype_ops.pow_`); mindtorch looks them up to wrap them and fails at import without them.
    Registered again with the rule the other arithmetic tables (`mod`, `add`, ...) still use: the sequence
    becomes a tensor of the other operand's dtype."""
    from mindspore import dtype as mstype
    from mindspore.ops import functional as ms_F
    from mindspore.ops.composite.multitype_ops import _compile_utils
    from mindspore.ops.composite.multitype_ops.pow_impl import pow_

    wanted = [("Tuple", "Tensor"), ("Tensor", "Tuple"), ("List", "Tensor"), ("Tensor", "List")]
    have = set()
    for sigs, _ in pow_.entries:
        for names in wanted:
            if len(sigs) == 2 and all(mstype._issubclass_(mstype.typing.str_to_type(n), s)
                                      for n, s in zip(names, sigs)):
                have.add(names)
    missing = [names for names in wanted if names not in have]

    def seq_pow_tensor(x, y):
        return ms_F.tensor_pow(_compile_utils.sequence_to_tensor(x, y.dtype), y)

    def tensor_pow_seq(x, y):
        return ms_F.tensor_pow(x, _compile_utils.sequence_to_tensor(y, x.dtype))

    for names in missing:
        pow_.register(*names)(seq_pow_tensor if names[1] == "Tensor" else tensor_pow_seq)
    return "pow_ overloads %s" % ", ".join("(%s)" % ", ".join(n) for n in missing) if missing else None


def apply():
    """Apply the shims this MindSpore needs; return the list of what was done (empty when none)."""
    done = []
    for shim in (_alias_tensor_class, _pow_sequence_overloads):
        what = shim()
        if what:
            done.append(what)
    return done
