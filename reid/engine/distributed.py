"""`train.py --nproc N`: data-parallel training on the active backend's own launcher (docs/architecture.md#distributed).

- torch: `python -m torch.distributed.run` (torchrun) starts the N ranks; `compat.distributed` joins them with
  gloo (CPU) from torchrun's variables. torchrun stops the other ranks when one fails.
- MindSpore: this module starts N workers (MS_ROLE=MS_WORKER) and one scheduler process (MS_ROLE=MS_SCHED, on
  node 0) with MS_WORKER_NUM, MS_SCHED_HOST, MS_SCHED_PORT, which is what MindSpore's own `msrun` (MindSpore
  >= 2.3) does. The workers import everything first and wait; the scheduler starts when all are ready, and
  they join once it listens (workers that join long after the scheduler started often failed to form the
  cluster on a busy machine). It watches them and, when one fails, stops the others
  (SIGTERM, then SIGKILL after STOP_GRACE_S) and the scheduler: a run with a dead rank ends within seconds
  instead of waiting in a collective.

Every rank runs train.py with the same arguments (`REID_LAUNCHED=1` tells it that it is a rank, and
`--max-restarts 0`: a failed data-parallel run is continued with --resume by hand). Rank 0 alone writes
checkpoints, atomically, so a killed run leaves the last complete checkpoint in place.

Several machines: the same command on each, with `--nnodes M --node-rank R --master-addr HOST_OF_NODE_0`
(`--master-port` the same everywhere); node 0 runs torch's rendezvous store or MindSpore's scheduler there.
OUTPUT_DIR must be on a file system every node reads (a resumed rank loads rank 0's checkpoint).
This module imports no framework: the launching process stays small.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from reid.errors import UserError

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 29500
STOP_GRACE_S = 10          # SIGTERM -> SIGKILL for ranks that do not stop
SCHEDULER_START_S = 300    # longest wait for MindSpore's scheduler to listen (it imports MindSpore first)
POLL_S = 0.5
CLUSTER_ATTEMPTS = 3       # MindSpore: tries to form the cluster (a busy machine can make one fail)
CLUSTER_PAUSE_S = 15       # before try n + 1, n times this: a burst of load elsewhere can pass meanwhile
# MindSpore 2.7's scheduler exits (status 0) by itself once its workers are done, MindSpore 2.0's stays until
# the launcher lets it go: a scheduler that ended with status 0 waits this long for the workers to end too
SCHEDULER_DONE_S = 60
EXIT_CLUSTER_FORMATION = 75  # = compat.distributed.EXIT_CLUSTER_FORMATION (not imported: no framework here)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_command(script, python=None):
    """The command that runs `script` again: a .py file (a checkout's train.py), or a module run with -m (an
    installed package's console command, e.g. reid.cli.train)."""
    python = python or sys.executable
    if script.endswith(".py"):
        return [python, os.path.abspath(script)]
    return [python, "-m", script]


def local_splits(num_splits, world_size):
    """How many MODEL.NUM_SPLITS chunks each of `world_size` ranks emulates: MODEL.NUM_SPLITS counts the
    DataParallel devices of the whole run (1: one device per rank)."""
    num_splits, world_size = int(num_splits), int(world_size)
    if world_size <= 1 or num_splits <= 1:
        return max(num_splits, 1)
    if num_splits % world_size:
        raise UserError("MODEL.NUM_SPLITS %d (DataParallel devices of the whole run) is not a multiple of the %d "
                        "processes; set it to 1 (one device per process) or a multiple of %d"
                        % (num_splits, world_size, world_size))
    return num_splits // world_size


def launched_rank():
    """True in a process started by `launch` (or by torchrun / MindSpore's variables directly)."""
    return bool(os.environ.get("REID_LAUNCHED") or os.environ.get("MS_ROLE") or os.environ.get("TORCHELASTIC_RUN_ID"))


LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port")


def rank_argv(argv):
    """`argv` without the launch flags (a rank needs none of them, and torchrun would take `--nproc` for an
    abbreviation of its own `--nproc-per-node`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in LAUNCH_FLAGS)):
            out.append(arg)
    return out


def check_port_free(addr, port):
    """Fail with a one-line error when addr:port cannot be bound (another run, or another program, has it)."""
    if not 0 < int(port) < 65536:
        raise UserError("--master-port must be in 1..65535, got %d" % port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((addr, int(port)))
    except OSError as exc:
        raise UserError("cannot use %s:%d for the distributed run (%s); pass another --master-port"
                        % (addr, port, exc.strerror or exc)) from None
    finally:
        sock.close()


def _listening(addr, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((addr, int(port))) == 0


def _threads_per_rank(nproc):
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(int(nproc), 1))


def rank_env(nproc, addr):
    """Variables every rank gets: marks it launched, shares the cores out, keeps gloo on the loopback device
    for a local run."""
    env = dict(os.environ, REID_LAUNCHED="1")
    threads = str(_threads_per_rank(nproc))
    env.setdefault("REID_NUM_THREADS", threads)  # MindSpore's kernel pool (compat.jit.set_threads)
    if addr.startswith("127.") or addr == "localhost":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _describe(rc):
    if rc is not None and rc < 0:
        try:
            return "was killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "was killed by signal %d" % -rc
    return "exited with status %s" % rc


def launch(script, argv, backend, nproc, nnodes=1, node_rank=0, master_addr=DEFAULT_ADDR, master_port=DEFAULT_PORT,
           output_dir=None, log=None, rank_args=("--max-restarts", "0"), what="training"):
    """Run `script argv` as nproc local ranks of an nnodes x nproc data-parallel run on `backend`'s launcher;
    returns the exit status (0 when every local rank succeeded). `rank_args` go after every rank's arguments
    (train.py's: no supervisor in a rank); `what` names the run in the failure message (None: no message, the
    caller says what failed: tools/index.py --nproc)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    nproc, nnodes, node_rank = int(nproc), int(nnodes), int(node_rank)
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UserError("--nproc and --nnodes must be >= 1 and --node-rank in 0..nnodes-1 (got %d, %d, %d)"
                        % (nproc, nnodes, node_rank))
    if node_rank == 0:
        check_port_free(master_addr, master_port)
    command = python_command(script) + rank_argv(argv) + list(rank_args)
    env = rank_env(nproc, master_addr)
    if backend == "torch":
        env.setdefault("OMP_NUM_THREADS", env["REID_NUM_THREADS"])   # torch's intra-op pool
        rc = _launch_torch(command, env, nproc, nnodes, node_rank, master_addr, master_port)
    else:
        rc = _launch_mindspore(command, env, nproc, nnodes, node_rank, master_addr, master_port, log)
    if rc != 0 and what:
        where = ""
        if output_dir and os.path.exists(os.path.join(output_dir, "last_checkpoint")):
            where = "; continue from the last checkpoint with --resume"
        log("distributed %s failed (status %d, the failing rank's error is above); every rank was stopped%s"
            % (what, rc, where))
    return rc


def _launch_torch(command, env, nproc, nnodes, node_rank, addr, port):
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", str(nnodes),
           "--node-rank", str(node_rank), "--master-addr", addr, "--master-port", str(port),
           "--monitor-interval", "1", "--max-restarts", "0"] + command[1:]
    child = subprocess.Popen(run, env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        return child.wait()


def _last_line(fh):
    fh.seek(0)
    lines = [line.strip() for line in fh.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _stop(procs, grace=STOP_GRACE_S):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _launch_mindspore(command, env, nproc, nnodes, node_rank, addr, port, log):
    """Scheduler + workers; when the cluster cannot be formed (a rank exits with EXIT_CLUSTER_FORMATION before
    training) everything is stopped and started again, at most CLUSTER_ATTEMPTS times on one machine."""
    attempts = CLUSTER_ATTEMPTS if nnodes == 1 else 1
    for attempt in range(1, attempts + 1):
        rc = _launch_mindspore_once(command, env, nproc, nnodes, node_rank, addr, port, log)
        if rc != EXIT_CLUSTER_FORMATION or attempt == attempts:
            return rc
        log("MindSpore could not form the cluster (attempt %d of %d); starting it again in %d s"
            % (attempt, attempts, CLUSTER_PAUSE_S * attempt))
        time.sleep(CLUSTER_PAUSE_S * attempt)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the old scheduler's port must be free again
            try:
                check_port_free(addr, port)
                break
            except UserError:
                time.sleep(1)
    return rc


def _start_scheduler(env, addr, port, workers, log):
    """MindSpore's scheduler, once it listens on addr:port (None, after a message, when it cannot)."""
    # it stays alive until its stdin closes (compat.distributed.run_scheduler): after the workers are done.
    # REID_MS_SCHEDULER_LOG=path keeps its output (else only its last line appears, on a failure)
    log_path = os.environ.get("REID_MS_SCHEDULER_LOG")
    output = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()
    scheduler = subprocess.Popen([sys.executable, "-c", "import compat.distributed as d; d.run_scheduler()"],
                                 env=dict(env, MS_ROLE="MS_SCHED"), stdin=subprocess.PIPE, stdout=output,
                                 stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + SCHEDULER_START_S
    while not _listening(addr, port):
        if scheduler.poll() is not None:
            log("MindSpore's scheduler %s before listening on %s:%d: %s" % (
                _describe(scheduler.returncode), addr, port, _last_line(output)))
            return scheduler, False
        if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
            log("MindSpore's scheduler did not listen on %s:%d within %d s" % (addr, port, SCHEDULER_START_S))
            return scheduler, False
        time.sleep(POLL_S)
    return scheduler, True


def _workers_end(workers, within):
    """Whether every worker process ends within `within` seconds (whatever its status)."""
    deadline = time.monotonic() + within
    while any(w.poll() is None for w in workers):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def _launch_mindspore_once(command, env, nproc, nnodes, node_rank, addr, port, log):
    """Workers first; once all of them are ready to join (compat.distributed._wait_for_local_ranks), the
    scheduler (node 0), then the go: they register right after the scheduler started."""
    ready = tempfile.TemporaryDirectory(prefix="reid_ready_")
    env = dict(env, MS_WORKER_NUM=str(nproc * nnodes), MS_SCHED_HOST=addr, MS_SCHED_PORT=str(port),
               REID_READY_DIR=ready.name)
    env.setdefault("GLOG_v", "3")  # MindSpore's cluster-building warnings (retries while the ranks start): errors only
    scheduler = None
    workers = []
    stopping = []
    previous = {s: signal.signal(s, lambda signum, frame: stopping.append(signum))
                for s in (signal.SIGTERM, signal.SIGHUP)}
    go = False
    try:
        for local in range(nproc):
            workers.append(subprocess.Popen(command, env=dict(env, MS_ROLE="MS_WORKER", REID_LOCAL_RANK=str(local))))
        while True:
            if stopping:
                _stop(workers)
                return 128 + stopping[0]
            codes = [w.poll() for w in workers]
            failed = [(i, rc) for i, rc in enumerate(codes) if rc not in (None, 0)]
            if failed:
                local, rc = failed[0]
                _stop(workers)
                if rc == EXIT_CLUSTER_FORMATION:
                    return rc
                log("local rank %d %s; stopping the other ranks" % (local, _describe(rc)))
                return rc if rc > 0 else 128 - rc
            if all(rc == 0 for rc in codes):
                return 0
            if not go and sum(name.startswith("rank") for name in os.listdir(ready.name)) == nproc:
                if node_rank == 0:
                    scheduler, listening = _start_scheduler(env, addr, port, workers, log)
                    if not listening:
                        _stop(workers)
                        return 1
                open(os.path.join(ready.name, "go"), "w").close()
                go = True
            if scheduler is not None and scheduler.poll() is not None:
                if scheduler.returncode == 0 and _workers_end(workers, SCHEDULER_DONE_S):
                    continue  # MindSpore 2.7's scheduler leaves once the workers are done: theirs is the status
                log("MindSpore's scheduler %s; stopping the ranks" % _describe(scheduler.returncode))
                _stop(workers)
                return 1
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop(workers)
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if scheduler is not None:
            try:
                scheduler.stdin.close()
            except OSError:
                pass
            _stop([scheduler], grace=30)
        ready.cleanup()
