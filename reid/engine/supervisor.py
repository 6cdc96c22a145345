"""`train.py --max-restarts N`: training runs in a child process; when that process is killed by a signal
that means a crash (a segfault in the framework's native code, an abort, SIGKILL from the out-of-memory
killer), the child is started again with --resume and continues from the last checkpoint. Resume restores
everything a step depends on (weights, both optimizers, sampler positions, RNG, the evaluator's last and
best results), so the restarted run ends where an uninterrupted one would.

Not restarted: a normal exit (including errors, which are deterministic and would only repeat), and an
interruption the user asked for (SIGINT, SIGTERM, SIGHUP; those sent to this process are passed on to the
child). This module imports no framework: the supervising process stays small.
"""
import os
import signal
import subprocess
import sys

CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL, signal.SIGKILL}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POINTER = "last_checkpoint"


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


def _pointer_state(output_dir):
    """What last_checkpoint says now (content and modification time), or None without one."""
    path = os.path.join(output_dir, POINTER)
    try:
        with open(path) as fh:
            return fh.read(), os.stat(path).st_mtime_ns
    except OSError:
        return None


def supervise(command, output_dir, max_restarts, resume=False, log=None):
    """Run `command` (a child training process taking --resume) until it ends by itself; restart it after a
    crash, at most `max_restarts` times. Returns the exit status for this process (128 + signal number when
    the child died from a signal)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    # A run started without --resume may only resume from checkpoints it wrote itself, never from an
    # earlier run's that happens to be in the same OUTPUT_DIR.
    initial_pointer = None if resume else _pointer_state(output_dir)
    stopping = []
    child = None

    def on_stop(signum, frame):
        stopping.append(signum)
        # Ctrl-C reaches the child from the terminal already (same process group); pass the others on.
        if child is not None and signum != signal.SIGINT:
            child.send_signal(signum)

    previous = {s: signal.signal(s, on_stop) for s in STOP_SIGNALS}
    try:
        restarts = 0
        while True:
            child = subprocess.Popen(command + (["--resume"] if resume else []))
            rc = child.wait()
            if rc >= 0:
                return rc
            signum = -rc
            if stopping or signum not in CRASH_SIGNALS:
                return 128 + signum
            if restarts >= max_restarts:
                log("training process killed by %s; not restarted (--max-restarts %d used up)"
                    % (signal_name(signum), max_restarts))
                return 128 + signum
            restarts += 1
            pointer = _pointer_state(output_dir)
            resume = resume or (pointer is not None and pointer != initial_pointer)
            where = "from the start (no checkpoint yet)"
            if resume:
                with open(os.path.join(output_dir, POINTER)) as fh:
                    where = "from " + os.path.join(output_dir, fh.read().strip())
            log("training process killed by %s; restarting %s (restart %d of %d)"
                % (signal_name(signum), where, restarts, max_restarts))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

