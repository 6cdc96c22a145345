"""Seconds per ACL training step, MindSpore op by op, MindSpore compiled (MODEL.JIT) and torch, measured in one
run (one after the other, so they never share the CPU): a basic step (forward + backward + SGD on the combined
batch) and a meta step (meta-train forward/backward, fast weights, meta-test forward/backward at θ', meta SGD),
through the real Trainer.

Sizes: demo (configs/synthetic/acl.yml: BASE_WIDTH 8, DEPTH 26x, 64x32, batch 64, meta batches 2x32 + 32,
NUM_SPLITS 1), full (DEPTH 50x, BASE_WIDTH 64, 256x128, batch 16, meta batches 2x8 + 8, NUM_SPLITS 1) and full-b8
(the same at half the batch: 8, meta batches 2x4 + 4); demo-s4 and full-b8-s2 are demo and full-b8 with
MODEL.NUM_SPLITS 4 and 2, where --batch-forwards adds each backend's MODEL.CHUNK_FORWARDS False run (one forward
over the batch with per-chunk BN statistics instead of one forward per chunk). The default is demo,full-b8: on CPU
a full-size batch-16 step of the MindSpore backend op by op needs more than 24 GB of memory (the kernel's OOM
killer stopped it at 24 GB resident on our 24 GiB machines; compiled, the whole batch-16 run peaks at ~6 GB:
`--sizes full --variants mindspore-compiled,torch`). Data: a small synthetic set (augmentation off, loader in the
main process; reading and resizing the images is part of each step, about 1% of it). Class counts come from that
data, so the full-size head is smaller than Protocol-2's. Before timing, each side runs a basic step and meta
steps until every source domain has been the meta-test domain once, so that no step signature builds its
(MindSpore) backward graph or compiled graph inside the timed calls (the warm-up time printed includes the
compiled graphs' build). Each side runs in a fresh process, so the peak resident memory printed is that variant's
own.

    python bench/train_step.py [--sizes demo,full-b8,full] [--repeats 3] [--stacks ms27]
        [--memory-level O1] [--variants mindspore-compiled,torch] [--basic-only] [--max-rss-gb 16]
        [--batch-forwards] [--separate-graphs] [--caller-thread] [--inter-op 1] [--malloc-defaults] [--gpu]
        [--network resnet50_ibn_a] [--meta-parts] [--rounds 3]

--network resnet50_ibn_a / resnet50 times the Baseline meta-architecture on that backbone instead of ACL (basic
steps only: the Baseline has no meta steps), to tell what ACL's CODE blocks add to a step's time and memory.

--gpu adds torch on a CUDA GPU (label torch-gpu; its ratio is against torch on this machine's CPU). On a machine
without MindSpore, e.g. `REID_BACKEND=torch python bench/train_step.py --gpu --variants torch,torch-gpu`.

--malloc-defaults adds, per MindSpore stack, steps op by op and compiled under glibc malloc's own settings
(REID_MALLOC_TUNING=0, labels *-glibc and *-compiled-glibc): what compat/allocator.py's settings change, in one run.

--meta-parts then times --repeats more meta steps per variant part by part (the meta-train step function, the
fast-weight steps, writing θ' into the parameters, the meta-test step function, restoring θ, the meta SGD, the
rest), each part waited for at both ends, and prints a table per size: where two stacks' meta steps differ.

--rounds N runs every variant's process N times, round-robin (the order rotated each round), and reports each
figure as the median over the rounds, plus each variant's step times round by round and, per compiled MindSpore
variant, the median and range of the ratios taken within each round: the host's speed drifts between processes
by more than the stacks differ, and processes run close together share that drift.

For each compiled MindSpore variant a ratios line gives its basic and meta steps against torch eager, and its peak
resident memory against torch's. Each compiled graph's build line is printed (compat.jit: seconds, resident memory it
added, and the process's new peak where the build or first call set one). Besides each variant's peak resident memory
(the whole run's, graph builds included), the peak after its first basic step is printed (compiled: after building
one graph, the basic step's), the resident memory after the warm-up, and the peak of the timed steps alone (the
high-water mark is reset after the warm-up: no graph is built then). A watchdog kills a run whose resident memory
exceeds `--max-rss-gb` (default 16 GB:
the machines this was written on have 24 GiB, shared), reported as "exceeds N GB".
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import (layer_name, median_seconds, reset_peak_rss, run_isolated, size_args,  # noqa: E402
                          stack_variants)
from reid.config import augmentation_off_opts  # noqa: E402

SIZES = {  # depths explicit: acl.yml (loaded below) is at the demo's 26x
    "demo": ["MODEL.BACKBONE.BASE_WIDTH", "8", "MODEL.BACKBONE.DEPTH", "26x", "INPUT.SIZE_TRAIN", "[64,32]",
             "SOLVER.IMS_PER_BATCH", "64", "META.IMS_PER_DOMAIN", "32", "MODEL.NUM_SPLITS", "1"],
    "full": ["MODEL.BACKBONE.BASE_WIDTH", "64", "MODEL.BACKBONE.DEPTH", "50x", "INPUT.SIZE_TRAIN", "[256,128]",
             "SOLVER.IMS_PER_BATCH", "16", "META.IMS_PER_DOMAIN", "8", "MODEL.NUM_SPLITS", "1"],
    "full-b8": ["MODEL.BACKBONE.BASE_WIDTH", "64", "MODEL.BACKBONE.DEPTH", "50x", "INPUT.SIZE_TRAIN", "[256,128]",
                "SOLVER.IMS_PER_BATCH", "8", "META.IMS_PER_DOMAIN", "4", "MODEL.NUM_SPLITS", "1"],
}
NETWORKS = ("acl", "resnet50_ibn_a", "resnet50")  # --network: ACL (acl.yml), else baseline.yml on that backbone
# the original's DataParallel emulation (for --batch-forwards): demo with 4 chunks (16 images each in basic
# steps), full-b8 with 2 (4 images each; its meta-test chunks would hold one identity: use --basic-only)
SIZES["demo-s4"] = SIZES["demo"][:-1] + ["4"]
SIZES["full-b8-s2"] = SIZES["full-b8"][:-1] + ["2"]
COMMON = ["DATASETS.NAMES", "['SynthA','SynthB','SynthC']", "DATASETS.TESTS", "[]", "DATASETS.SYNTHETIC.NUM_IDS",
          "80", "DATALOADER.NUM_WORKERS", "0"] + augmentation_off_opts()


def warm_up(trainer, max_meta_steps=30):
    """One basic step, then meta steps until every source domain has been the meta-test domain once: each
    (step kind, domain signature) builds its own backward-graph cache entry on MindSpore on first use, which
    must not fall into the timed calls. Returns the meta-test domains seen."""
    trainer.basic_step()
    seen = set()
    for _ in range(max_meta_steps):
        trainer.meta_step()
        seen.add(int(trainer.storage.latest()["meta/test_domain"][0]))
        if len(seen) == len(trainer.offsets):
            break
    return sorted(seen)


def measure(overrides, root, repeats, jit=False, memory_level=None, steps=("basic", "meta"), chunk_forwards=True,
            device="cpu", shared_graph=True, helper_thread=True, config="acl.yml", meta_parts=False, inter_op=None):
    """Seconds per step (median of `repeats`) after the warm-up, the warm-up's seconds, and the peak resident
    memory after the first basic step alone (compiled: one graph) as well as at the end (the runner adds it).
    `memory_level`: MindSpore's memory_optimize_level; `steps`: ("basic",) times basic steps only and warms
    up nothing else; `chunk_forwards`: MODEL.CHUNK_FORWARDS (matters with NUM_SPLITS > 1); `shared_graph`:
    MODEL.JIT_SHARED_GRAPH (compiled: the basic and meta-train steps in one graph); `helper_thread`:
    MODEL.JIT_HELPER_THREAD (compiled: built graphs run on compat.jit's low-priority helper thread); `device`:
    MODEL.DEVICE (gpu: each timed step ends with a CUDA synchronisation, and the peak GPU memory of the timed steps
    is added); `config`: the file under configs/synthetic the overrides apply to; `meta_parts`: after the timed
    steps, `repeats` more meta steps timed part by part (`time_meta_parts`); `inter_op`: MindSpore's
    inter_op_parallel_num for the graphs (set after the trainer's own setting, before any graph is built)."""
    import time

    import compat
    from compat.jit import resident_mb
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    graphs = []
    compat.jit.log = graphs.append  # one line per compiled graph: build seconds, resident memory it left
    if memory_level:
        import mindspore
        mindspore.set_context(memory_optimize_level=memory_level)
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", config),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", str(bool(jit)),
                                         "MODEL.CHUNK_FORWARDS", str(bool(chunk_forwards)), "MODEL.DEVICE", device,
                                         "MODEL.JIT_SHARED_GRAPH", str(bool(shared_graph)),
                                         "MODEL.JIT_HELPER_THREAD", str(bool(helper_thread))])
    compat.jit.set_helper_thread(cfg.MODEL.JIT_HELPER_THREAD)   # what train.py's configure_runtime does
    trainer = Trainer(cfg, quiet=True)
    if inter_op is not None:
        import mindspore
        mindspore.set_context(inter_op_parallel_num=int(inter_op))
    trainer.iter = 1
    start = time.perf_counter()
    trainer.basic_step()
    first_basic = time.perf_counter() - start
    peak_one = resident_mb("VmHWM")
    warmed = warm_up(trainer) if "meta" in steps else []
    warm = time.perf_counter() - start
    calls = {"basic": trainer.basic_step, "meta": trainer.meta_step}
    cuda = compat.torch.cuda if device == "gpu" else None
    if cuda is not None:  # the GPU's queued work belongs to the step that queued it
        calls = {step: (lambda call: lambda: (call(), cuda.synchronize()))(call) for step, call in calls.items()}
        cuda.reset_peak_memory_stats()
    rss_after_warm_up = resident_mb()
    reset_peak_rss()  # the timed steps' own peak: no graph is built any more
    result = median_seconds([(step, calls[step]) for step in steps], repeats)
    if cuda is not None:
        result["peak_gpu_mb"] = cuda.max_memory_allocated() / 2.0 ** 20
    result.update(layer=layer_name(), warm_up_s=warm, first_basic_s=first_basic, warmed_domains=warmed,
                  peak_rss_basic_mb=peak_one, rss_after_warm_up_mb=rss_after_warm_up,
                  peak_rss_steps_mb=resident_mb("VmHWM"), graphs=graphs)
    if meta_parts and "meta" in steps:
        result["meta_parts"] = time_meta_parts(trainer, repeats)
    return result


