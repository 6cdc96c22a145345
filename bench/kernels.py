"""Where a training step's time goes, kernel by kernel: MindSpore's compiled basic step (MODEL.JIT, the default)
under MindSpore's own Profiler against torch's eager basic step under torch.profiler, each in a fresh process of
its environment, one after the other (they never share the CPU). Prints, per kernel family, calls and
milliseconds per step on each side and the time ratio, then each side's totals.

    python bench/kernels.py [--sizes demo] [--steps 5] [--stacks ms27] [--op-by-op]

--op-by-op profiles op-by-op steps (MODEL.JIT False) instead of compiled ones on the MindSpore side (torch runs
eagerly either way). MindSpore's profiler counts a kernel from its launch to its end,
waits included: its kernel milliseconds add up to several times the step's wall time there, so compare its
families with each other, and the stacks by bench/train_step.py's step times.

Sizes as bench/train_step.py's (demo by default: the compiled graph builds in ~40 s; full-b8 takes minutes).
MindSpore's profiler sees kernels only (the graph's and the op-by-op SGD update's): its milliseconds are
kernel time, each launch included. torch's are each operator's own CPU time (`self_cpu_time_total`), the data
loader's share left out of the totals, so both sides count the step's computation, not its data. A family is
a set of operator names on each side (KERNEL_FAMILIES); what no family claims is counted under "other".
"""
import csv
import glob
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, run_isolated, size_args, stack_variants  # noqa: E402
from bench.train_step import COMMON, SIZES  # noqa: E402

# family: (MindSpore kernel types, torch operator names)
KERNEL_FAMILIES = {
    "convolution forward + backward": (("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"),
                                       ("aten::mkldnn_convolution", "aten::convolution_backward",
                                        "aten::_convolution", "aten::convolution")),
    "batch / instance norm forward + backward": (("BatchNorm", "BatchNormGrad"),
                                                 ("aten::native_batch_norm", "aten::native_batch_norm_backward")),
    "sum reductions": (("ReduceSum",), ("aten::sum",)),
    "mean reductions": (("ReduceMean",), ("aten::mean",)),
    "tile / repeat / broadcast": (("Tile", "BroadcastTo"), ("aten::repeat", "aten::expand")),
    "elementwise multiply": (("Mul",), ("aten::mul",)),
    "elementwise add / sum of gradients": (("Add", "AddN"), ("aten::add",)),
    "ReLU forward + backward": (("ReLU", "ReluGrad"), ("aten::relu", "aten::clamp_min", "aten::threshold_backward")),
    "matrix products": (("MatMul", "BatchMatMul"), ("aten::mm", "aten::bmm", "aten::addmm")),
    "SGD update (MindSpore: one kernel per parameter; torch: in-place add_ / mul_)": (("SGD",),
                                                                                      ("aten::add_", "aten::mul_")),
}
DATA_LOADING = "enumerate(DataLoader)"  # torch's profiler records the loader; MindSpore's sees no data loading


def _trainer(overrides, root, jit=True):
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", str(bool(jit)), "TEST.EVAL_AT_START", "False"])
    trainer = Trainer(cfg, quiet=True)
    trainer.iter = 1
    for _ in range(2):  # compiled: the first call builds the graph
        trainer.basic_step()
    return trainer


def profile_mindspore(overrides, root, steps, jit=True):
    """{kernel type: (calls, ms)} per step from MindSpore's Profiler over `steps` basic steps (compiled unless
    `jit` is False)."""
    import mindspore
    trainer = _trainer(overrides, root, jit)
    out = tempfile.mkdtemp(prefix="ms-profiler-", dir=root)
    profiler = mindspore.Profiler(output_path=out)
    for _ in range(steps):
        trainer.basic_step()
    try:
        profiler.analyse()
    except RuntimeError as exc:
        # a profiler that writes its CPU operator tables, then refuses the timeline of a PyNative-mode process
        # (ours: the compiled steps are graphs called from it): the tables are what this reads
        if "Pynative" not in str(exc):
            raise
    # MindSpore writes <run folder>/FRAMEWORK/cpu_op_type_info_*.csv (older releases profiler/cpu_op_type_info_*.csv)
    table = glob.glob(os.path.join(out, "**", "cpu_op_type_info_*.csv"), recursive=True)
    if not table:
        raise RuntimeError("MindSpore's profiler wrote no operator table under %s" % out)
    kernels = {}
    with open(table[0]) as fh:
        for row in csv.DictReader(fh):
            kernels[row["op_type"]] = (int(row["type_occurrences"]) / steps,
                                       float(row["total_compute_time"]) / steps)
    return {"kernels": kernels, "layer": layer_name()}


