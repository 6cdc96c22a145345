"""One process of tests/test_distributed.py: a rank of a data-parallel run (started by
reid.engine.distributed.launch) or the single reference process. Trains the tiny test model for a few
iterations without hooks and records, after every step, the loss and every parameter and buffer.

    python tests/_dist_child.py OUT_DIR DATA_ROOT ITERATIONS [--resume] [--save-at I] [--die-rank R --die-at I]
        [--record DIR | --follow DIR] [--float64] [--max-restarts 0] [KEY VALUE ...]

--save-at I: rank 0 saves a checkpoint (the one --resume continues from) after iteration I.
--die-at I: rank R kills itself with SIGKILL at the start of iteration I (a crashed rank).
--record DIR: save the full training state before every step (and the fast-weight steps of meta steps) in
DIR; --follow DIR: load that state before every step and take the recorded fast-weight steps (teacher
forcing: every step of the following run starts where the recording run's did).
--float64 (torch only): parameters, buffers, images and the gradient all-reduce in float64.
Writes OUT_DIR/steps_rank<R>.npz (kinds, losses, weights, buffers after every step, with --record the
weights before every step, and the compiled step graphs built: empty op by op) and OUT_DIR/world_rank<R>.txt.
"""
import argparse
import faulthandler
import os
import signal
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    faulthandler.enable()  # a native crash prints the Python stack (as train.py's)
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("iterations", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--save-at", type=int, default=-1)
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--record", default=None)
    p.add_argument("--follow", default=None)
    p.add_argument("--float64", action="store_true")
    p.add_argument("--max-restarts", type=int, default=0)  # what the launcher appends for train.py
    p.add_argument("opts", nargs="*")
    args = p.parse_intermixed_args()

    import compat
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    from reid.modeling.utils import named_state
    from tests.test_training import NO_AUG, TINY, _load_step_state, _step_state

    if args.float64:  # torch only: the default dtype makes every parameter, buffer and new tensor float64
        compat.torch.set_default_dtype(compat.torch.float64)
    group = compat.distributed.init()
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   TINY + NO_AUG + ["DATASETS.ROOT", args.root, "OUTPUT_DIR", args.out] + list(args.opts))
    trainer = Trainer(cfg, resume=args.resume, quiet=True)
    params = [name for name, _ in trainer.model.named_parameters()]
    if args.float64:
        trainer.model.double()  # (the initialisation writes float32 arrays into the parameters)
        steps = trainer.steps

        def float64_steps(kind, batch, present, fast=None):
            return steps(kind, {k: v.double() if v.is_floating_point() else v for k, v in batch.items()},
                         present, fast)
        trainer.steps = float64_steps
    records = {"kinds": [], "losses": [], "weights": [], "buffers": [], "before": []}

    def weights():
        state = named_state(trainer.model)
        return np.concatenate([compat.to_numpy(state[n]).ravel() for n in params])

    def snapshot():
        state = named_state(trainer.model)
        records["weights"].append(weights())
        records["buffers"].append(np.concatenate([np.asarray(compat.to_numpy(v), np.float64).ravel()
                                                  for n, v in sorted(state.items()) if n not in params]))
        records["kinds"].append(trainer.step_log[-1][1])
        records["losses"].append(trainer.step_log[-1][2])

    def state_path(kind):
        return os.path.join(args.record or args.follow, "%s%03d.pth" % (kind, len(records["kinds"])))

    own_steps = trainer.fast_weight_steps

    def fast_weight_steps(grads):
        computed = own_steps(grads)
        if args.follow:
            return [compat.as_tensor(a) for a in compat.checkpoint.load(state_path("fast"))]
        if args.record:
            compat.checkpoint.save([compat.to_numpy(x) for x in computed], state_path("fast"))
        return computed
    trainer.fast_weight_steps = fast_weight_steps

    for kind in ("basic_step", "meta_step"):
        original = getattr(trainer, kind)

        def recorded(original=original):
            if args.follow:
                _load_step_state(trainer, compat.checkpoint.load(state_path("state")))
            elif args.record:
                compat.checkpoint.save(_step_state(trainer), state_path("state"))
                records["before"].append(weights())
            original()
            snapshot()
        setattr(trainer, kind, recorded)

    for trainer.iter in range(trainer.start_iter, args.iterations):
        if trainer.iter == args.die_at and group.rank == args.die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        trainer.run_step()
        if trainer.iter == args.save_at and group.is_main:
            trainer.save_checkpoint("model_iter_%07d.pth" % (trainer.iter + 1))
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "steps_rank%d.npz" % group.rank), kinds=np.array(records["kinds"]),
             losses=np.array(records["losses"]), weights=np.stack(records["weights"]),
             buffers=np.stack(records["buffers"]), start_iter=trainer.start_iter,
             before=np.stack(records["before"]) if records["before"] else np.zeros(0),
             graphs=np.array(sorted("%s %s" % key for key in trainer.steps.cache)
                             if getattr(trainer.steps, "compiled", False) else [], dtype=str))
    with open(os.path.join(args.out, "world_rank%d.txt" % group.rank), "w") as fh:
        fh.write("%d %d\n" % (group.rank, group.world_size))
    group.shutdown()


if __name__ == "__main__":
    main()