META_PARTS = ("meta-train step function", "fast-weight steps", "swap in θ'", "meta-test step function", "restore θ",
              "meta SGD", "the rest", "whole meta step")


def time_meta_parts(trainer, repeats):
    """{part: median seconds over `repeats` meta steps}: the trainer's meta step with timers around its parts
    (META_PARTS). Each timer waits for the queued kernels at both ends (`compat.synchronize`), so a part's
    asynchronous op-by-op kernels count in that part, not in the next wait. Compiled, the meta-test step function
    is split into writing θ' into the parameters (`compat.jit.swap_in`), its graph (the 'meta-test step function'
    row) and putting θ back (`compat.jit.restore`); op by op (and on torch) that row is the whole meta-test step
    function, fast weights included. 'the rest': the batches' assembly, the gradients' sum and the bookkeeping."""
    import time

    import numpy as np

    import compat
    import compat.jit as jit
    own = {"swap": jit.swap_in, "restore": jit.restore, "run": trainer._run_step_function,
           "fast": trainer.fast_weight_steps, "sgd": trainer.optimizer_meta.step}
    step = {}

    def timed(part, fn, subtract_from=None):
        def call(*args, **kwargs):
            compat.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            compat.synchronize()
            seconds = time.perf_counter() - start
            step[part] = step.get(part, 0.0) + seconds
            if subtract_from is not None:  # a part inside another: counted once
                step[subtract_from] = step.get(subtract_from, 0.0) - seconds
            return out
        return call

    def run_step_function(kind, *args, **kwargs):
        part = "meta-train step function" if kind == "mtrain" else "meta-test step function"
        return timed(part, own["run"])(kind, *args, **kwargs)

    jit.swap_in = timed("swap in θ'", own["swap"], "meta-test step function")
    jit.restore = timed("restore θ", own["restore"], "meta-test step function")
    trainer._run_step_function = run_step_function
    trainer.fast_weight_steps = timed("fast-weight steps", own["fast"])
    trainer.optimizer_meta.step = timed("meta SGD", own["sgd"])
    rows = {part: [] for part in META_PARTS}
    try:
        for _ in range(repeats):
            step.clear()
            timed("whole meta step", trainer.meta_step)()
            step["the rest"] = step["whole meta step"] - sum(v for k, v in step.items() if k != "whole meta step")
            for part in META_PARTS:
                rows[part].append(step.get(part, 0.0))
    finally:
        jit.swap_in, jit.restore = own["swap"], own["restore"]
        for owner, name in ((trainer, "_run_step_function"), (trainer, "fast_weight_steps"),
                            (trainer.optimizer_meta, "step")):
            delattr(owner, name)  # the patched instance attributes: the class's methods again
    return {part: float(np.median(values)) for part, values in rows.items()}


