"""SGD with torch.optim.SGD semantics and explicit gradients (no `.grad`, no `loss.backward()`).

    opt = SGD(params_or_groups, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)
    opt.step(grads)          # grads aligned with opt.params; None = that parameter is left untouched

Update rule per parameter (torch's, coupled L2):
    d = g + weight_decay * p
    buf = d                               on the first step with momentum
    buf = momentum * buf + (1 - dampening) * d   afterwards
    d = d + momentum * buf if nesterov else buf  (only when momentum != 0)
    p = p - lr * d

On MindSpore the whole rule is one fused `ops.SGD` kernel call per parameter (its `stat` input is torch's
"first step initialises the buffer" switch), several times cheaper than composing it from adapter ops
(bench/optim_step.py; docs/performance.md#kernels); on torch it
is the same per-tensor arithmetic torch.optim.SGD runs on CPU, so results are bitwise equal.

`state_dict()` has torch's layout ({'state': {index: {'momentum_buffer': array|None}}, 'param_groups': [...]})
with numpy buffers, so optimizer checkpoints are backend-neutral (and torch optimizer state loads too).
"""
import numpy as np

import compat as _c
from compat.errors import UserError

_HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov")


def _number(name, value, minimum=0.0):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UserError("SGD %s must be a number, got %r" % (name, value)) from None
    if not np.isfinite(value) or value < minimum:
        raise UserError("SGD %s must be a finite number >= %g, got %r" % (name, minimum, value))
    return value


def _check_group(group, index):
    for key in ("lr", "momentum", "dampening", "weight_decay"):
        group[key] = _number("%s (param group %d)" % (key, index), group[key])
    group["nesterov"] = bool(group["nesterov"])
    if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
        raise UserError("SGD param group %d: nesterov needs momentum > 0 and dampening = 0 (got momentum=%g, "
                        "dampening=%g); fix the optimizer settings" % (index, group["momentum"], group["dampening"]))
    if group.get("maximize"):
        raise UserError("SGD param group %d: maximize=True is not supported; negate the loss instead" % index)


class SGD:
    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        params = list(params)
        if not params:
            raise UserError("SGD got an empty parameter list; pass the model's trainable parameters")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        seen = set()
        for index, spec in enumerate(groups):
            if not isinstance(spec, dict) or "params" not in spec:
                raise UserError("SGD param group %d must be a dict with a 'params' list (got %s); pass either "
                                "parameters or a list of such dicts" % (index, type(spec).__name__))
            group = dict(defaults)
            group.update(spec)
            group["params"] = list(spec["params"])
            for p in group["params"]:
                if not _c.is_tensor(p):
                    raise UserError("SGD param group %d holds a %s, not a tensor parameter" % (index, type(p).__name__))
                if id(p) in seen:
                    raise UserError("SGD: a parameter appears twice (again in param group %d); each parameter may "
                                    "belong to one group only" % index)
                seen.add(id(p))
            _check_group(group, index)
            self.param_groups.append(group)
        self.params = [p for g in self.param_groups for p in g["params"]]
        # Per parameter: momentum buffer, None until its first step with momentum (torch keeps no state before).
        self._buffers = [None] * len(self.params)
        self._backend = _MindSporeUpdate() if _c.IS_MINDSPORE else _TorchUpdate()

    def set_lr(self, lr):
        """Set every group's lr to lr * group['lr_factor'] (factor 1 when absent)."""
        for group in self.param_groups:
            group["lr"] = float(lr) * float(group.get("lr_factor", 1.0))

    def step(self, grads):
        grads = list(grads)
        if len(grads) != len(self.params):
            raise UserError("SGD.step got %d gradients for %d parameters; pass one gradient (or None) per entry of "
                            "opt.params, in that order" % (len(grads), len(self.params)))
        index = 0
        for group in self.param_groups:
            hyper = tuple(group[k] for k in _HYPER)
            for p in group["params"]:
                g = grads[index]
                if g is not None:
                    if isinstance(g, np.ndarray):
                        g = _c.as_tensor(g)
                    if tuple(g.shape) != tuple(p.shape):
                        raise UserError("SGD.step: gradient %d has shape %s but its parameter has shape %s"
                                        % (index, tuple(g.shape), tuple(p.shape)))
                    self._buffers[index] = self._backend.update(p, g, self._buffers[index], *hyper)
                index += 1

    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self):
        state = {i: {"momentum_buffer": self._backend.buffer_to_numpy(buf)}
                 for i, buf in enumerate(self._buffers) if buf is not None}
        groups, start = [], 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(saved)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        try:
            saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        except (KeyError, TypeError):
            raise UserError("optimizer state must be a dict with 'state' and 'param_groups' (got %s); pass what "
                            "SGD.state_dict() or torch's optimizer.state_dict() returned"
                            % type(state_dict).__name__) from None
        if len(saved_groups) != len(self.param_groups):
            raise UserError("optimizer state has %d param groups, this optimizer has %d; it was saved for a "
                            "different parameter grouping" % (len(saved_groups), len(self.param_groups)))
        index_of = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise UserError("optimizer state param group %d has %d parameters, this optimizer has %d"
                                % (gi, len(saved["params"]), len(group["params"])))
            for key in saved["params"]:
                index_of[key] = len(index_of)
        new_groups = []
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            merged = {k: v for k, v in saved.items() if k != "params"}
            merged["params"] = group["params"]
            for key in _HYPER:
                merged.setdefault(key, group[key])
            _check_group(merged, gi)
            new_groups.append(merged)
        buffers = [None] * len(self.params)
        for key, entry in saved_state.items():
            if key not in index_of:
                raise UserError("optimizer state refers to parameter %r that no param group lists" % (key,))
            i = index_of[key]
            buf = entry.get("momentum_buffer") if isinstance(entry, dict) else None
            if buf is not None:
                buf = _c.to_numpy(buf) if not isinstance(buf, np.ndarray) else buf
                if tuple(buf.shape) != tuple(self.params[i].shape):
                    raise UserError("optimizer momentum buffer %d has shape %s, its parameter has shape %s"
                                    % (i, tuple(buf.shape), tuple(self.params[i].shape)))
                buf = self._backend.buffer_from_numpy(buf, self.params[i])
            buffers[i] = buf
        self.param_groups, self._buffers = new_groups, buffers


