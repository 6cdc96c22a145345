"""Other MindSpore releases under the MindSpore 2.7 stack's layer (mindnlp 0.5.1's mindtorch): does the layer
import, does the model run, and how fast are MindSpore's CPU convolutions, each release in a process of its own
environment, one after the other in one run, against the first one given (the stack's pinned 2.7.0).

    python bench/ms_versions.py --envs 2.7.0=.venv,2.8.0=/tmp/ms280 [--repeats 5]

Each environment is a Python 3.11 venv with that `mindspore`, mindnlp 0.5.1 installed `--no-deps`, and the rest
of requirements.txt (mindnlp declares mindspore<=2.7.0, so newer releases only go in this way). Per
release: the median seconds of MindSpore's own Conv2D (no layer) on ResNet-50's stem (7x7, stride 2, 3->64
channels on 16x3x256x128) and on a stage-1 3x3 (64->64 on 16x64x64x32), forward alone and forward + backward;
the seconds `import mindtorch` took; and a demo-width ACL network (ResNet-26x, width 8, 64x32, batch 8)
built through compat, its training loss and the sum of its gradients' norms op by op (equal across releases to
float32 rounding when the model runs right). The load average is printed beside each release: other work on
the machine moves the absolute seconds, so only ratios within one run mean anything (giving the reference
twice, first and last, shows how much they move).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVS = {"7x7 stem": ((16, 3, 256, 128), (64, 3, 7, 7), 2, 3), "3x3 stage-1": ((16, 64, 64, 32), (64, 64, 3, 3), 1, 1)}


def child(repeats):
    """Runs in the release's environment: the figures of one release, as JSON on the last line of stdout. The
    convolutions are timed first, on MindSpore alone, so that a release the layer does not import on still
    gives them."""
    import numpy as np
    import mindspore
    from mindspore import ops
    result = {"mindspore": mindspore.__version__}
    rng = np.random.RandomState(1)
    for name, (x_shape, w_shape, stride, pad) in CONVS.items():
        x = mindspore.Tensor(rng.rand(*x_shape).astype(np.float32))
        w = mindspore.Parameter(mindspore.Tensor(rng.randn(*w_shape).astype(np.float32) * 0.05), name="w")

        def forward():
            return ops.conv2d(x, w, None, stride, "pad", pad)

        backward = mindspore.value_and_grad(lambda: forward().sum(), None, [w])
        for label, call in (("forward", forward), ("forward+backward", backward)):
            out = call()
            (out[0] if isinstance(out, tuple) else out).asnumpy()   # warm-up (kernel selection)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                out = call()
                (out[0] if isinstance(out, tuple) else out).asnumpy()
                times.append(time.perf_counter() - t)
            result["%s %s" % (name, label)] = float(np.median(times))
    start = time.perf_counter()
    try:
        import mindtorch  # noqa: F401 (the layer's import, timed)
    except Exception as exc:  # a release the layer does not run on: its convolution figures still count
        result["import_error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        print(json.dumps(result))
        return
    result["import_s"] = time.perf_counter() - start
    sys.path.insert(0, ROOT)
    import compat
    from reid.config import get_cfg
    from reid.modeling import build_model
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.BASE_WIDTH, cfg.MODEL.BACKBONE.DEPTH = 8, "26x"
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = [5, 6, 7]
    np.random.seed(0)
    model = build_model(cfg)
    model.train()
    images = compat.as_tensor((rng.rand(8, 3, 64, 32) * 255).astype(np.float32))
    params = [p for _, p in model.named_parameters() if p.requires_grad]

    def loss_fn():
        out = model(images)
        return (out["neck_feat"] * out["neck_feat"]).mean() + out["logits"][0].mean()

    loss, _, grads = compat.value_and_grad(loss_fn, params)()
    result["model_loss"] = float(compat.to_numpy(loss))
    result["model_grad_norm_sum"] = float(sum(np.linalg.norm(compat.to_numpy(g)) for g in grads))
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="", help="comma-separated release=venv (the first is the reference)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeats)
        return
    if not args.envs:
        parser.error("--envs is required, e.g. --envs 2.7.0=.venv,2.8.0=/tmp/ms280")
    envs = [item.split("=", 1) for item in args.envs.split(",")]
    rows = {}
    for release, venv in envs:
        load = os.getloadavg()[0]
        proc = subprocess.run([os.path.join(venv, "bin", "python"), os.path.abspath(__file__), "--child", "--repeats",
                               str(args.repeats)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, REID_BACKEND="mindspore", PYTHONPATH=ROOT, GLOG_v="3"))
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            print("%-6s fails (load %.1f): %s" % (release, load, (proc.stderr.strip().splitlines() or ["?"])[-1]),
                  flush=True)
            continue
        rows[release] = row = json.loads(lines[-1])
        ref = rows.get(envs[0][0], row)
        times = "   ".join("%s %.3f s (%.2fx)" % (key, row[key], row[key] / ref[key]) for key in row
                           if key.startswith(tuple(CONVS)))
        if "import_error" in row:
            layer = "import mindtorch fails: %s" % row["import_error"]
        else:
            layer = "import mindtorch %.1f s, model loss %.6g (%+.1e vs %s), gradient norms %.6g (%+.1e)" % (
                row["import_s"], row["model_loss"], row["model_loss"] / ref["model_loss"] - 1, envs[0][0],
                row["model_grad_norm_sum"], row["model_grad_norm_sum"] / ref["model_grad_norm_sum"] - 1)
        print("%-6s MindSpore %s, load %.1f: %s\n       convolutions: %s" % (release, row["mindspore"], load, layer,
                                                                             times), flush=True)


if __name__ == "__main__":
    main()
