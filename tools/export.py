#!/usr/bin/env python
"""Export trained weights for deployment: ONNX (either backend) or MINDIR (MindSpore), plus a JSON sidecar
(PATH.json: input size and range, normalisation, model, feature size, opset, batch).

    python tools/export.py --config-file output/synthetic/acl/config.yaml \\
        MODEL.WEIGHTS output/synthetic/acl/model_final.pth --format onnx --output deploy/acl.onnx [--batch N]

The file takes float32 RGB images (N, 3, H, W) in 0..255 at INPUT.SIZE_TEST (normalisation is inside) and
returns the eval feature (N, D). torch writes ONNX with a dynamic batch; MindSpore writes MINDIR and ONNX with
the batch fixed to --batch (default 1). The written file is run once on --batch random images and compared
with the eager model (the sidecar's "check"). Evaluate it with test.py --engine onnx|mindir --model PATH.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    from reid.deploy.commands import enable_faulthandler
    enable_faulthandler()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default="", metavar="FILE", help="the config the weights were trained with")
    p.add_argument("--backend", choices=("mindspore", "torch"), default=None,
                   help="framework that exports (default: $REID_BACKEND or mindspore)")
    p.add_argument("--format", choices=("onnx", "mindir"), default=None, help="default: from the --output suffix")
    p.add_argument("--output", required=True, metavar="PATH", help="*.onnx or *.mindir")
    p.add_argument("--batch", type=int, default=1, help="batch size of fixed-batch files and of the check")
    p.add_argument("--no-check", action="store_true", help="skip running the written file against the eager model")
    p.add_argument("opts", nargs="*", metavar="KEY VALUE", help="config overrides, e.g. MODEL.WEIGHTS path.pth")
    args = p.parse_intermixed_args(argv)
    if args.backend:
        os.environ["REID_BACKEND"] = args.backend
    from reid.config import load_cfg
    from reid.deploy import export_model
    from reid.deploy.extractor import exported_identity
    from reid.engine.checkpointer import check_weights_file
    from reid.runtime import configure_runtime
    cfg = load_cfg(args.config_file or None, list(args.opts))
    configure_runtime(cfg)
    identity = None
    if cfg.MODEL.WEIGHTS:     # recorded in the sidecar: the file's features count as these weights' own
        check_weights_file(cfg.MODEL.WEIGHTS)
        identity = exported_identity(cfg)
    sidecar = export_model(cfg, args.output, args.format, batch=args.batch, check=not args.no_check,
                           identity=identity)
    print("wrote %s (%s, %s batch, feature size %d) and %s" % (
        args.output, sidecar["format"], "dynamic" if sidecar["dynamic_batch"] else "fixed %d" % sidecar["batch"],
        sidecar["model"]["feature_size"], args.output + ".json"))
    if "check" in sidecar:
        print("check: max |exported - eager| = %.3g on %d images (features up to %.3g)" % (
            sidecar["check"]["max_abs_diff_vs_eager"], sidecar["check"]["images"], sidecar["check"]["max_abs_feature"]))


if __name__ == "__main__":
    main()