def _options(parser):
    parser.add_argument("--memory-level", default="", help="MindSpore memory_optimize_level of the compiled runs "
                        "(O0: MindSpore's default, O1: its SOMAS memory planner)")
    parser.add_argument("--variants", default="", help="comma-separated labels to run (default: all), e.g. "
                        "mindspore-compiled,torch where op by op does not fit in memory")
    parser.add_argument("--basic-only", action="store_true", help="time basic steps only (one graph compiled)")
    parser.add_argument("--network", default="acl", choices=NETWORKS, help="acl (default), or the Baseline on "
                        "resnet50_ibn_a / resnet50 (basic steps only)")
    parser.add_argument("--batch-forwards", action="store_true", help="also time MODEL.CHUNK_FORWARDS False (one "
                        "forward over the batch, per-chunk BN statistics) on each backend, labels *-batchfwd; "
                        "for the sizes with NUM_SPLITS > 1 (demo-s4, full-b8-s2)")
    parser.add_argument("--separate-graphs", action="store_true", help="also time compiled steps with a graph per "
                        "step kind (MODEL.JIT_SHARED_GRAPH False), label *-compiled-separate")
    parser.add_argument("--caller-thread", action="store_true", help="also time compiled steps whose graphs run on "
                        "the calling thread (MODEL.JIT_HELPER_THREAD False), label *-compiled-caller")
    parser.add_argument("--inter-op", type=int, default=None, help="also time compiled steps whose graphs run "
                        "with MindSpore's inter_op_parallel_num N (how many kernels run side by side; 1: one at a "
                        "time), label *-compiled-interopN")
    parser.add_argument("--malloc-defaults", action="store_true", help="also time steps op by op and compiled "
                        "under glibc malloc's defaults (REID_MALLOC_TUNING=0: compat/allocator.py's settings off), "
                        "labels *-glibc, *-compiled-glibc")
    parser.add_argument("--gpu", action="store_true", help="also time torch on a CUDA GPU (MODEL.DEVICE gpu), "
                        "label torch-gpu, against torch on the CPU")
    parser.add_argument("--meta-parts", action="store_true", help="also time the meta step part by part (the "
                        "meta-train and meta-test step functions, fast weights, swap-in, restore, meta SGD, the "
                        "rest): --repeats more meta steps per variant, a table per size")
    parser.add_argument("--rounds", type=int, default=1, help="run every variant's process this many times, "
                        "round-robin in an order rotated each round, and report medians over the rounds and the "
                        "median of each round's own ratios (default 1)")
    parser.add_argument("--max-rss-gb", type=float, default=16.0, help="kill a run whose resident memory exceeds "
                        "this (default 16; 0: no watchdog); it is reported as 'exceeds N GB'")


