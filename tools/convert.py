#!/usr/bin/env python
"""Move weights and configs between acl-reid and the original ACL-DGReID code (PyTorch, fast-reid based).

    python tools/convert.py output/acl/model_final.pth --to original --output acl_dgreid_model.pth
        one of our checkpoints (a training checkpoint: its model, or its weight average under SOLVER.EMA; or a
        state dict) -> {"model": state_dict} in the original's names, which its Checkpointer loads
        (MODEL.WEIGHTS of the original code)
    python tools/convert.py ~/ACL-DGReID/logs/model_final.pth --to ours --output model.pth
        a checkpoint of the original code -> our state dict (MODEL.WEIGHTS also reads the original's directly)
    python tools/convert.py --from-original ~/ACL-DGReID/configs/bagtricks_DR50_mix.yml --output acl_from_original.yml
        an original config -> ours: the keys that build and evaluate the network

The name mapping and what is dropped or added: docs/model.md, "Models trained with the original code".
Weights are copied bit for bit: converting to the original and back gives an identical state dict.
"""
import argparse
import collections
import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def convert_weights(source, to, output):
    """Write `source`'s model state to `output` in the original's format (to='original') or ours ('ours');
    returns a one-line summary."""
    from compat import checkpoint
    from compat.errors import UserError
    from reid.engine.checkpointer import model_state_from_file
    from reid.modeling import original

    state = model_state_from_file(source)
    if to == "ours":
        checkpoint.save(collections.OrderedDict(state), output)
        return "wrote %s: %d tensors in acl-reid's names (MODEL.WEIGHTS)" % (output, len(state))
    if isinstance(state, original.RenamedState):
        raise UserError("%s is already a checkpoint of the original code; --to original converts one of "
                        "acl-reid's" % source)
    converted = original.to_original(state)
    checkpoint.save({"model": converted}, output)
    added = collections.Counter(original.dead_part(k) or original.BN_COUNTER for k in converted
                                if original.our_name(k) is None)
    return ("wrote %s: {'model': %d tensors in the original ACL-DGReID names}, of which %s were added at their "
            "initial values" % (output, len(converted), ", ".join("%d %s" % (n, part) for part, n in
                                                                  sorted(added.items(), key=lambda kv: -kv[1]))))


def convert_config(source, output):
    from reid.config.original import write_config_from_original
    tree, skipped = write_config_from_original(source, output)
    sections = sorted({".".join(k.split(".")[:2]) for k in skipped})
    backbone = tree["MODEL"]["BACKBONE"]
    hint = ("; MODEL.BACKBONE.PRETRAIN is on without a PRETRAIN_PATH: give the path of resnet50_ibn_a-d9d0bb7b.pth "
            "to train (evaluation and export load MODEL.WEIGHTS alone)"
            if backbone["PRETRAIN"] and not backbone["PRETRAIN_PATH"] else "")
    return "wrote %s from %s; not read (training recipe: acl-reid's defaults apply): %s%s" % (
        output, source, ", ".join(sections) or "nothing", hint)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", metavar="CHECKPOINT", help="weights file to convert (with --to)")
    p.add_argument("--to", choices=("original", "ours"), help="names and format of the written weights")
    p.add_argument("--from-original", metavar="CONFIG.yml", help="an original ACL-DGReID config to read into ours")
    p.add_argument("--output", required=True, metavar="PATH", help="file to write (.pth weights or .yml config)")
    p.add_argument("--backend", choices=("mindspore", "torch"), default=None,
                   help="framework to run under (default: $REID_BACKEND or mindspore); the numbers do not depend on it")
    args = p.parse_args(argv)
    if args.backend:
        os.environ["REID_BACKEND"] = args.backend
    from compat.errors import UserError
    if bool(args.from_original) == bool(args.to) or bool(args.source) != bool(args.to):
        raise UserError("give either CHECKPOINT --to original|ours, or --from-original CONFIG.yml (with --output)")
    if os.path.abspath(args.output) == os.path.abspath(args.source or args.from_original):
        raise UserError("--output %s is the file being converted; write to another path" % args.output)
    if args.from_original:
        print(convert_config(args.from_original, args.output))
    else:
        print(convert_weights(args.source, args.to, args.output))


if __name__ == "__main__":
    faulthandler.enable()
    main()
