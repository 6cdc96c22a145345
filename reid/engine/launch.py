"""What train.py and test.py do, as functions: command-line parsing shared by both, config setup, the
training run, and evaluation on the configured target domains."""
import argparse
import faulthandler
import os
import sys


def build_parser(description, training):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default="", metavar="FILE", help="yacs config (see configs/)")
    p.add_argument("--backend", choices=("mindspore", "torch"), default=None,
                   help="framework under the torch API (default: $REID_BACKEND or mindspore)")
    p.add_argument("--device", default=None, help="cpu | gpu | ascend (sets MODEL.DEVICE)")
    p.add_argument("--help-config", action="store_true", help="print every config key with its default and exit")
    if training:
        p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/last_checkpoint")
    else:
        p.add_argument("--vis-rank", type=int, default=0, metavar="N",
                       help="write PNG rank lists (top-10) for N queries per test dataset")
        p.add_argument("--engine", choices=("eager", "onnx", "mindir"), default=None,
                       help="eager: the network with MODEL.WEIGHTS (default); onnx / mindir: the exported file "
                            "--model (onnxruntime / MindSpore GraphCell)")
        p.add_argument("--model", default=None, metavar="PATH",
                       help="exported model (tools/export.py) to evaluate; the engine follows its suffix")
    p.add_argument("opts", nargs="*", metavar="KEY VALUE",
                   help="config overrides, e.g. SOLVER.BASE_LR 0.01 (flags may come before or after them)")
    return p


def parse_args(description, training, argv=None):
    """Parse the command line and select the backend before anything imports `compat`."""
    # A crash in the framework's native code (seen once with MindSpore 2.0 PyNative on CPU, after ~190
    # iterations) then still prints the Python stack; --resume continues from the last checkpoint.
    faulthandler.enable()
    args = build_parser(description, training).parse_intermixed_args(argv)
    if args.backend:
        os.environ["REID_BACKEND"] = args.backend
    if args.help_config:
        from reid.config import get_cfg
        print(get_cfg().dump())
        sys.exit(0)
    return args


def setup_cfg(args):
    from reid.config import load_cfg
    opts = list(args.opts)
    if args.device:
        opts += ["MODEL.DEVICE", args.device]
    return load_cfg(args.config_file or None, opts)


def build_evaluate_fn(cfg):
    """fn(model) -> {dataset: metrics} over DATASETS.TESTS (loaders built once, reused)."""
    from reid.data.build import build_test_loaders
    from reid.evaluation import evaluate, options_from_cfg
    loaders = {name: build_test_loaders(cfg, name) for name in cfg.DATASETS.TESTS}
    options = options_from_cfg(cfg)

    def evaluate_fn(model, return_details=False):
        results, details = {}, {}
        for name, (qloader, gloader, qrec, grec) in loaders.items():
            out = evaluate(model, qloader, gloader, return_distmat=return_details, **options)
            if return_details:
                results[name] = out[0]
                details[name] = (out[1], qrec, grec)
            else:
                results[name] = out
        return (results, details) if return_details else results
    return evaluate_fn


def write_config(cfg):
    os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
    path = os.path.join(cfg.OUTPUT_DIR, "config.yaml")
    with open(path + ".tmp", "w") as fh:
        fh.write(cfg.dump())
    os.replace(path + ".tmp", path)
    return path


def train(cfg, resume=False, progress=True):
    """Train as configured, evaluating on the targets; returns the trainer (results in trainer.last_results)."""
    import compat
    from reid.engine.hooks import default_hooks
    from reid.engine.trainer import Trainer
    from reid.evaluation import format_results_table

    trainer = Trainer(cfg, resume=resume)
    cfg = trainer.cfg  # now carries the class counts of the training data
    write_config(cfg)
    print("backend %(backend)s (%(torch_api)s %(torch_api_version)s on %(framework)s %(framework_version)s), "
          "device %(device)s" % compat.info())
    print(trainer.data.train_set.summary())
    print("%d iterations (%d epochs x %d), output in %s" % (trainer.max_iter, cfg.SOLVER.MAX_EPOCH,
                                                             trainer.iters_per_epoch, cfg.OUTPUT_DIR))
    evaluate_fn = build_evaluate_fn(cfg) if len(cfg.DATASETS.TESTS) else None
    trainer.hooks = default_hooks(trainer, evaluate_fn, progress=progress)
    trainer.train()
    if getattr(trainer, "initial_results", None):
        print("before training:")
        print(format_results_table(trainer.initial_results))
    if getattr(trainer, "last_results", None):
        print("after training:")
        print(format_results_table(trainer.last_results))
    return trainer