def profile_torch(overrides, root, steps):
    """{operator: (calls, self CPU ms)} per step from torch.profiler over `steps` eager basic steps."""
    from torch.profiler import ProfilerActivity, profile
    trainer = _trainer(overrides, root)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.basic_step()
    kernels = {e.key: (e.count / steps, e.self_cpu_time_total / 1000.0 / steps) for e in prof.key_averages()}
    return {"kernels": kernels, "layer": layer_name()}


def measure(overrides, root, steps, jit=True):
    import compat
    if compat.IS_MINDSPORE:
        return profile_mindspore(overrides, root, steps, jit)
    return profile_torch(overrides, root, steps)


def by_family(kernels, side):
    """{family: (calls, ms)} with 'other' for the rest; `side` 0 = MindSpore names, 1 = torch names."""
    out, claimed = {}, set()
    for family, names in KERNEL_FAMILIES.items():
        hits = [kernels[n] for n in names[side] if n in kernels]
        claimed.update(names[side])
        out[family] = (sum(h[0] for h in hits), sum(h[1] for h in hits))
    rest = [v for k, v in kernels.items() if k not in claimed and not k.startswith(DATA_LOADING)]
    out["other"] = (sum(v[0] for v in rest), sum(v[1] for v in rest))
    return out


def main():
    def extra(parser):
        parser.add_argument("--steps", type=int, default=5, help="profiled basic steps per side (default 5)")
        parser.add_argument("--op-by-op", action="store_true", help="profile op-by-op MindSpore steps "
                            "(MODEL.JIT False) instead of compiled ones")
    args = size_args(__doc__, SIZES, default="demo", extra=extra)
    from reid.data.synthetic import ensure_synthetic
    variants = stack_variants(args.stacks)
    with tempfile.TemporaryDirectory(prefix="bench-kernels-") as root:
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        for size in args.sizes.split(","):
            spec = {"overrides": SIZES[size], "root": root, "steps": args.steps, "jit": not args.op_by_op}
            got = {label: run_isolated(v[0], "bench.kernels:measure", spec, python=v[2])
                   for label, v in variants.items()}
            torch_side = by_family(got["torch"]["kernels"], 1)
            loading = sum(v[1] for k, v in got["torch"]["kernels"].items() if k.startswith(DATA_LOADING))
            for label in (k for k in got if k != "torch"):
                ms_side = by_family(got[label]["kernels"], 0)
                print("%s %s basic step, per step: %s (%s) against torch (%s)" % (
                    size, "op-by-op" if args.op_by_op else "compiled", label, got[label]["layer"],
                    got["torch"]["layer"]))
                print("  %-80s %8s %9s %8s %9s %7s" % ("kernel family", "calls", "ms", "calls", "ms", "ratio"))
                for family in list(KERNEL_FAMILIES) + ["other"]:
                    m, t = ms_side[family], torch_side[family]
                    ratio = "%6.1fx" % (m[1] / t[1]) if t[1] > 0 else "      -"
                    print("  %-80s %8.0f %9.1f %8.0f %9.1f %s" % (family, m[0], m[1], t[0], t[1], ratio))
                total_m = sum(v[1] for v in ms_side.values())
                total_t = sum(v[1] for v in torch_side.values())
                print("  %-80s %8.0f %9.1f %8.0f %9.1f %6.1fx" % (
                    "all kernels", sum(v[0] for v in ms_side.values()), total_m,
                    sum(v[0] for v in torch_side.values()), total_t, total_m / total_t))
                print("  (torch's data loading, left out above: %.1f ms per step)" % loading, flush=True)


if __name__ == "__main__":
    main()