def _print_meta_parts(size, got):
    """The meta step part by part (--meta-parts): seconds per part, a column per variant."""
    labels = [label for label in got if "meta_parts" in got[label]]
    if not labels:
        return
    print("%-7s meta step by part, s   %s" % (size, "  ".join("%22s" % label for label in labels)), flush=True)
    for part in META_PARTS:
        print("%-7s %-24s %s" % (size, part, "  ".join("%22.3f" % got[label]["meta_parts"][part]
                                                          for label in labels)), flush=True)


def combine_rounds(rounds, labels):
    """One result per label from several rounds of `measure` results ({label: result} each): every number the
    median over the rounds (the meta parts part by part), the rest (layer, build lines) the first round's. A
    variant killed in any round is reported killed (its largest reading)."""
    combined = {}
    for label in labels:
        runs = [r[label] for r in rounds if label in r]
        killed = [run for run in runs if "killed_above_mb" in run]
        if killed:
            combined[label] = max(killed, key=lambda run: run["peak_rss_mb"])
            continue
        result = dict(runs[0])
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                result[key] = float(np.median([run[key] for run in runs]))
        if "meta_parts" in result:
            result["meta_parts"] = {part: float(np.median([run["meta_parts"][part] for run in runs]))
                                    for part in result["meta_parts"]}
        combined[label] = result
    return combined


