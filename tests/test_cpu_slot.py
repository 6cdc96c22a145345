"""tests/cpu_slot.py, which `make test` runs each suite through: blocks of CPUs, one command per block, the
command's exit status, and unpinned where there are too few CPUs."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cpu_slot import claim, cpu_blocks

HELPER = str(Path(__file__).with_name("cpu_slot.py"))
PRINT_CPUS = "import os; print(sorted(os.sched_getaffinity(0)))"


def test_cpu_blocks_cut_the_cpus_into_contiguous_blocks():
    assert cpu_blocks({0, 1}, 2) == [[0], [1]]
    assert cpu_blocks({3, 1, 2, 0}, 2) == [[0, 1], [2, 3]]
    assert cpu_blocks(range(5), 2) == [[0, 1], [2, 3, 4]]  # the last block takes the remainder
    assert cpu_blocks({4, 6, 9}, 3) == [[4], [6], [9]]  # the ids a restricted affinity leaves
    assert cpu_blocks({0}, 2) == [] and cpu_blocks({0, 1}, 1) == []  # too few CPUs, or one slot: unpinned


def test_a_taken_block_is_not_claimed_again_until_it_is_released(tmp_path):
    blocks = [[0], [1]]
    first, lock_a = claim(blocks, str(tmp_path))
    second, lock_b = claim(blocks, str(tmp_path))
    assert (first, second) == (0, 1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(claim(blocks, str(tmp_path), poll=0.05)))
    waiter.start()
    time.sleep(0.3)
    assert got == []  # both blocks held: it waits
    lock_b.close()
    waiter.join(5)
    assert [index for index, _ in got] == [1]
    lock_a.close()
    got[0][1].close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin a command to one of them")
def test_the_command_runs_on_its_block_and_returns_its_exit_status(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    blocks = cpu_blocks(allowed, 2)
    run = [sys.executable, HELPER, "--slots", "2", "--lock-dir", str(tmp_path), "--"]
    proc = subprocess.run(run + [sys.executable, "-c", PRINT_CPUS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(blocks[0])
    # the first block held by another holder: the command gets the second
    index, lock = claim(blocks, str(tmp_path))
    proc = subprocess.run(run + [sys.executable, "-c", PRINT_CPUS], capture_output=True, text=True, timeout=60)
    lock.close()
    assert (index, proc.stdout.splitlines()[-1]) == (0, str(blocks[1]))
    proc = subprocess.run(run + [sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, timeout=60)
    assert proc.returncode == 3
    # more slots than CPUs: unpinned
    proc = subprocess.run([sys.executable, HELPER, "--slots", str(len(allowed) + 1), "--lock-dir", str(tmp_path),
                           "--", sys.executable, "-c", PRINT_CPUS], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[-1] == str(allowed)


def test_no_command_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, HELPER, "--slots", "2", "--lock-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "no command given: tests/cpu_slot.py --slots N -- COMMAND [ARG ...]")
