"""Checkpoints of the original ACL-DGReID code: recognised, renamed into this model's names, and written back
in the original's names and format (docs/model.md "Models trained with the original code").

The original is built on fast-reid. Its checkpointer saves `{"model": state_dict, "optimizer": ...,
"lr_sched": ..., "warmup_sched": ..., "epoch": ..., "metric": ...}`; a state dict taken from its
`nn.DataParallel` wrapper has every key prefixed with `module.`. Its network holds every tensor of ours, with
the same shapes, under the names of NAME_TABLE, plus
  * tensors of the parts this project leaves out as dead (DEAD_PARTS; docs/model.md "Left out"), and
  * a `num_batches_tracked` counter in every batch norm. Its batch norms call F.batch_norm themselves with
    momentum 0.1, so the counter is never advanced (it stays 0) and nothing reads it; ours keep none.
Reading drops both kinds and says how many in one printed line; any other name without a row in the table
is an error naming it. Writing puts them back: counters at 0, dead parts at their initial values (they reach
no output), so the original code loads every key of the file.

Both directions keep every array as it is (same dtype, same bytes): ours -> original -> ours is bit-identical,
and so is original -> ours -> original for every tensor ours holds.
"""
import collections
import re

import numpy as np

from reid.errors import UserError

# (this project's name prefix, the original's name prefix); the rest of a name (conv1.weight, bn1.IN.bias,
# fc2.weight, gate, running_var ...) is the same on both sides. {s}: a stage (1-4); {d}: a source domain,
# counted from 0 here and from 1 there ({d+1}). The first matching row wins.
NAME_TABLE = (
    ("backbone.conv1.", "backbone.conv1."),
    ("backbone.bn1.", "backbone.bn1."),
    ("backbone.layer{s}.", "backbone.layer{s}."),
    ("backbone.code{s}.adaptor_base.", "backbone.adaptor{s}_base."),
    ("backbone.code{s}.adaptor_sub.", "backbone.adaptor{s}_sub."),
    ("backbone.code{s}.router.", "backbone.router{s}."),
    ("backbone.code{s}.invariant_norm.", "backbone.invariant_norm{s}."),
    ("backbone.code{s}.specific_norm.", "backbone.specific_norm{s}."),
    ("backbone.code{s}.meta_fuse.", "backbone.meta_fuse{s}."),
    ("backbone.code{s}.meta_se.", "backbone.meta_se{s}."),
    ("heads.bottleneck.", "heads.bottleneck.0."),
    ("heads.classifiers.{d}.", "heads.weight{d+1}."),
    ("heads.center.", "heads.center."),
)

# The original's tensors of parts this project does not build (original name prefix, what they are).
DEAD_PARTS = (
    ("backbone.router{s}.fc_classifier.", "router fc_classifier"),   # the router's domain classifier
    ("backbone.map{s}.", "map side outputs"),                       # BN of each stage's pooled output
)
BN_COUNTER = "num_batches_tracked"
MODULE_PREFIX = "module."
ORIGINAL_DOMAIN_LOGITS = 3   # the router's fc_classifier has 3 outputs whatever the number of domains


def _pattern(template):
    regex = re.escape(template)
    for field, group in (("{s}", r"(?P<s>\d+)"), ("{d}", r"(?P<d>\d+)"), ("{d+1}", r"(?P<d1>\d+)")):
        regex = regex.replace(re.escape(field), group)
    return re.compile(regex)


def _fill(template, stage=None, domain=None):
    if domain is not None:
        template = template.replace("{d+1}", str(domain + 1)).replace("{d}", str(domain))
    return template.replace("{s}", str(stage))


_OURS = [(_pattern(ours), ours, theirs) for ours, theirs in NAME_TABLE]
_THEIRS = [(_pattern(theirs), ours, theirs) for ours, theirs in NAME_TABLE]
_DEAD = [(_pattern(prefix), what) for prefix, what in DEAD_PARTS]
# prefixes only the original's names have: what tells its checkpoints from ours
_ORIGINAL_ONLY = [p for p, ours, theirs in _THEIRS if ours != theirs] + [p for p, _ in _DEAD]


def _translate(name, rows, to_original):
    for regex, ours, theirs in rows:
        match = regex.match(name)
        if match is None:
            continue
        fields = match.groupdict()
        domain = fields.get("d")
        if fields.get("d1") is not None:
            domain = int(fields["d1"]) - 1
            if domain < 0:
                return None
        domain = None if domain is None else int(domain)
        target = theirs if to_original else ours
        return _fill(target, fields.get("s"), domain) + name[match.end():]
    return None


def original_name(name):
    """The original's name of one of our tensor names (None when it has no counterpart)."""
    return _translate(name, _OURS, to_original=True)


def our_name(name):
    """Our name of one of the original's tensor names (None for dead parts, counters and unknown names)."""
    if dead_part(name) or name.endswith("." + BN_COUNTER):
        return None
    return _translate(name, _THEIRS, to_original=False)


def dead_part(name):
    """What an original name belongs to when it is one of the parts this project leaves out, else None."""
    for regex, what in _DEAD:
        if regex.match(name):
            return what
    return None


