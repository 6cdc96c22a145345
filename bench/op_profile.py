"""Where an op-by-op training step's time goes, by layer and by op, on each MindSpore stack side by side (torch
for reference): op-by-op basic steps (MODEL.JIT False) of the demo network through the real Trainer, each stack
in a fresh process of its environment, one after the other.

    python bench/op_profile.py [--stacks ms27] [--steps 4] [--top 12]

Per stack: the seconds per step without a profiler (median of --steps), then the same steps under cProfile, each
function's own time given to the layer its file belongs to:

  reid            the network, losses, trainer (ours)
  compat          the adaptation layer (ours)
  torch-API layer mindtorch's Python (argument handling, its Tensor wrapping)
  MindSpore       MindSpore's Python (op wrappers, executor calls, tensor classes) and the native work its
                  executor objects do when called (cProfile sees no separate entry for those: op dispatch, the
                  backward pass of the differentiated call, kernels launched synchronously)
  native calls    C functions called from Python with an entry of their own: MindSpore 2.6's generated op
                  functions (pyboost), attribute writes on tensors, numpy
  other           the standard library, the data pipeline

A kernel's time shows wherever the first call that needs its result waits: in an op launch, or on MindSpore 2.6
in the torch-API layer setting a flag on the op's output (mindtorch's `Tensor.__init__`, a "native call"). So the
split says where the stacks differ, not what each kernel costs (bench/kernels.py --op-by-op). cProfile's own
overhead (~1 us per Python call) inflates the Python layers; the plain seconds are the step time.

Per op: the torch-API functions that reid/ and compat/ call (the layer boundary), with calls per step and
milliseconds per step including everything below them (dispatch and kernels), the --top of each stack.

--compiled profiles compiled steps (MODEL.JIT True, the default) by kernel instead: after the warm-up of
bench/train_step.py (every graph built), --steps basic steps and --steps meta steps per stack under its own
profiler (MindSpore's Profiler, whose CPU op timing records every kernel a graph launches with its scope:
`Gradients/...` is the backward; torch.profiler for torch), and prints per step kind the wall seconds per step,
the kernels' own time per step, and per op type: calls per step, milliseconds per step in the forward and the
backward, and its share of the kernels' time, the --top types of each stack side by side (torch's aten ops
are other names: its top list follows). Kernels on MindSpore's side-by-side threads overlap, so the kernel
sum can exceed the wall time; for MindSpore a line gives the time with at least one kernel running (the union
of the kernels' intervals).

    python bench/op_profile.py --compiled --sizes full --stacks ms27 [--steps 1] [--top 25]
"""
import cProfile
import json
import os
import pstats
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, run_isolated, size_args, stack_variants  # noqa: E402
from bench.train_step import COMMON, SIZES  # noqa: E402

LAYERS = ("reid", "compat", "torch-API layer", "MindSpore", "native calls", "other")


def _layer(filename):
    path = filename.replace("\\", "/")
    if path.startswith("~") or path.startswith("<built-in") or path.startswith("{"):
        return "native calls"
    if "/site-packages/mindtorch/" in path:
        return "torch-API layer"
    if "/site-packages/mindspore/" in path:
        return "MindSpore"
    if "/site-packages/torch/" in path:
        return "torch-API layer"
    if path.startswith(os.path.join(ROOT, "reid")):
        return "reid"
    if path.startswith(os.path.join(ROOT, "compat")):
        return "compat"
    return "other"


def _is_layer_api(filename):
    return _layer(filename) == "torch-API layer"


