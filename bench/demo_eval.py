"""The demo's evaluations (configs/synthetic/acl.yml: SynthD at 64x32, TEST.IMS_PER_BATCH 256, before and after
training) on MindSpore, op by op (TEST.JIT False) against compiled (TEST.JIT True) with graph building included,
in one run: one fresh process per variant, one after the other, so they never share the CPU.

Variants: op by op; compiled with an empty compile cache (the first `make demo`: the graph is built); compiled
again on that cache (a later run with the same code and config: the graph is loaded, compat/jit.py).

Each process builds the demo's trainer, then runs the evaluation (1: the untrained one, graph building
included), two op-by-op basic training steps (the second timed: whether a compiled evaluation slows the op-by-op
training that follows it), and the evaluation again (2: the final one, on the changed weights). Printed per
variant: seconds of evaluation 1 and 2, of the timed step, the process's peak resident memory, and SynthD mAP
of both evaluations (the variants must agree: same weights, same features to float32 rounding).

    python bench/demo_eval.py [--data-root DIR] [--variants op,cold,warm]

The demo data (SynthA-D, 300 identities each, ~25 s to write) goes to --data-root (default: a temporary
folder, deleted afterwards).
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, run_isolated  # noqa: E402

DEMO = os.path.join(ROOT, "configs", "synthetic", "acl.yml")
VARIANTS = {"op": ("op by op", False), "cold": ("compiled, empty compile cache", True),
            "warm": ("compiled, graph from the compile cache", True)}


def measure(data_root, out, jit, cache):
    import time

    from reid.config import load_cfg
    from reid.engine.launch import build_evaluate_fn
    from reid.runtime import configure_runtime
    from reid.engine.trainer import Trainer
    cfg = load_cfg(DEMO, ["DATASETS.ROOT", data_root, "OUTPUT_DIR", out, "TEST.JIT", str(bool(jit)),
                          "MODEL.COMPILE_CACHE", cache, "MODEL.JIT", "False"])  # op-by-op steps between them
    configure_runtime(cfg)
    trainer = Trainer(cfg, quiet=True)
    evaluate = build_evaluate_fn(cfg)
    result = {"layer": layer_name()}

    def timed(label, fn):
        start = time.perf_counter()
        value = fn()
        result[label] = time.perf_counter() - start
        return value

    first = timed("eval 1 s", lambda: evaluate(trainer.model))
    trainer.iter = 1
    trainer.basic_step()                      # builds the op-by-op backward graph: not timed
    timed("step s", trainer.basic_step)
    second = timed("eval 2 s", lambda: evaluate(trainer.model))
    result["mAP 1"], result["mAP 2"] = first["SynthD"]["mAP"], second["SynthD"]["mAP"]
    return result


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="", help="folder for the demo data (default: a temporary one)")
    parser.add_argument("--variants", default="op,cold,warm", help="comma-separated: %s" % ", ".join(VARIANTS))
    args = parser.parse_args()
    from reid.data.synthetic import ensure_synthetic
    with tempfile.TemporaryDirectory(prefix="bench-demo-eval-") as tmp:
        data_root = args.data_root or tmp
        ensure_synthetic(os.path.join(data_root, "synthetic"), seed=0, num_ids=300, progress=False)
        cache = os.path.join(tmp, "compile_cache")
        got = {}
        for name in args.variants.split(","):
            label, jit = VARIANTS[name]
            got[name] = run_isolated("mindspore", "bench.demo_eval:measure", dict(
                data_root=data_root, out=os.path.join(tmp, "out-" + name), jit=jit, cache=cache if jit else "off"))
            r = got[name]
            print("%-40s eval 1 %6.1f s   eval 2 %6.1f s   op-by-op basic step %5.2f s   peak RSS %5.0f MB   "
                  "SynthD mAP %.2f / %.2f" % (label, r["eval 1 s"], r["eval 2 s"], r["step s"], r["peak_rss_mb"],
                                              r["mAP 1"], r["mAP 2"]), flush=True)
        if "op" in got:
            op = got["op"]
            for name in got:
                if name != "op":
                    r = got[name]
                    print("%s / op by op: both evaluations %.2fx (%+.1f s), eval 2 alone %.2fx, step %.2fx" % (
                        VARIANTS[name][0], (r["eval 1 s"] + r["eval 2 s"]) / (op["eval 1 s"] + op["eval 2 s"]),
                        r["eval 1 s"] + r["eval 2 s"] - op["eval 1 s"] - op["eval 2 s"],
                        r["eval 2 s"] / op["eval 2 s"], r["step s"] / op["step s"]), flush=True)
        print(next(iter(got.values()))["layer"])


if __name__ == "__main__":
    main()
