"""Training checkpoints: model + both optimizers + iteration + data-stream positions + RNG state, written
atomically in the torch `.pth` zip format by `compat.checkpoint` (readable by either backend and by real
torch), with a `last_checkpoint` pointer file for `--resume`."""
import os

from compat import checkpoint as ckpt_io
from reid.errors import UserError
from reid.modeling.original import our_state

POINTER = "last_checkpoint"


class Checkpointer:
    def __init__(self, output_dir):
        self.output_dir = output_dir

    def path(self, name):
        return os.path.join(self.output_dir, name)

    def save(self, name, state, point=True):
        """Write `state` to OUTPUT_DIR/name, then (`point`) point last_checkpoint at it (both atomic).
        model_best.pth is saved with point=False: --resume continues from the newest state, not the best."""
        os.makedirs(self.output_dir, exist_ok=True)
        target = self.path(name)
        ckpt_io.save(state, target)
        if not point:
            return target
        tmp = self.path(POINTER + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(name + "\n")
        os.replace(tmp, self.path(POINTER))
        return target

    def last(self):
        """Path of the checkpoint last_checkpoint names, or None when there is none."""
        pointer = self.path(POINTER)
        if not os.path.exists(pointer):
            return None
        with open(pointer) as fh:
            name = fh.read().strip()
        target = self.path(name)
        if not name or not os.path.exists(target):
            raise UserError("%s names %r, which does not exist; delete %s to start over or point it at an existing "
                            "checkpoint" % (pointer, name, pointer))
        return target

    def load_last(self):
        target = self.last()
        if target is None:
            raise UserError("--resume: no checkpoint in %s (no %s file); run without --resume to start training"
                            % (self.output_dir, POINTER))
        return target, load_training_state(target)


def load_training_state(path):
    state = ckpt_io.load(path)
    missing = [k for k in ("model", "optimizer", "iteration") if k not in state]
    if missing:
        raise UserError("%s is not a training checkpoint of this project (missing %s); use MODEL.WEIGHTS to start "
                        "from model weights instead of --resume" % (path, ", ".join(missing)))
    return state


def check_weights_file(path):
    """A one-line error unless the weights file `path` (MODEL.WEIGHTS) exists."""
    if not os.path.isfile(path):
        raise UserError("weights file %s does not exist; check MODEL.WEIGHTS" % path)


def model_state_from_file(path):
    """The model state dict stored in `path`, in this project's names: a training checkpoint of ours ({'model':
    ...}; the weight average instead when it was trained with SOLVER.EMA, the weights its evaluations scored), a
    plain state dict (ours or a real PyTorch `.pth`), or a checkpoint of the original ACL-DGReID code (its
    fast-reid {'model': ...} dict, keys perhaps prefixed with `module.`), renamed by reid.modeling.original."""
    check_weights_file(path)
    state = ckpt_io.load(path)
    hooks = state.get("hooks") if isinstance(state, dict) else None
    average = (hooks.get("WeightAverage") or {}).get("average") if isinstance(hooks, dict) else None
    if isinstance(average, dict):
        return our_state(average, path)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        return our_state(state["model"], path)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        return our_state(state["state_dict"], path)
    if isinstance(state, dict) and state and all(hasattr(v, "shape") for v in state.values()):
        return our_state(state, path)
    raise UserError("%s holds no model state dict (expected a dict of arrays, or a checkpoint with a 'model' "
                    "entry); check MODEL.WEIGHTS" % path)