def _print_rounds(size, rounds, steps):
    """--rounds: each variant's step times round by round, and for each compiled MindSpore variant the median
    (and range) of the ratios taken within each round, its steps against torch and its peak resident memory against
    torch's: processes run close together share the host's state, so a drift between rounds cancels in these."""
    labels = list(rounds[0])
    for label in labels:
        print("%-7s rounds %s: %s" % (size, label, "; ".join(
            "%s %s s" % (step, " / ".join("%.2f" % r[label][step] if step in r.get(label, {}) else "-"
                                          for r in rounds)) for step in steps)), flush=True)
    for label in labels:
        if "-compiled" not in label:
            continue
        parts = []
        for reference in ("torch",):
            if any(reference not in r or step not in r[reference] for r in rounds for step in steps):
                continue
            for step in steps:
                ratios = [r[label][step] / r[reference][step] for r in rounds if step in r.get(label, {})]
                if ratios:
                    parts.append("%s %.2fx %s (%.2f-%.2f)" % (step, float(np.median(ratios)), reference,
                                                            min(ratios), max(ratios)))
        if all("torch" in r and "peak_rss_mb" in r["torch"] for r in rounds):
            ratios = [r[label]["peak_rss_mb"] / r["torch"]["peak_rss_mb"] for r in rounds
                      if "peak_rss_mb" in r.get(label, {})]
            parts.append("peak RSS %.2fx torch (%.2f-%.2f)" % (float(np.median(ratios)), min(ratios), max(ratios)))
        print("%-7s per-round ratios %s: %s" % (size, label, "; ".join(parts)), flush=True)


def _print_ratios(size, got, steps):
    """One line per compiled MindSpore variant: each step's time against torch eager, and the whole run's peak
    resident memory against torch's."""
    for label in got:
        if "-compiled" not in label:
            continue
        parts = []
        for step in steps:
            parts.append("%s %.2fx torch" % (step, got[label][step] / got["torch"][step]))
        parts.append("peak RSS %.2fx torch" % (got[label]["peak_rss_mb"] / got["torch"]["peak_rss_mb"]))
        print("%-7s ratios %s: %s" % (size, label, "; ".join(parts)), flush=True)