def num_classes_in_state(state):
    """Per-domain class counts of a saved model (from its classifier shapes), or None."""
    counts = {}
    for key, value in state.items():
        parts = key.split(".")
        if len(parts) == 4 and parts[:2] == ["heads", "classifiers"] and parts[3] == "weight":
            counts[int(parts[2])] = int(value.shape[0])
    return [counts[d] for d in sorted(counts)] if counts else None


def build_eval_model(cfg):
    """The model described by cfg with MODEL.WEIGHTS loaded (class counts taken from the weights)."""
    import compat
    from compat.errors import UserError
    from reid.engine.checkpointer import model_state_from_file
    from reid.modeling import build_model

    if not cfg.MODEL.WEIGHTS:
        raise UserError("test.py needs trained weights: add MODEL.WEIGHTS path/to/model_final.pth")
    state = model_state_from_file(cfg.MODEL.WEIGHTS)
    counts = num_classes_in_state(state)
    if counts and counts != list(cfg.MODEL.HEADS.NUM_CLASSES):
        cfg.defrost()
        cfg.MODEL.HEADS.NUM_CLASSES = counts
        cfg.freeze()
    compat.set_device(cfg.MODEL.DEVICE)
    model = compat.to_device(build_model(cfg))
    try:
        compat.checkpoint.load_state_dict(model, state)
    except UserError as exc:
        raise UserError("%s does not fit the model of this config (%s); use the config the weights were trained "
                        "with (OUTPUT_DIR/config.yaml)" % (cfg.MODEL.WEIGHTS, exc)) from None
    model.eval()
    return model


def test(cfg, vis_rank=0, engine=None, model_path=None):
    """Evaluate MODEL.WEIGHTS (engine 'eager') or the exported file `model_path` (engine 'onnx' / 'mindir', by
    default the file's suffix) on DATASETS.TESTS; print the table, write OUTPUT_DIR/eval/results.json and,
    with vis_rank > 0, rank-list PNGs under OUTPUT_DIR/eval/rank_lists/<dataset>/."""
    import json

    import compat
    from reid.deploy import format_of, load_engine
    from reid.evaluation import format_results_table, save_rank_lists

    engine = engine or (format_of(model_path) if model_path else "eager")
    model = load_engine(cfg, engine, model_path)
    print("backend %(backend)s (%(torch_api)s %(torch_api_version)s on %(framework)s %(framework_version)s), "
          "device %(device)s" % compat.info())
    print("weights %s" % cfg.MODEL.WEIGHTS if engine == "eager" else "model %s (engine %s)" % (model_path, engine))
    evaluate_fn = build_evaluate_fn(cfg)
    results, details = evaluate_fn(model, return_details=True)
    out_dir = os.path.join(cfg.OUTPUT_DIR, "eval")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"weights": cfg.MODEL.WEIGHTS, "backend": compat.BACKEND, "engine": engine, "model": model_path,
                   "results": results}, fh, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    print(format_results_table(results))
    print("results written to %s" % path)
    if vis_rank > 0:
        for name, (distmat, qrec, grec) in details.items():
            written = save_rank_lists(os.path.join(out_dir, "rank_lists", name), distmat, qrec, grec, topk=10,
                                      num_queries=vis_rank)
            print("%d rank lists written to %s" % (len(written), os.path.dirname(written[0]) if written else out_dir))
    return results
