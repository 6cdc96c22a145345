#!/usr/bin/env python3
"""Run a command on a block of CPUs that no other command started this way is using.

    python tests/cpu_slot.py --slots 2 [--lock-dir DIR] -- COMMAND [ARG ...]

The CPUs this process may use are cut into `--slots` blocks; the command runs on the first free block (a lock
file per block in DIR, held while it runs; it waits while all are taken), and its child processes inherit
the block. Exit status: the command's. With fewer CPUs than slots, or one slot, it runs unpinned.

Why `make test` runs its suites so: MindSpore 2.7 hands the parallel part of each CPU kernel to its pool
threads and waits for them spinning (sched_yield), so a MindSpore process whose threads share the cores with
another busy process loses most of its time to scheduling; on cores of its own it does not
(docs/testing.md#how-long-it-takes).
"""
import argparse
import fcntl
import os
import subprocess
import sys
import time


def cpu_blocks(cpus, slots):
    """`slots` contiguous blocks of the sorted CPU ids (the last takes the remainder); [] if too few CPUs."""
    cpus = sorted(cpus)
    if slots < 2 or len(cpus) < slots:
        return []
    size = len(cpus) // slots
    return [cpus[i * size:(i + 1) * size if i < slots - 1 else len(cpus)] for i in range(slots)]


def claim(blocks, lock_dir, poll=0.5):
    """Wait for a free block; returns (its index, the open lock file that holds it)."""
    os.makedirs(lock_dir, exist_ok=True)
    while True:
        for i in range(len(blocks)):
            fh = open(os.path.join(lock_dir, "cpus-%d.lock" % i), "w")  # not inherited by the command
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return i, fh
            except BlockingIOError:
                fh.close()
        time.sleep(poll)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, required=True, help="blocks to cut the CPUs into")
    parser.add_argument("--lock-dir", default=".pytest_cache/cpu-slots", help="where the blocks' lock files live")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: tests/cpu_slot.py --slots N -- COMMAND [ARG ...]")
    blocks = cpu_blocks(os.sched_getaffinity(0), args.slots)
    if not blocks:
        return subprocess.call(command)
    index, lock = claim(blocks, args.lock_dir)
    with lock:
        os.sched_setaffinity(0, blocks[index])
        print("cpu_slot: CPUs %s for: %s" % (",".join(map(str, blocks[index])), " ".join(command)[:120]),
              flush=True)
        child = subprocess.Popen(command)
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the command too (same process group); wait for it
                continue


if __name__ == "__main__":
    sys.exit(main())
