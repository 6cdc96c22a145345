"""What train.py and test.py do, as functions: command-line parsing shared by both, config setup, the
training run, and evaluation on the configured target domains."""
import argparse
import faulthandler
import json
import os
import sys

from reid.runtime import configure_runtime

DEFAULT_MAX_RESTARTS = 3


def build_parser(description, training):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default="", metavar="FILE", help="yacs config (see configs/)")
    p.add_argument("--backend", choices=("mindspore", "torch"), default=None,
                   help="framework under the torch API (default: $REID_BACKEND or mindspore)")
    p.add_argument("--device", default=None, help="cpu | gpu | ascend (sets MODEL.DEVICE)")
    p.add_argument("--help-config", action="store_true", help="print every config key with its default and exit")
    p.add_argument("--reference", choices=("histogram",), default=None,
                   help="also evaluate a hand-crafted reference on the targets (sets TEST.REFERENCE)")
    if training:
        p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/last_checkpoint")
        p.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS, metavar="N",
                       help="train in a child process and, when it is killed by a crash signal (SIGSEGV, "
                            "SIGKILL, ...), resume it from the last checkpoint, at most N times; 0: train in this "
                            "process, no restarts (default %(default)s)")
        dist = p.add_argument_group("data-parallel training (docs/architecture.md#data-parallel-training)")
        dist.add_argument("--nproc", type=int, default=1, metavar="N",
                          help="training processes on this machine, one rank each, on the backend's own launcher "
                               "(torchrun / MindSpore's scheduler + workers); batch sizes are the whole run's")
        dist.add_argument("--nnodes", type=int, default=1, metavar="M", help="machines in the run (default 1)")
        dist.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's index, 0..M-1")
        dist.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                          help="address of node 0 (torch's rendezvous / MindSpore's scheduler; default 127.0.0.1)")
        dist.add_argument("--master-port", type=int, default=29500, metavar="PORT", help="its port (default 29500)")
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
    # A crash in the framework's native code (docs/limitations.md) then still prints the Python stack;
    # train.py's supervisor (--max-restarts) resumes from the last checkpoint.
    faulthandler.enable()
    args = build_parser(description, training).parse_intermixed_args(argv)
    if training and args.max_restarts < 0:
        from reid.errors import UserError
        raise UserError("--max-restarts must be 0 (no supervision) or more; got %d" % args.max_restarts)
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
    if getattr(args, "reference", None):
        opts += ["TEST.REFERENCE", args.reference]
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


def check_reference(cfg):
    """Fail before any work when TEST.REFERENCE names no known reference."""
    from reid.errors import UserError
    from reid.evaluation import REFERENCES
    if cfg.TEST.REFERENCE and cfg.TEST.REFERENCE not in REFERENCES:
        raise UserError("TEST.REFERENCE must be one of %s or empty, got %r" % (", ".join(REFERENCES),
                                                                            cfg.TEST.REFERENCE))


def reference_results(cfg):
    """{dataset: metrics} of the hand-crafted reference named by TEST.REFERENCE on DATASETS.TESTS, or None."""
    from reid.data.datasets import build_test_set
    from reid.data.transforms import build_transforms
    from reid.evaluation import evaluate_histogram, options_from_cfg

    check_reference(cfg)
    if not cfg.TEST.REFERENCE:
        return None
    transform = build_transforms(cfg, is_train=False)   # the histogram sees the network's input pixels
    options = options_from_cfg(cfg)
    return {name: evaluate_histogram(*build_test_set(name, cfg), transform=transform, **options)
            for name in cfg.DATASETS.TESTS}


REFERENCE_LABELS = {"histogram": "colour histogram"}


def reference_rows(cfg, reference, evaluated=None, label=None):
    """Rows for format_rows_table: the reference, then (if given) the evaluated network."""
    rows = [{"name": REFERENCE_LABELS.get(cfg.TEST.REFERENCE, cfg.TEST.REFERENCE), "iteration": None,
             "results": reference}]
    if evaluated is not None:
        rows.append({"name": label, "iteration": None, "results": evaluated})
    return rows


def write_json(path, data, sort_keys=True):
    """Atomic write of a JSON file (a crash leaves the old file or the new one, never half of one); UTF-8, with
    non-ASCII characters (paths) as they are, not escaped."""
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=sort_keys, ensure_ascii=False)
    os.replace(path + ".tmp", path)


def add_to_results_json(path, extra):
    """Add keys to a results.json written by the evaluation (read, update, atomic rewrite)."""
    data = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    data.update(extra)
    write_json(path, data)


def write_config(cfg):
    os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
    path = os.path.join(cfg.OUTPUT_DIR, "config.yaml")
    with open(path + ".tmp", "w") as fh:
        fh.write(cfg.dump())
    os.replace(path + ".tmp", path)
    return path


def supervise_training(script, argv, cfg, args):
    """Run `script` (train.py, or the module reid.cli.train) with the same arguments in a supervised child
    process (--max-restarts); returns the exit status."""
    from reid.engine.distributed import python_command
    from reid.engine.supervisor import supervise
    argv = list(sys.argv[1:] if argv is None else argv)
    command = python_command(script) + argv + ["--max-restarts", "0"]
    return supervise(command, cfg.OUTPUT_DIR, args.max_restarts, resume=args.resume)


def launch_distributed(script, argv, cfg, args):
    """train.py --nproc N (--nnodes ...): start the ranks on the backend's launcher; returns the exit status."""
    import compat.backend
    from reid.engine.distributed import launch
    argv = list(sys.argv[1:] if argv is None else argv)
    return launch(script, argv, compat.backend.requested_backend(), args.nproc, args.nnodes, args.node_rank,
                  args.master_addr, args.master_port, output_dir=cfg.OUTPUT_DIR)


