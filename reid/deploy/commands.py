"""Command-line pieces shared by tools/index.py and tools/search.py: the model arguments and the feature
extractor they describe."""
import faulthandler
import os

from reid.errors import UserError
from reid.deploy.extractor import ENGINES


def add_index_args(parser):
    """--index / --store: the gallery index a command reads (tools/search.py, tools/serve.py)."""
    parser.add_argument("--index", default=None, metavar="FILE", help="a gallery index written by tools/index.py")
    parser.add_argument("--store", default="npz", metavar="STORE",
                        help="npz (default: the --index file), or the Milvus store tools/index.py --store wrote: "
                             "milvus:PATH.db or milvus://HOST:PORT[/COLLECTION]")


def add_model_args(parser, what):
    group = parser.add_argument_group("model: a config and its weights (KEY VALUE: MODEL.WEIGHTS path), or an "
                                      "exported file; %s" % what)
    group.add_argument("--config-file", default="", metavar="FILE", help="the config the weights were trained with")
    group.add_argument("--model", default=None, metavar="FILE",
                       help="an exported .onnx / .mindir file (tools/export.py) with its sidecar FILE.json")
    group.add_argument("--engine", choices=ENGINES, default="auto",
                       help="auto (default): the fastest for what is given (docs/retrieval.md#engines)")
    group.add_argument("--backend", choices=("mindspore", "torch"), default=None,
                       help="framework that runs the model (default: $REID_BACKEND or mindspore)")
    group.add_argument("--batch", type=int, default=32, metavar="N", help="images per forward (default 32)")
    parser.add_argument("opts", nargs="*", metavar="KEY VALUE", help="config overrides, e.g. MODEL.WEIGHTS path.pth")


def parse(parser, argv):
    """Parse, check the numbers (before any model work), then select the backend before anything imports
    compat."""
    enable_faulthandler()
    args = parser.parse_intermixed_args(argv)
    at_least("--batch", args.batch, 1)
    if args.backend:
        os.environ["REID_BACKEND"] = args.backend
    return args


def enable_faulthandler():
    """A crash in the framework's native code will print the Python stack (where stderr is a file: not when a
    test has replaced it)."""
    try:
        faulthandler.enable()
    except (OSError, ValueError, AttributeError):
        pass


def at_least(flag, value, least):
    """A one-line error unless the value of `flag` is at least `least` (None: not given, fine)."""
    if value is not None and value < least:
        raise UserError("%s must be at least %d, got %d" % (flag, least, value))


def plural(count, one, many=None):
    """'1 query', '2 queries'."""
    return "%d %s" % (count, one if count == 1 else many or one + "s")


def gives_model(args):
    return bool(args.config_file or args.model or "MODEL.WEIGHTS" in args.opts[::2])


def build_extractor(args, progress, source=None):
    """The FeatureExtractor the arguments name, else the one `source` records (an index's model source)."""
    from reid.deploy.extractor import FeatureExtractor
    common = dict(engine=args.engine, batch_size=args.batch, progress=progress)
    if gives_model(args):
        return FeatureExtractor(config=args.config_file or None, model=args.model, opts=args.opts, **common)
    if not source or not (source.get("model") or source.get("opts")):
        raise UserError("no model given: add --config-file FILE MODEL.WEIGHTS path/to/model.pth, or --model "
                        "path/to/model.onnx")
    opts = list(source.get("opts") or []) + list(args.opts)
    return FeatureExtractor(config=source.get("config_file"), model=source.get("model"), opts=opts, **common)
