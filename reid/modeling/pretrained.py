"""ImageNet initialisation from a ResNet-50-IBN-a checkpoint (`resnet50_ibn_a-d9d0bb7b.pth`, IBN-Net
layout: conv1, bn1, layerS.B.{conv1,bn1,conv2,bn2,conv3,bn3,downsample.0,downsample.1}, bn1 split into
`bn1.IN` / `bn1.BN` in stages 1-3, fc) or a plain ResNet-50 one (`resnet50-19c8e357.pth`).

Plain backbones load by name. The ACL backbone follows the original's weight surgery (docs/method.md#pretrained):
  * stem and main stages (2/3/5/2 blocks) load by name from the first blocks of each stage;
  * CODE block s takes its branches from the checkpoint's last block of stage s (layer1.2, layer2.3,
    layer3.5, layer4.2; generally `layer{s}.{blocks_s - 1}` of ResNet-50's 3/4/6/3):
      static branch `code{s}.adaptor_base.X` <- `X` of that block when present with the same shape (in IBN
        stages bn1 has no plain `bn1.weight` key, so it keeps its init, exactly as the original);
      experts `code{s}.adaptor_sub`:
        conv1, bn2, and bn1 when the layouts agree: copied;
        conv2 (p, p/K, 3, 3): the block's conv2 averaged over groups of K consecutive input channels;
        conv3 (K*C, p/K, 1, 1): the block's conv3 averaged the same way, repeated K times along outputs;
        bn3 (K*C): the block's bn3 repeated K times;
        bn1 as IBN where the block has a plain BN (stage 4): IN <- first half, BN <- second half.
Router, fusion norms, gate, SE and head keep their initialisation. `num_batches_tracked` and `fc.*` are
ignored. A missing file, a missing stem/main-stage key or a shape mismatch raises a UserError naming it.

A trained ACL network instead (a whole model's state dict or a backbone's, ours or the original code's, in
any checkpoint layout MODEL.WEIGHTS reads) starts the backbone as it is: every backbone tensor by name, none
missing; the head keeps its initialisation.
"""
import os

import numpy as np

from reid.errors import UserError

from reid.modeling.backbones.acl_resnet import ACLResNet
from reid.modeling.backbones.resnet import RESNET50_BLOCKS, ResNet
from reid.modeling.original import our_state, strip_module_prefix, sub_state
from reid.modeling.utils import named_state


def _checkpoint():
    """compat.checkpoint: torch's file format read without torch, weights written in place (the package's one seam
    into compat, imported on first use so that the model code itself needs only the torch API)."""
    from compat import checkpoint
    return checkpoint


def numpy_state(module):
    """{name: numpy copy} of every parameter and buffer (`named_parameters()` / `named_buffers()` names)."""
    return {k: _checkpoint().to_numpy(v) for k, v in named_state(module).items()}


def load_numpy_state(module, state, strict=True):
    """Copy numpy arrays into the parameters / buffers of the same name, in place (compat.checkpoint: a built
    graph goes on reading them). strict: every name must be present on both sides. Returns the names that were
    loaded."""
    targets = named_state(module)
    if strict:
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise UserError("state does not match the model: missing %s, unexpected %s"
                            % (missing[:5] or "none", unexpected[:5] or "none"))
    loaded = []
    for name, target in targets.items():
        if name not in state:
            continue
        value = np.asarray(state[name], dtype=np.float32)
        if tuple(value.shape) != tuple(target.shape):
            raise UserError("%s: shape %s in the state, %s in the model" % (name, tuple(value.shape),
                                                                          tuple(target.shape)))
        _checkpoint().write(target, value)
        loaded.append(name)
    return loaded


def read_checkpoint(path):
    """A torch `.pth` file -> {name: numpy array} (through compat.checkpoint; no torch needed)."""
    path = os.path.expanduser(str(path or ""))
    if not path:
        raise UserError("MODEL.BACKBONE.PRETRAIN is on but MODEL.BACKBONE.PRETRAIN_PATH is empty; give the path of "
                        "resnet50_ibn_a-d9d0bb7b.pth or set MODEL.BACKBONE.PRETRAIN False")
    if not os.path.isfile(path):
        raise UserError("pretrained weights %s do not exist; download resnet50_ibn_a-d9d0bb7b.pth (IBN-Net release "
                        "v1.0) and set MODEL.BACKBONE.PRETRAIN_PATH to it" % path)
    state = _checkpoint().load(path)
    for entry in ("model", "state_dict"):   # a training checkpoint (fast-reid's and ours), a wrapped state dict
        if isinstance(state, dict) and isinstance(state.get(entry), dict):
            state = state[entry]
            break
    if not isinstance(state, dict):
        raise UserError("%s does not hold a state dict (got %s)" % (path, type(state).__name__))
    return {k: np.asarray(v) for k, v in strip_module_prefix(state, path).items()}


def trained_acl_backbone(ckpt, source, report=None):
    """The backbone state (our names, keys without 'backbone.') when `ckpt` holds a trained ACL backbone: a
    whole model's state dict, ours or the original code's (reid/modeling/original.py; `report` as there), or a
    backbone's own; None for anything else (an ImageNet ResNet)."""
    state = ckpt if any(k.startswith("backbone.") for k in ckpt) else {"backbone." + k: v for k, v in ckpt.items()}
    state = sub_state(our_state(state, source, report), "backbone.")
    return state if any(k.startswith("code") for k in state) else None