def measure(overrides, root, steps):
    import compat
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", "False"])
    trainer = Trainer(cfg, quiet=True)
    trainer.iter = 1
    for _ in range(2):  # the first steps build MindSpore's backward-graph cache
        trainer.basic_step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.basic_step()
        times.append(time.perf_counter() - start)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(steps):
        trainer.basic_step()
    profile.disable()
    profiled = (time.perf_counter() - start) / steps
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, callers)}
    layers = dict.fromkeys(LAYERS, 0.0)
    for (filename, _, _), (_, _, own, _, _) in stats.items():
        layers[_layer(filename)] += own / steps
    ops = {}
    for (filename, line, name), (calls, _, _, _, callers) in stats.items():
        if not _is_layer_api(filename) or name == "__call__":  # (a module's call holds the modules it calls)
            continue
        # calls and time from our code only: what the network and compat ask of the layer
        from_ours = [(c, cum) for (cf, _, _), (c, _, _, cum) in callers.items() if _layer(cf) in ("reid", "compat")]
        if from_ours:
            key = "%s (%s)" % (name, os.path.basename(filename))
            ops[key] = (sum(c for c, _ in from_ours) / steps, 1000.0 * sum(cum for _, cum in from_ours) / steps)
    times.sort()
    return {"step_s": times[len(times) // 2], "profiled_step_s": profiled, "layers": layers, "ops": ops,
            "layer": layer_name(), "backend": compat.BACKEND}



def _ms_kernels(folder):
    """[(full op name, op type, start ns, milliseconds)] from MindSpore's raw CPU op timing under `folder`
    (`cpu_op_execute_timestamp_*.txt`: one line per op, `name;type;start_ns,ms,thread start_ns,ms,thread ...`)."""
    import glob
    rows = []
    for path in glob.glob(os.path.join(folder, "**", "cpu_op_execute_timestamp_*.txt"), recursive=True):
        with open(path) as fh:
            for line in fh:
                parts = line.strip().split(";")
                if len(parts) < 3:
                    continue
                kind = re.sub(r"-op\d+$", "", parts[0].rsplit("/", 1)[-1])  # MindSpore 2.7's type is HostCpuOps
                for entry in parts[2].split():
                    start, ms = entry.split(",")[:2]
                    rows.append((parts[0], kind, int(start), float(ms)))
    return rows


def _busy_ms(intervals):
    """Milliseconds during which at least one of the (start ns, ms) kernels ran: their union. Below the sum
    of their times where the runtime ran kernels side by side."""
    busy, end = 0.0, None
    for start, ms in sorted(intervals):
        stop = start + ms * 1e6
        if end is None or start >= end:
            busy += ms
            end = stop
        elif stop > end:
            busy += (stop - end) / 1e6
            end = stop
    return busy


def _op_table(kernels, steps):
    """{op type: [calls, forward ms, backward ms]} per step from (type, is backward, ms) triples."""
    table = {}
    for kind, backward, ms in kernels:
        row = table.setdefault(kind, [0.0, 0.0, 0.0])
        row[0] += 1.0 / steps
        row[2 if backward else 1] += ms / steps
    return table


def _scope_table(kernels, steps, top=200):
    """{kernel name without its op number: [calls, ms]} per step from (full name, type, ms) triples, the `top`
    costliest: where in the network (the graph's scope) the time of each op type goes."""
    table = {}
    for name, _, ms in kernels:
        row = table.setdefault(re.sub(r"-op\d+", "", name), [0.0, 0.0])
        row[0] += 1.0 / steps
        row[1] += ms / steps
    return dict(sorted(table.items(), key=lambda kv: -kv[1][1])[:top])


def _torch_kernels(prof):
    """(aten op, in the backward, own ms) for each leaf-most op event of a torch.profiler run: an op's own time
    (its children's subtracted), the backward being whatever runs under autograd's engine."""
    out = []
    for event in prof.events():
        if not event.name.startswith("aten::") and not event.name.startswith("mkldnn"):
            continue
        parent, backward = event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("autograd::engine::evaluate_function"):
                backward = True
                break
            parent = parent.cpu_parent
        out.append((event.name, backward, event.self_cpu_time_total / 1000.0))
    return out


def profile_compiled(overrides, root, steps):
    """Compiled basic and meta steps under the backend's profiler after bench/train_step.py's warm-up: per step
    kind, wall seconds per step, kernel ms per step and the per-op-type table (_op_table)."""
    import compat
    from bench.train_step import warm_up
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", "True", "MODEL.JIT_SHARED_GRAPH", "True"])
    compat.jit.set_helper_thread(cfg.MODEL.JIT_HELPER_THREAD)
    trainer = Trainer(cfg, quiet=True)
    trainer.iter = 1
    if compat.BACKEND != "torch":  # every graph built before the profiler starts (torch builds none)
        warm_up(trainer)
    calls = {"basic": trainer.basic_step, "meta": trainer.meta_step}
    result = {"layer": layer_name(), "backend": compat.BACKEND}
    if compat.BACKEND == "torch":
        import torch
        for kind, call in calls.items():
            call()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                for _ in range(steps):
                    call()
                wall = (time.perf_counter() - start) / steps
            kernels = _torch_kernels(prof)
            result[kind] = {"wall_s": wall, "kernel_ms": sum(k[2] for k in kernels) / steps,
                            "ops": _op_table(kernels, steps)}
        return result
    # one profiler per process (MindSpore keeps its state): both step kinds in it, told apart by the kernels'
    # start times
    from mindspore import Profiler
    folder = tempfile.mkdtemp(prefix="ms-prof-", dir=root)
    prof = Profiler(output_path=folder, start_profile=False)
    windows = {}
    for kind, call in calls.items():
        call()
        if not windows:
            prof.start()
        begin, begin_mono = time.time_ns(), time.monotonic_ns()
        start = time.perf_counter()
        for _ in range(steps):
            call()
        windows[kind] = (begin, time.time_ns(), begin_mono, time.monotonic_ns(), (time.perf_counter() - start) / steps)
    # a CPU profiler without a dataset profiler: stop() would stop one it never made
    if getattr(prof, "_md_profiler", True) is None:
        prof._data_process = False
    prof.stop()
    if not _ms_kernels(folder):  # no raw timing written by stop(): analyse() writes it
        import mindspore
        mode = mindspore.get_context("mode")
        # its CPU analysis refuses PyNative mode (where the graphs ran, as jit)
        mindspore.set_context(mode=mindspore.GRAPH_MODE)
        prof.analyse()
        mindspore.set_context(mode=mode)
    rows = _ms_kernels(folder)
    # MindSpore 2.7 stamps kernels with the wall clock (ns since the epoch), older releases with the monotonic clock
    epoch = bool(rows) and min(t for _, _, t, _ in rows) > 10 ** 18
    for kind, (begin, end, begin_mono, end_mono, wall) in windows.items():
        if not epoch:
            begin, end = begin_mono, end_mono
        window = [row for row in rows if begin <= row[2] <= end]
        inside = [(name, kind_, ms) for name, kind_, _, ms in window]
        kernels = [(kind_, name.startswith("Gradients/"), ms) for name, kind_, ms in inside]
        busy = _busy_ms([(t, ms) for _, _, t, ms in window])
        result[kind] = {"wall_s": wall, "kernel_ms": sum(k[2] for k in kernels) / steps, "busy_ms": busy / steps,
                        "ops": _op_table(kernels, steps), "scopes": _scope_table(inside, steps)}
    return result


def _print_compiled(size, got, top):
    labels = list(got)
    print("%s compiled steps by kernel: %s" % (size, "; ".join("%s = %s" % (k, got[k]["layer"]) for k in labels)))
    for kind in ("basic", "meta"):
        print("  %s step: wall s per step %s; kernels' own ms per step %s" % (
            kind, ", ".join("%s %.2f" % (k, got[k][kind]["wall_s"]) for k in labels),
            ", ".join("%s %.0f" % (k, got[k][kind]["kernel_ms"]) for k in labels)))
        busy = [k for k in labels if "busy_ms" in got[k][kind]]
        if busy:  # MindSpore: kernels side by side overlap, so their sum exceeds the time any kernel ran
            print("  %s step: ms per step with a kernel running %s" % (
                kind, ", ".join("%s %.0f" % (k, got[k][kind]["busy_ms"]) for k in busy)))
        ms_labels = [k for k in labels if got[k]["backend"] == "mindspore"]
        types = {}
        for k in ms_labels:
            for name, (_, fwd, bwd) in got[k][kind]["ops"].items():
                types[name] = max(types.get(name, 0.0), fwd + bwd)
        ranked = sorted(types, key=lambda n: -types[n])[:top]
        head = "".join("%38s" % ("%s: calls fwd/bwd ms (share)" % k)[-38:] for k in ms_labels)
        print("    %-28s%s" % ("op type", head))
        for name in ranked:
            cells = ""
            for k in ms_labels:
                calls, fwd, bwd = got[k][kind]["ops"].get(name, (0.0, 0.0, 0.0))
                share = 100.0 * (fwd + bwd) / max(got[k][kind]["kernel_ms"], 1e-9)
                cells += "%38s" % ("%4.0f %7.1f /%7.1f (%4.1f%%)" % (calls, fwd, bwd, share))
            print("    %-28s%s" % (name[:28], cells))
        for k in labels:
            if got[k]["backend"] != "torch":
                continue
            ops = got[k][kind]["ops"]
            print("    %s: top aten ops, calls fwd/bwd own ms (share)" % k)
            for name in sorted(ops, key=lambda n: -(ops[n][1] + ops[n][2]))[:top]:
                calls, fwd, bwd = ops[name]
                print("    %-38s %4.0f %7.1f /%7.1f (%4.1f%%)" % (
                    name[:38], calls, fwd, bwd, 100.0 * (fwd + bwd) / max(got[k][kind]["kernel_ms"], 1e-9)))
    sys.stdout.flush()

def main():
    def extra(parser):
        parser.add_argument("--steps", type=int, default=4, help="basic steps timed, then profiled (default 4)")
        parser.add_argument("--top", type=int, default=12, help="ops listed per stack (default 12)")
        parser.add_argument("--compiled", action="store_true", help="profile compiled basic and meta steps by "
                            "kernel (MindSpore's profiler, torch.profiler) instead of op-by-op steps by layer")
        parser.add_argument("--json", default="", help="with --compiled: also write each stack's tables to this "
                            "JSON file as they arrive")
    args = size_args(__doc__, SIZES, default="demo", extra=extra)
    from reid.data.synthetic import ensure_synthetic
    variants = stack_variants(args.stacks or "ms27")
    with tempfile.TemporaryDirectory(prefix="bench-op-profile-") as root:
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        for size in args.sizes.split(","):
            if args.compiled:
                got = {}
                for label, v in variants.items():
                    try:
                        got[label] = run_isolated(v[0], "bench.op_profile:profile_compiled",
                                                  {"overrides": SIZES[size], "root": root, "steps": args.steps},
                                                  python=v[2])
                    except RuntimeError as exc:  # one stack's profiler failing leaves the others' tables
                        print("%s: %s" % (label, str(exc).splitlines()[-1]), file=sys.stderr)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump({"size": size, "results": got}, f)
                _print_compiled(size, got, args.top)
                continue
            got = {label: run_isolated(v[0], "bench.op_profile:measure",
                                       {"overrides": SIZES[size], "root": root, "steps": args.steps}, python=v[2])
                   for label, v in variants.items()}
            labels = list(got)
            print("%s op-by-op basic step: %s" % (size, "; ".join("%s = %s" % (k, got[k]["layer"]) for k in labels)))
            print("  %-22s %s" % ("", "".join("%22s" % k for k in labels)))
            print("  %-22s %s" % ("seconds per step", "".join("%22.3f" % got[k]["step_s"] for k in labels)))
            print("  %-22s %s" % ("profiled, s per step", "".join("%22.3f" % got[k]["profiled_step_s"]
                                                                  for k in labels)))
            for layer in LAYERS:
                print("  %-22s %s" % (layer, "".join(
                    "%13.0f ms %5.1f%%" % (1000 * got[k]["layers"][layer],
                                           100 * got[k]["layers"][layer] / max(sum(got[k]["layers"].values()), 1e-9))
                    for k in labels)))
            for k in labels:
                if got[k]["backend"] != "mindspore":
                    continue
                print("  %s: the torch-API layer's functions as reid/ and compat/ call them (per step)" % k)
                top = sorted(got[k]["ops"].items(), key=lambda kv: -kv[1][1])[:args.top]
                for name, (calls, ms) in top:
                    print("    %-58s %6.0f calls %8.1f ms" % (name[:58], calls, ms))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