def strip_module_prefix(state, source="the checkpoint"):
    """The state with the `module.` prefix of a DataParallel-wrapped model's keys removed."""
    if not any(k.startswith(MODULE_PREFIX) for k in state):
        return state
    out = collections.OrderedDict()
    for key, value in state.items():
        bare = key[len(MODULE_PREFIX):] if key.startswith(MODULE_PREFIX) else key
        if bare in out:
            raise UserError("%s holds %s both with and without the 'module.' prefix; keep one copy of each tensor"
                            % (source, bare))
        out[bare] = value
    return out


def is_original(state):
    """True when the (unprefixed) state dict is in the original ACL-DGReID code's names."""
    return any(regex.match(key) for key in state for regex in _ORIGINAL_ONLY)


class RenamedState(collections.OrderedDict):
    """A state dict in our names read from a file that used the original's; `describe_key(name)` gives the
    name a key has there, which compat.checkpoint.load_state_dict adds to its error messages. `prefix`: what
    the keys lost when this is part of a whole model's state (a backbone's: 'backbone.')."""

    prefix = ""

    def describe_key(self, name):
        other = original_name(self.prefix + name)
        return other[len(self.prefix):] if other and other.startswith(self.prefix) else name


def sub_state(state, prefix):
    """The entries of `state` under `prefix`, with the prefix removed (a RenamedState stays one)."""
    if isinstance(state, RenamedState):
        out = RenamedState()
        out.prefix = state.prefix + prefix
    else:
        out = collections.OrderedDict()
    for key, value in state.items():
        if key.startswith(prefix):
            out[key[len(prefix):]] = value
    return out


def from_original(state, source="the checkpoint"):
    """(state in our names, {part: count} of the dropped tensors) from the original's state dict.
    A name neither in NAME_TABLE nor dropped is a UserError naming it."""
    out, dropped = RenamedState(), collections.Counter()
    for key, value in state.items():
        part = dead_part(key) or (BN_COUNTER if key.endswith("." + BN_COUNTER) else None)
        if part:
            dropped[part] += 1
            continue
        ours = our_name(key)
        if ours is None:
            raise UserError("%s holds %s, which has no counterpart in acl-reid's ACL network (the mapping is in "
                            "docs/model.md, 'Models trained with the original code'); remove it from the file if "
                            "it is not part of the original ACL network" % (source, key))
        out[ours] = value
    return out, dropped


def dropped_summary(dropped):
    parts = ", ".join("%d %s" % (n, part) for part, n in sorted(dropped.items(), key=lambda kv: -kv[1]))
    return "dropped %d tensors of parts acl-reid leaves out (%s)" % (sum(dropped.values()), parts or "none")


def our_state(state, source="the checkpoint", report=None):
    """A state dict read from a file, in our names: the `module.` prefix removed and, when it is in the original
    code's names, renamed; one printed line says so and counts what was dropped (`report(text)` instead of
    printing it gets that text, without the source). Every loader of weights files calls this
    (reid/engine/checkpointer.py model_state_from_file, reid/modeling/pretrained.py)."""
    state = strip_module_prefix(state, source)
    if not is_original(state):
        return state
    renamed, dropped = from_original(state, source)
    text = "a checkpoint of the original ACL-DGReID code, %d tensors renamed to acl-reid's names; %s" % (
        len(renamed), dropped_summary(dropped))
    if report is None:
        print("%s: %s" % (source, text))
    else:
        report(text)
    return renamed


def to_original(state):
    """Our (full-model) state dict -> the original's state dict, in its names and in the order its
    `model.state_dict()` has them, with the counters and dead parts it expects (see the module doc)."""
    state = strip_module_prefix(state)
    if is_original(state):
        raise UserError("the state dict is already in the original ACL-DGReID names; nothing to convert")
    if not any(k.startswith("backbone.code") for k in state):
        raise UserError("only the ACL network (CODE blocks, MODEL.META_ARCHITECTURE ACL) has a counterpart in the "
                        "original code; this state dict has no backbone.code* tensors")
    out = collections.OrderedDict()
    for key, value in state.items():
        name = original_name(key)
        if name is None:
            raise UserError("%s has no counterpart in the original ACL-DGReID network; convert the state dict of "
                            "an ACL model (MODEL.META_ARCHITECTURE ACL)" % key)
        out[name] = value
        stage = re.match(r"backbone\.code(\d+)\.", key)
        if key.endswith(".running_var"):
            out[name[:-len("running_var")] + BN_COUNTER] = np.zeros((), np.int64)
        if stage and key.endswith(".router.fc2.weight"):
            # the router's domain classifier: C*K -> 3, bias-free; no loss reads its logits
            out["backbone.router%s.fc_classifier.weight" % stage.group(1)] = np.zeros(
                (ORIGINAL_DOMAIN_LOGITS, np.shape(value)[0]), np.float32)
        if stage and key.endswith(".meta_se.fc2.weight"):
            channels = np.shape(value)[0]
            prefix = "backbone.map%s." % stage.group(1)   # a batch norm at its initial values
            out[prefix + "weight"] = np.ones(channels, np.float32)
            out[prefix + "bias"] = np.zeros(channels, np.float32)
            out[prefix + "running_mean"] = np.zeros(channels, np.float32)
            out[prefix + "running_var"] = np.ones(channels, np.float32)
            out[prefix + BN_COUNTER] = np.zeros((), np.int64)
    return out
