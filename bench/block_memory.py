"""Memory of one training forward + backward per kind of block of the ACL network, MindSpore compiled against
torch, measured in one run: where the full-size step's memory ratio (bench/train_step.py) comes from.

Each block runs in a fresh process per backend on one feature map of a full-size stage at batch 16 (stage 1:
256 channels, 64x32; 2: 512, 32x16; 3: 1024, 16x8; 4: 2048, 16x8, last stride 1), its loss the sum of its
output, gradients w.r.t. its parameters (MindSpore: one `compat.jit.value_and_grad` graph; torch: eager).
Printed per block and backend: the resident memory the step needs above the process's memory before its first
call, in MB and in feature maps of the stage's input size. MindSpore: what the process keeps after the
graph's first call (its memory pool grows to the step's working set and keeps it; the build's leftovers
released) and, in brackets, the peak during that call (the graph's build included); torch: the peak during
its first call (its working set; torch hands memory back, so what it keeps says little).

Blocks:
  bottleneck    ResNet-50-IBN-a's bottleneck (IBN-a: its first norm half instance norm), as in the main stages
  in-bottleneck the CODE block's static branch: the same bottleneck with instance norm everywhere
  experts       the CODE block's K = 4 grouped expert bottlenecks, output (N, K, C, H, W)
  experts+mix   the experts mixed by fixed router weights (the CODE block's weighted sum over the experts)
  code          the whole CODE block (both branches, router, the two norms, gate and SE)

    python bench/block_memory.py [--stages 1] [--blocks bottleneck,in-bottleneck,experts,experts+mix,code]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.timing import reset_peak_rss, run_isolated  # noqa: E402

BLOCKS = ("bottleneck", "in-bottleneck", "experts", "experts+mix", "code")
STAGES = {1: (256, 64, 32), 2: (512, 32, 16), 3: (1024, 16, 8), 4: (2048, 16, 8)}
BATCH, NUM_EXPERTS = 16, 4


def _block(name, channels):
    from reid.modeling.backbones.acl_resnet import CODEBlock, ExpertBottleneck
    from reid.modeling.backbones.resnet import Bottleneck
    if name == "bottleneck":
        return Bottleneck(channels, channels // 4, norm="IBN")
    if name == "in-bottleneck":
        return Bottleneck(channels, channels // 4, norm="IN")
    if name in ("experts", "experts+mix"):
        return ExpertBottleneck(channels, NUM_EXPERTS)
    return CODEBlock(channels, NUM_EXPERTS)


def measure(block, stage):
    """Resident MB a forward + backward of `block` at `stage` needs (module docstring), and the map size."""
    import numpy as np

    import compat
    from compat.jit import resident_mb
    from reid.modeling.backbones.acl_resnet import mix_experts
    channels, height, width = STAGES[stage]
    np.random.seed(0)
    module = _block(block, channels)
    module.train()
    params = list(module.parameters())
    router = compat.as_tensor(np.random.dirichlet(np.ones(NUM_EXPERTS), BATCH).astype(np.float32))
    x = compat.as_tensor(np.random.rand(BATCH, channels, height, width).astype(np.float32))

    def block_loss(x, router):
        out = module(x)
        if block == "code":
            out = out[0]
        elif block == "experts+mix":
            out = mix_experts(out, router)
        return out.sum()

    compiled = compat.IS_MINDSPORE
    if compiled:
        compat.jit.prepare(module)
        name = "block_memory_" + block.replace("+", "_").replace("-", "_")
        step = compat.jit.value_and_grad(block_loss, params, name)
    else:
        step = compat.value_and_grad(block_loss, params)
    before = resident_mb()
    reset_peak_rss()
    step(x, router)
    return {"kept_mb": resident_mb() - before, "peak_mb": resident_mb("VmHWM") - before,
            "map_mb": BATCH * channels * height * width * 4 / 2.0 ** 20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="1", help="comma-separated full-size stages 1-4 (default 1)")
    parser.add_argument("--blocks", default=",".join(BLOCKS), help="comma-separated: %s" % ", ".join(BLOCKS))
    args = parser.parse_args()
    blocks = args.blocks.split(",")
    for name in blocks:
        if name not in BLOCKS:
            raise SystemExit("unknown block %r; choose from %s" % (name, ", ".join(BLOCKS)))
    for stage in (int(s) for s in args.stages.split(",")):
        if stage not in STAGES:
            raise SystemExit("unknown stage %r; choose from 1, 2, 3, 4" % stage)
        channels, height, width = STAGES[stage]
        print("stage %d: batch %d, %d channels, %dx%d" % (stage, BATCH, channels, height, width), flush=True)
        for name in blocks:
            ms = run_isolated("mindspore", "bench.block_memory:measure", {"block": name, "stage": stage})
            pt = run_isolated("torch", "bench.block_memory:measure", {"block": name, "stage": stage})
            size = ms["map_mb"]
            print("  %-14s MindSpore compiled %6.0f MB = %5.1f maps (peak %6.0f during the first call)   torch "
                  "%6.0f MB = %5.1f maps   ratio %.2fx" % (name, ms["kept_mb"], ms["kept_mb"] / size,
                                                         ms["peak_mb"], pt["peak_mb"], pt["peak_mb"] / size,
                                                         ms["kept_mb"] / pt["peak_mb"]), flush=True)


if __name__ == "__main__":
    main()