def backend_line():
    """The run's first line: backend, torch-API layer, framework, device."""
    import compat
    return ("backend %(backend)s (%(torch_api)s %(torch_api_version)s on %(framework)s %(framework_version)s), "
            "device %(device)s" % compat.info())


def train(cfg, resume=False, progress=True):
    """Train as configured, evaluating on the targets; returns the trainer. The evaluations (untrained,
    last, best) are the rows of its Evaluator hook, also in OUTPUT_DIR/results.json. In a data-parallel
    run (train.py --nproc) every rank trains and rank 0 alone logs, evaluates and writes checkpoints."""
    import compat
    from reid.engine.hooks import Evaluator
    from reid.engine.trainer import Trainer
    from reid.evaluation import format_rows_table

    check_reference(cfg)
    compat.set_device(cfg.MODEL.DEVICE)
    configure_runtime(cfg)
    group = compat.distributed.init(cfg.MODEL.DEVICE)
    trainer = Trainer(cfg, resume=resume, quiet=not group.is_main)
    if not group.is_main:
        trainer.train()
        group.shutdown()
        return trainer
    cfg = trainer.cfg  # now carries the class counts of the training data
    write_config(cfg)
    print(backend_line())
    print(trainer.data.train_set.summary())
    print("%d iterations (%d epochs x %d), output in %s" % (trainer.max_iter, cfg.SOLVER.MAX_EPOCH,
                                                             trainer.iters_per_epoch, cfg.OUTPUT_DIR))
    if group.world_size > 1:
        print("data parallel: %d processes, %d images per process per basic step" % (
            group.world_size, cfg.SOLVER.IMS_PER_BATCH // group.world_size))
    evaluate_fn = build_evaluate_fn(cfg) if len(cfg.DATASETS.TESTS) else None
    hooks = trainer.build_hooks(evaluate_fn, progress=progress)
    evaluator = next((h for h in hooks if isinstance(h, Evaluator)), None)
    reference = reference_results(cfg) if evaluator is not None else None
    if reference:   # a row of the evaluator's table and results.json, between 'untrained' and 'last'
        evaluator.extra_rows.extend(reference_rows(cfg, reference))
    trainer.register_hooks(hooks)
    trainer.train()
    if evaluator is not None and evaluator.best is not None:
        print("target-domain evaluation (best: highest (mAP + Rank-1) / 2 on the targets, weights in %s):"
              % os.path.join(cfg.OUTPUT_DIR, evaluator.best["weights"]))
        print(format_rows_table(evaluator.rows()))
        if reference:
            add_to_results_json(os.path.join(cfg.OUTPUT_DIR, "results.json"),
                                {"references": {cfg.TEST.REFERENCE: reference}})
    group.shutdown()
    return trainer


def test(cfg, vis_rank=0, reference_only=False, engine=None, model_path=None):
    """Evaluate MODEL.WEIGHTS (engine 'eager') or the exported file `model_path` (engine 'onnx' / 'mindir', by
    default the file's suffix) on DATASETS.TESTS; print the table, write OUTPUT_DIR/eval/results.json and,
    with vis_rank > 0, rank-list PNGs under OUTPUT_DIR/eval/rank_lists/<dataset>/. With TEST.REFERENCE the
    reference is evaluated too; ``reference_only`` (test.py --reference without MODEL.WEIGHTS or a model
    file) evaluates only the reference."""
    import compat
    from reid.deploy import format_of, load_engine
    from reid.evaluation import format_results_table, format_rows_table, save_rank_lists

    check_reference(cfg)
    out_dir = os.path.join(cfg.OUTPUT_DIR, "eval")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    if reference_only and not cfg.MODEL.WEIGHTS and not model_path:
        # the reference alone needs no network: `test.py --reference histogram` on any target
        reference = reference_results(cfg)
        write_json(path, {"references": {cfg.TEST.REFERENCE: reference}})
        print(format_rows_table(reference_rows(cfg, reference)))
        print("results written to %s" % path)
        return reference
    engine = engine or (format_of(model_path) if model_path else "eager")
    configure_runtime(cfg)
    model = load_engine(cfg, engine, model_path)
    print(backend_line())
    print("weights %s" % cfg.MODEL.WEIGHTS if engine == "eager" else "model %s (engine %s)" % (model_path, engine))
    evaluate_fn = build_evaluate_fn(cfg)
    results, details = evaluate_fn(model, return_details=True)
    reference = reference_results(cfg)
    record = {"weights": cfg.MODEL.WEIGHTS, "backend": compat.BACKEND, "engine": engine, "model": model_path,
              "results": results}
    if reference:
        record["references"] = {cfg.TEST.REFERENCE: reference}
    write_json(path, record)
    if reference:
        label = os.path.basename(cfg.MODEL.WEIGHTS if engine == "eager" else model_path)
        print(format_rows_table(reference_rows(cfg, reference, results, label)))
    else:
        print(format_results_table(results))
    print("results written to %s" % path)
    if vis_rank > 0:
        for name, (distmat, qrec, grec) in details.items():
            written = save_rank_lists(os.path.join(out_dir, "rank_lists", name), distmat, qrec, grec, topk=10,
                                      num_queries=vis_rank)
            print("%d rank lists written to %s" % (len(written), os.path.dirname(written[0]) if written else out_dir))
    return results