class _TorchUpdate:
    """torch.optim.SGD's single-tensor CPU path, op for op."""

    def update(self, p, g, buf, lr, momentum, dampening, weight_decay, nesterov):
        torch = _c.torch
        with torch.no_grad():
            d = g if weight_decay == 0 else g.add(p, alpha=weight_decay)
            if momentum != 0:
                if buf is None:
                    buf = torch.clone(d).detach()
                else:
                    buf.mul_(momentum).add_(d, alpha=1 - dampening)
                d = d.add(buf, alpha=momentum) if nesterov else buf
            p.add_(d, alpha=-lr)
        return buf

    @staticmethod
    def buffer_to_numpy(buf):
        return buf.detach().cpu().numpy().copy()

    @staticmethod
    def buffer_from_numpy(array, param):
        return _c.torch.from_numpy(np.array(array)).to(device=param.device, dtype=param.dtype)


class _MindSporeUpdate:
    """One fused `mindspore.ops.SGD` call per parameter (in place on the parameter and its buffer)."""

    def __init__(self):
        import mindspore
        self._ms = mindspore
        self._kernels = {}    # (dampening, weight_decay, nesterov) -> primitive (they are kernel attributes)
        self._scalars = {}    # (value, dtype) -> 0-d tensor for lr / momentum inputs
        self._zeros = {}      # (shape, dtype) -> shared all-zero tensor: `stat` after the first step
        # and the (unused) accumulator of momentum-free groups; the kernel never writes a non-zero into it.

    def _kernel(self, dampening, weight_decay, nesterov):
        key = (dampening, weight_decay, nesterov)
        if key not in self._kernels:
            self._kernels[key] = self._ms.ops.SGD(dampening=float(dampening), weight_decay=float(weight_decay),
                                                  nesterov=bool(nesterov))
        return self._kernels[key]

    def _scalar(self, value, dtype):
        key = (value, dtype)
        if key not in self._scalars:
            if len(self._scalars) > 4096:  # an lr per iteration would grow this forever
                self._scalars.clear()
            self._scalars[key] = self._ms.Tensor(value, dtype)
        return self._scalars[key]

    def _zeros_like(self, p):
        key = (tuple(p.shape), p.dtype)
        if key not in self._zeros:
            self._zeros[key] = self._ms.ops.zeros(tuple(p.shape), p.dtype)
        return self._zeros[key]

    def update(self, p, g, buf, lr, momentum, dampening, weight_decay, nesterov):
        ops = self._ms.ops
        if momentum != 0 and buf is None:
            buf = ops.zeros(tuple(p.shape), p.dtype)
            stat = ops.ones(tuple(p.shape), p.dtype)   # first step: the kernel copies d into buf
        else:
            stat = self._zeros_like(p)
        accum = buf if momentum != 0 else self._zeros_like(p)
        self._kernel(dampening, weight_decay, nesterov)(p, g, self._scalar(lr, p.dtype), accum,
                                                        self._scalar(momentum, p.dtype), stat)
        return buf

    @staticmethod
    def buffer_to_numpy(buf):
        return buf.asnumpy().copy()

    def buffer_from_numpy(self, array, param):
        return self._ms.Tensor(np.array(array, order="C"), param.dtype)  # keeps 0-d arrays 0-d