def _pool_inputs(weight, k):
    """Average groups of k consecutive input channels: (out, in, kh, kw) -> (out, in/k, kh, kw)."""
    out_c, in_c, kh, kw = weight.shape
    return weight.reshape(out_c, in_c // k, k, kh, kw).mean(2)


def _take(ckpt, key, shape, what):
    if key not in ckpt:
        raise UserError("pretrained checkpoint lacks %s (needed for %s); is it resnet50_ibn_a-d9d0bb7b.pth at "
                        "this BASE_WIDTH?" % (key, what))
    value = np.asarray(ckpt[key], dtype=np.float32)
    if tuple(value.shape) != tuple(shape):
        raise UserError("pretrained %s has shape %s but %s needs %s; the checkpoint does not match "
                        "MODEL.BACKBONE.BASE_WIDTH / WITH_IBN" % (key, tuple(value.shape), what, tuple(shape)))
    return value


def acl_surgery(backbone, ckpt):
    """{backbone state name: array} for an ACLResNet from a ResNet-50-IBN-a checkpoint dict (see module doc)."""
    k = backbone.num_experts
    out = {}
    for name, current in numpy_state(backbone).items():
        shape = current.shape
        if not name.startswith("code"):
            out[name] = _take(ckpt, name, shape, name)
            continue
        stage = int(name[4])
        block = "layer%d.%d" % (stage, RESNET50_BLOCKS[stage - 1] - 1)
        rest = name.split(".", 2)                     # ['code1', 'adaptor_sub', 'bn3.weight']
        if rest[1] == "adaptor_base":
            src = "%s.%s" % (block, rest[2])
            if src in ckpt:
                out[name] = _take(ckpt, src, shape, name)
        elif rest[1] == "adaptor_sub":
            out[name] = _expert_weight(ckpt, block, rest[2], shape, k, name)
    return out


def _expert_weight(ckpt, block, local, shape, k, name):
    layer = local.split(".")[0]
    if layer == "conv3":
        v = _pool_inputs(_take_any(ckpt, block + ".conv3.weight", name), k)
        return _check(np.tile(v, (k, 1, 1, 1)), shape, block + ".conv3.weight", name)
    if layer == "bn3":
        v = _take_any(ckpt, "%s.%s" % (block, local), name)
        return _check(np.tile(v, k), shape, "%s.%s" % (block, local), name)
    if layer == "conv2":
        v = _take_any(ckpt, block + ".conv2.weight", name)
        return _check(v if v.shape == shape else _pool_inputs(v, k), shape, block + ".conv2.weight", name)
    src = "%s.%s" % (block, local)
    if src in ckpt:
        return _take(ckpt, src, shape, name)
    parts = local.split(".")                          # bn1.IN.weight: IBN experts, plain-BN checkpoint block
    if layer == "bn1" and len(parts) == 3 and parts[1] in ("IN", "BN"):
        v = _take_any(ckpt, "%s.bn1.%s" % (block, parts[2]), name)
        half = v.shape[0] // 2
        return _check(v[:half] if parts[1] == "IN" else v[half:], shape, "%s.bn1.%s" % (block, parts[2]), name)
    return _take(ckpt, src, shape, name)              # raises the missing-key error


def _take_any(ckpt, key, what):
    if key not in ckpt:
        raise UserError("pretrained checkpoint lacks %s (needed for %s)" % (key, what))
    return np.asarray(ckpt[key], dtype=np.float32)


def _check(value, shape, key, what):
    if tuple(value.shape) != tuple(shape):
        raise UserError("pretrained %s gives shape %s for %s, which needs %s; the checkpoint does not match "
                        "MODEL.BACKBONE.BASE_WIDTH / NUM_EXPERTS" % (key, tuple(value.shape), what, tuple(shape)))
    return value


def plain_state(backbone, ckpt):
    """{backbone state name: array} for a plain ResNet: every parameter and running statistic by name."""
    return {name: _take(ckpt, name, current.shape, name) for name, current in numpy_state(backbone).items()}


def load_pretrained_backbone(model, source):
    """Initialise `model.backbone` (or a bare backbone) from `source`: a checkpoint path or a
    {name: array} dict in the ResNet-50(-IBN-a) layout. Returns the list of backbone names loaded."""
    backbone = getattr(model, "backbone", model)
    ckpt = read_checkpoint(source) if isinstance(source, (str, os.PathLike)) else dict(source)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "the pretrained state"
    notes = []
    trained = trained_acl_backbone(ckpt, where, notes.append)
    if trained is not None:
        # a trained ACL network (ours or the original's) starts this one: every backbone tensor by name
        _checkpoint().load_state_dict(backbone, trained)
        print("%s: a trained ACL backbone, its %d tensors loaded by name (no ImageNet weight surgery)%s"
              % (where, len(trained), "".join("; " + note for note in notes)))
        return list(trained)
    if isinstance(backbone, ACLResNet):
        state = acl_surgery(backbone, ckpt)
    elif isinstance(backbone, ResNet):
        state = plain_state(backbone, ckpt)
    else:
        raise UserError("no pretrained-weight rule for backbone %s" % type(backbone).__name__)
    return load_numpy_state(backbone, state, strict=False)
