"""Sharded extraction (tools/index.py --nproc N): images/s of indexing one gallery folder with 1 and 2 processes
on each backend's launcher (torchrun / MindSpore's scheduler + workers), full-size ACL network (ResNet-50
width 64, 256x128), and whether the indexes are equal (the largest feature difference).

The gallery: --images random JPEGs (person-crop sized; the content does not change the speed). The network:
seeded weights of the full-size config (no training needed for a speed figure). Each run is the command a
user types, timed from start to end (imports, the launcher, the cluster, the model, the extraction and the
write), after one warm-up run that fills the exported-model cache (engine auto exports the network to ONNX
once; the timed runs load it). Every rank gets cores / N intra-op threads (reid.engine.distributed), so on a
2-core machine two ranks share the cores one process had.

    python bench/index_sharded.py [--images 512] [--nproc 1,2] [--backends torch,mindspore] [--engine auto]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def make_model(folder):
    """The full-size config (written to folder/config.yaml) and seeded weights; returns their paths."""
    import compat
    from reid.config import get_cfg
    from reid.modeling import build_model
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [100, 100, 100]
    cfg.MODEL.COMPILE_CACHE = "off"
    cfg.OUTPUT_DIR = os.path.join(folder, "out-%s" % compat.BACKEND)
    np.random.seed(0)
    weights = os.path.join(folder, "model-%s.pth" % compat.BACKEND)
    compat.checkpoint.save(compat.checkpoint.state_dict(build_model(cfg).eval()), weights)
    config = os.path.join(folder, "config-%s.yaml" % compat.BACKEND)
    with open(config, "w") as fh:
        fh.write(cfg.dump())
    return {"config": config, "weights": weights}


def make_gallery(folder, count, seed=0):
    import cv2
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        image = rng.integers(0, 256, (256, 128, 3), dtype=np.uint8)
        cv2.imwrite(os.path.join(folder, "%04d_c%ds1_%06d_00.jpg" % (i // 8, i % 6 + 1, i)), image)


def index(python, backend, gallery, output, model, nproc, engine, port):
    command = [str(python), os.path.join(ROOT, "tools", "index.py"), "--gallery", gallery, "--output", output,
               "--config-file", model["config"], "--engine", engine, "--no-progress", "--rebuild",
               "MODEL.WEIGHTS", model["weights"]]
    if nproc > 1:
        command += ["--nproc", str(nproc), "--master-port", str(port)]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=dict(os.environ, REID_BACKEND=backend), capture_output=True,
                          text=True, timeout=7200)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit("%s failed (rc %d):\n%s" % (" ".join(command), proc.returncode, proc.stderr[-4000:]))
    return seconds, proc.stdout.strip().splitlines()[-1]


def main():
    from bench.timing import run_isolated
    from reid.deploy.gallery import load_index
    from tests.crossenv import PYTHONS
    from tests.test_distributed import _free_port
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--nproc", default="1,2")
    parser.add_argument("--backends", default="torch,mindspore")
    parser.add_argument("--engine", default="auto", help="tools/index.py --engine (default auto)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-index-") as folder:
        gallery = os.path.join(folder, "gallery")
        make_gallery(gallery, args.images)
        make_gallery(os.path.join(folder, "warm"), 4, seed=1)
        for backend in args.backends.split(","):
            model = run_isolated(backend, "bench.index_sharded:make_model", {"folder": folder})
            python = PYTHONS[backend]
            index(python, backend, os.path.join(folder, "warm"), os.path.join(folder, "warm.npz"), model, 1,
                  args.engine, _free_port())
            rates, first = {}, None
            for nproc in [int(v) for v in args.nproc.split(",")]:
                output = os.path.join(folder, "%s-%d.npz" % (backend, nproc))
                seconds, summary = index(python, backend, gallery, output, model, nproc, args.engine, _free_port())
                rates[nproc] = args.images / seconds
                got = load_index(output)
                if first is not None and got.paths != first[1].paths:
                    raise SystemExit("--nproc %d indexed other paths than --nproc %d" % (nproc, first[0]))
                gap = "" if first is None else ", max |feature - --nproc %d's| %.1e" % (
                    first[0], float(np.abs(got.features - first[1].features).max()))
                first = first or (nproc, got)
                print("%-9s --nproc %d: %7.1f s, %6.2f images/s%s; %s" % (backend, nproc, seconds, rates[nproc], gap,
                                                                        summary), flush=True)
            base = min(rates)
            print("%-9s images/s against --nproc %d: %s" % (backend, base, ", ".join(
                "--nproc %d x%.2f" % (n, r / rates[base]) for n, r in sorted(rates.items()))), flush=True)


if __name__ == "__main__":
    main()
