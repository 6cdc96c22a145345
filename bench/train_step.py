"""Seconds per ACL training step, MindSpore op by op, MindSpore compiled (MODEL.JIT) and torch, measured in one
run (one after the other, so they never share the CPU): a basic step (forward + backward + SGD on the combined
batch) and a meta step (meta-train forward/backward, fast weights, meta-test forward/backward at θ', meta SGD),
through the real Trainer.

Sizes: demo (configs/synthetic/acl.yml: BASE_WIDTH 8, 64x32, batch 64, meta batches 2x32 + 32, NUM_SPLITS 1),
full (BASE_WIDTH 64, 256x128, batch 16, meta batches 2x8 + 8, NUM_SPLITS 1) and full-b8 (the same at half
the batch: 8, meta batches 2x4 + 4). The default is demo,full-b8: on CPU a full-size batch-16 step of the
MindSpore backend needs more than 24 GB of memory (the kernel's OOM killer stopped it at 24 GB resident on
our 24 GiB machines). Data: a small synthetic set
(augmentation off, loader in the main process; reading and resizing the images is part of each step, about
1% of it). Class counts come from that data, so the full-size head is smaller than Protocol-2's.
Before timing, each side runs a basic step and meta steps until every source domain has been the meta-test
domain once, so that no step signature builds its (MindSpore) backward graph or compiled graph inside the
timed calls (the warm-up time printed includes the compiled graphs' build). Each side runs in a fresh process,
so the peak resident memory printed is that variant's own.

    python bench/train_step.py [--sizes demo,full-b8,full] [--repeats 3] [--stacks msadapter,mindtorch]

`--stacks msadapter,mindtorch` times both MindSpore stacks (.venv, .venv-mindtorch) against torch in one run.
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import layer_name, median_seconds, on_both_backends, size_args, stack_variants  # noqa: E402

SIZES = {
    "demo": ["MODEL.BACKBONE.BASE_WIDTH", "8", "INPUT.SIZE_TRAIN", "[64,32]", "SOLVER.IMS_PER_BATCH", "64",
             "META.IMS_PER_DOMAIN", "32", "MODEL.NUM_SPLITS", "1"],
    "full": ["MODEL.BACKBONE.BASE_WIDTH", "64", "INPUT.SIZE_TRAIN", "[256,128]", "SOLVER.IMS_PER_BATCH", "16",
             "META.IMS_PER_DOMAIN", "8", "MODEL.NUM_SPLITS", "1"],
    "full-b8": ["MODEL.BACKBONE.BASE_WIDTH", "64", "INPUT.SIZE_TRAIN", "[256,128]", "SOLVER.IMS_PER_BATCH", "8",
                "META.IMS_PER_DOMAIN", "4", "MODEL.NUM_SPLITS", "1"],
}
COMMON = ["DATASETS.NAMES", "['SynthA','SynthB','SynthC']", "DATASETS.TESTS", "[]", "DATASETS.SYNTHETIC.NUM_IDS",
          "80", "DATALOADER.NUM_WORKERS", "0", "INPUT.AUTOAUG.ENABLED", "False", "INPUT.FLIP.ENABLED", "False",
          "INPUT.PADDING.ENABLED", "False", "INPUT.CJ.ENABLED", "False"]


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


def measure(overrides, root, repeats, jit=False):
    import time
    from reid.config import load_cfg
    from reid.engine.trainer import Trainer
    cfg = load_cfg(os.path.join(ROOT, "configs", "synthetic", "acl.yml"),
                   COMMON + overrides + ["DATASETS.ROOT", root, "OUTPUT_DIR", os.path.join(root, "out"),
                                         "MODEL.JIT", str(bool(jit))])
    trainer = Trainer(cfg, quiet=True)
    trainer.iter = 1
    start = time.perf_counter()
    warmed = warm_up(trainer)
    warm = time.perf_counter() - start
    result = median_seconds((("basic", trainer.basic_step), ("meta", trainer.meta_step)), repeats)
    result.update(layer=layer_name(), warm_up_s=warm, warmed_domains=warmed)
    return result


def main():
    args = size_args(__doc__, SIZES, default="demo,full-b8")
    # per MindSpore stack: op by op and compiled (MODEL.JIT)
    variants = stack_variants(args.stacks, {"-compiled": {"jit": True}})
    from reid.data.synthetic import ensure_synthetic
    with tempfile.TemporaryDirectory(prefix="bench-train-") as root:
        ensure_synthetic(os.path.join(root, "synthetic"), seed=0, num_ids=80, domains=["SynthA", "SynthB", "SynthC"],
                         progress=False)
        layers = {}
        for size in args.sizes.split(","):
            got = on_both_backends("bench.train_step:measure",
                                   dict(overrides=SIZES[size], root=root, repeats=args.repeats), variants)
            for label in got:
                layers[label] = got[label]["layer"]
            tr = got["torch"]
            timed = [label for label in variants if label != "torch"]
            for step in ("basic", "meta"):
                print("%-7s %-5s step   %s   torch %7.2f s" % (size, step, "   ".join(
                    "%s %7.2f s (%5.2fx)" % (label, got[label][step], got[label][step] / tr[step])
                    for label in timed), tr[step]), flush=True)
            print("%-7s peak RSS     %s   torch %7.0f MB" % (size, "   ".join(
                "%s %7.0f MB (%5.2fx)" % (label, got[label]["peak_rss_mb"],
                                          got[label]["peak_rss_mb"] / tr["peak_rss_mb"])
                for label in timed), tr["peak_rss_mb"]), flush=True)
            print("%-7s warm-up      %s   torch %5.0f s   (meta-test domains %s)" % (size, "   ".join(
                "%s %5.0f s" % (label, got[label]["warm_up_s"]) for label in timed),
                tr["warm_up_s"], got["torch"]["warmed_domains"]), flush=True)
    print("; ".join("%s: %s" % (k, v) for k, v in layers.items() if not k.endswith("-compiled")))


if __name__ == "__main__":
    main()
