"""Data-parallel training throughput: images/s of 1 process vs 2 processes (train.py --nproc 2's launcher), per
backend, at demo size (configs/synthetic/acl.yml: width 8, 64x32, batch 64, meta-domain batches 32), measured
in one run.

    python bench/dist.py [--iterations 7] [--backends mindspore,torch]

Each run trains iterations 0..N-1 without hooks and times iterations 1..N-1 on rank 0 (iteration 0 runs the
warm-up basic steps and builds the backward graphs of each step kind); images = the images of every step in
the timed iterations (the whole run's batch: with 2 processes each rank computes half of it). Runs the
default MindSpore env (.venv) and the torch env (.venv-torch) from whichever Python starts it. The launcher gives each
of N ranks cores / N threads; the single process keeps the backend's default (all cores) unless
REID_NUM_THREADS / OMP_NUM_THREADS say otherwise (on a loaded machine torch's default thread count can make the
single process several times slower: set OMP_NUM_THREADS=1 to compare like with like).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PYTHONS = {"mindspore": os.path.join(ROOT, ".venv", "bin", "python"),
           "torch": os.path.join(ROOT, ".venv-torch", "bin", "python")}
# op-by-op steps, as the figures in docs/performance.md were measured (the demo config compiles them: MODEL.JIT True)
OPTS = ["DATALOADER.NUM_WORKERS", "0", "TEST.EVAL_AT_START", "False", "MODEL.JIT", "False"]


def worker(out, iterations):
    """One rank (or the single process): train, time, write OUT/bench.json from rank 0."""
    import compat
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    group = compat.distributed.init()
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"), OPTS + ["OUTPUT_DIR", out])
    trainer = Trainer(cfg, quiet=True)
    per_kind = {"basic": int(cfg.SOLVER.IMS_PER_BATCH),
                "meta": int(cfg.META.IMS_PER_DOMAIN) * len(trainer.offsets)}
    images, start = 0, None
    for trainer.iter in range(iterations):
        if trainer.iter == 1:
            group.barrier()
            start = time.perf_counter()
        trainer.run_step()
        if trainer.iter >= 1:
            images += sum(per_kind[k] for k in trainer.iteration_plan(trainer.iter))
    group.barrier()
    seconds = time.perf_counter() - start
    if group.is_main:
        with open(os.path.join(out, "bench.json"), "w") as fh:
            json.dump({"world_size": group.world_size, "images": images, "seconds": seconds}, fh)
    group.shutdown()


def measure(backend, nproc, iterations, port):
    out = tempfile.mkdtemp(prefix="bench_dist_")
    env = dict(os.environ, REID_BACKEND=backend)
    command = [PYTHONS[backend], os.path.abspath(__file__), "--worker", out, "--iterations", str(iterations)]
    if nproc > 1:
        code = ("import sys; sys.path.insert(0, %r); from reid.engine.distributed import launch; "
                "sys.exit(launch(%r, %r, %r, %d, master_port=%d))"
                % (ROOT, os.path.abspath(__file__), command[2:], backend, nproc, port))
        command = [PYTHONS[backend], "-c", code]
    subprocess.run(command, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "bench.json")) as fh:
        result = json.load(fh)
    return result["images"] / result["seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--iterations", type=int, default=7)
    p.add_argument("--backends", default="mindspore,torch")
    p.add_argument("--max-restarts", type=int, default=0, help=argparse.SUPPRESS)  # appended by the launcher
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.iterations)
    from reid.engine.distributed import DEFAULT_PORT
    rows = []
    for backend in args.backends.split(","):
        single = measure(backend, 1, args.iterations, DEFAULT_PORT)
        double = measure(backend, 2, args.iterations, DEFAULT_PORT + 1)
        rows.append((backend, single, double))
    print("data-parallel training, demo size, %d timed iterations, %d CPU cores (load average %.1f)"
          % (args.iterations - 1, os.cpu_count() or 0, os.getloadavg()[0]))
    print("%-10s %14s %14s %8s" % ("backend", "1 proc img/s", "2 procs img/s", "ratio"))
    for backend, single, double in rows:
        print("%-10s %14.1f %14.1f %8.2f" % (backend, single, double, double / single))


if __name__ == "__main__":
    main()