def main():
    args = size_args(__doc__, SIZES, default="demo,full-b8", extra=_options)
    from reid.data.synthetic import ensure_synthetic
    with tempfile.TemporaryDirectory(prefix="bench-train-") as root:
        compiled = {"jit": True}
        if args.memory_level:
            compiled["memory_level"] = args.memory_level
        # per MindSpore stack: op by op and compiled (MODEL.JIT)
        extra = {"-compiled": compiled}
        if args.separate_graphs:
            extra["-compiled-separate"] = dict(compiled, shared_graph=False)
        if args.caller_thread:
            extra["-compiled-caller"] = dict(compiled, helper_thread=False)
        if args.inter_op is not None:
            extra["-compiled-interop%d" % args.inter_op] = dict(compiled, inter_op=args.inter_op)
        if args.malloc_defaults:
            extra["-glibc"] = {"environ": {"REID_MALLOC_TUNING": "0"}}
            extra["-compiled-glibc"] = dict(compiled, environ={"REID_MALLOC_TUNING": "0"})
        if args.batch_forwards:
            extra["-batchfwd"] = {"chunk_forwards": False}
        variants = stack_variants(args.stacks, extra)
        if args.batch_forwards:  # torch's own (the reference of every ratio stays the default torch run)
            variants = dict(variants, **{"torch-batchfwd": ("torch", {"chunk_forwards": False},
                                                            variants["torch"][2])})
        if args.gpu:
            variants["torch-gpu"] = ("torch", {"device": "gpu"}, variants["torch"][2])
        if args.variants:
            variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
        network = [] if args.network == "acl" else ["MODEL.BACKBONE.NAME", args.network]
        basic_only = args.basic_only or bool(network)
        common = {"steps": ("basic",)} if basic_only else {}
        if args.meta_parts and not basic_only:
            common["meta_parts"] = True
        if network:
            common["config"] = "baseline.yml"
            print("network: the Baseline on %s (basic steps only)" % args.network, flush=True)
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        layers = {}
        max_rss_mb = args.max_rss_gb * 1024 if args.max_rss_gb else None

        def run_variant(label, spec):
            """`measure(**spec)` with the variant's own settings, in a fresh process of its environment."""
            backend, kwargs, python = variants[label]
            return run_isolated(backend, "bench.train_step:measure",
                                dict(spec, **{k: x for k, x in kwargs.items() if k != "environ"}),
                                python=python, max_rss_mb=max_rss_mb, environ=kwargs.get("environ"))
        for size in args.sizes.split(","):
            spec = dict(common, overrides=SIZES[size] + network, root=root, repeats=args.repeats)
            rounds = []
            for index in range(max(1, args.rounds)):
                labels = list(variants)
                labels = labels[index % len(labels):] + labels[:index % len(labels)]
                if args.rounds > 1:
                    print("%-7s round %d of %d: %s" % (size, index + 1, args.rounds, ", ".join(labels)), flush=True)
                rounds.append({label: run_variant(label, spec) for label in labels})
            got = combine_rounds(rounds, list(variants))
            killed = {label for label in got if "killed_above_mb" in got[label]}
            for label in sorted(killed):
                print("%-7s %s: exceeds %.0f GB resident memory (killed at %.0f MB)" % (
                    size, label, args.max_rss_gb, got[label]["peak_rss_mb"]), flush=True)
            got = {k: v for k, v in got.items() if k not in killed}
            _print_meta_parts(size, got)
            if "torch" not in got:  # no reference: each variant's own figures, no ratios
                for label, r in got.items():
                    print("%-7s %s: %s; peak RSS %.0f MB" % (size, label, "; ".join(
                        "%s step %.2f s" % (step, r[step]) for step in ("basic", "meta") if step in r),
                        r["peak_rss_mb"]), flush=True)
                continue
            for label in got:
                layers[label] = got[label]["layer"]
            tr = got["torch"]
            timed = [label for label in got if label != "torch"]
            for step in ("basic",) if basic_only else ("basic", "meta"):
                print("%-7s %-5s step   %s   torch %7.2f s" % (size, step, "   ".join(
                    "%s %7.2f s (%5.2fx)" % (label, got[label][step], got[label][step] / tr[step])
                    for label in timed), tr[step]), flush=True)
            print("%-7s peak RSS     %s   torch %7.0f MB" % (size, "   ".join(
                "%s %7.0f MB (%5.2fx)" % (label, got[label]["peak_rss_mb"],
                                          got[label]["peak_rss_mb"] / tr["peak_rss_mb"])
                for label in timed), tr["peak_rss_mb"]), flush=True)
            _print_ratios(size, got, ("basic",) if basic_only else ("basic", "meta"))
            if len(rounds) > 1:
                _print_rounds(size, rounds, ("basic",) if basic_only else ("basic", "meta"))
            print("%-7s peak RSS after the first basic step   %s   torch %7.0f MB" % (size, "   ".join(
                "%s %7.0f MB" % (label, got[label]["peak_rss_basic_mb"]) for label in timed),
                tr["peak_rss_basic_mb"]), flush=True)
            print("%-7s RSS after the warm-up   %s   torch %7.0f MB" % (size, "   ".join(
                "%s %7.0f MB" % (label, got[label]["rss_after_warm_up_mb"]) for label in timed),
                tr["rss_after_warm_up_mb"]), flush=True)
            print("%-7s peak RSS of the timed steps alone   %s   torch %7.0f MB" % (size, "   ".join(
                "%s %7.0f MB" % (label, got[label]["peak_rss_steps_mb"]) for label in timed),
                tr["peak_rss_steps_mb"]), flush=True)
            print("%-7s first basic step   %s   torch %5.1f s" % (size, "   ".join(
                "%s %5.1f s" % (label, got[label]["first_basic_s"]) for label in timed), tr["first_basic_s"]),
                flush=True)
            print("%-7s warm-up      %s   torch %5.0f s   (meta-test domains %s)" % (size, "   ".join(
                "%s %5.0f s" % (label, got[label]["warm_up_s"]) for label in timed),
                tr["warm_up_s"], got["torch"]["warmed_domains"]), flush=True)
            for label in timed:
                if "peak_gpu_mb" in got[label]:
                    print("%-7s %s peak GPU memory of the timed steps %.0f MB (torch's allocator)" % (
                        size, label, got[label]["peak_gpu_mb"]), flush=True)
                for line in got[label].get("graphs", []):
                    print("%-7s %s %s" % (size, label, line), flush=True)
    print("; ".join("%s: %s" % (k, v) for k, v in layers.items() if "-compiled" not in k))


if __name__ == "__main__":
    main()
