#!/usr/bin/env python
"""Serve a gallery index (tools/index.py) over HTTP: a search API and a web page to drop a person crop on.

    python tools/serve.py --index gallery.npz                       # http://127.0.0.1:8000/
    python tools/serve.py --store milvus:gallery.db --port 8080
    python tools/serve.py --index gallery.npz --host 0.0.0.0 --token SECRET

The model is the one the index records (or the one given, which must be the same, as tools/search.py).
POST /api/search takes an image (multipart field `image`) and answers the JSON of one tools/search.py result,
each match with its gallery id; GET /api/gallery/ID/image, /api/summary, /api/health, /api/openapi.json.
Requests that arrive together share one extraction (--batch images at most, gathered for --batch-window-ms).
An index file replaced on disk (tools/index.py run again) is loaded without a restart; a damaged replacement
leaves the loaded one serving. Binding an address other than loopback needs an access token (--token or
$ACL_REID_TOKEN), which every /api/ request but the health check must then send (Authorization: Bearer TOKEN).
SIGTERM (or Ctrl-C) lets requests in flight finish, then exits 0.
Details: docs/serving.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.deploy.commands import add_index_args, add_model_args, at_least, build_extractor, parse  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_index_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, printed)")
    p.add_argument("--token", default=None,
                   help="access token the /api/ requests must send (default $ACL_REID_TOKEN); needed to bind an "
                        "address other than loopback")
    p.add_argument("--gallery", default=None, metavar="DIR",
                   help="where the gallery images are now, if the folder moved since indexing")
    p.add_argument("--max-upload-mb", type=float, default=10, metavar="MB", help="largest upload (default 10)")
    p.add_argument("--max-pixels", type=int, default=40_000_000, metavar="N",
                   help="largest image in pixels, read from its header before decoding (default 40000000)")
    p.add_argument("--max-topk", type=int, default=100, metavar="K", help="largest topk a request may ask (100)")
    p.add_argument("--batch-window-ms", type=float, default=10, metavar="MS",
                   help="how long the first queued request waits for others to share its extraction (default 10)")
    p.add_argument("--reload-interval", type=float, default=2, metavar="S",
                   help="seconds between checks for a replaced index file (default 2; 0: never)")
    p.add_argument("--nlist", type=int, default=None, help="faiss-ivf clusters (default sqrt(gallery size))")
    p.add_argument("--nprobe", type=int, default=16, help="Milvus IVF clusters searched per query (default 16)")
    p.add_argument("--ef", type=int, default=64, help="Milvus HNSW candidates per query (default 64)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="server log level (default info: one line per request)")
    add_model_args(p, "default: the model the index records; --batch is the largest batch of queued requests")
    return p


def settings_of(args):
    """ServeSettings of the arguments, every check that needs no model made."""
    from compat.errors import UserError
    from reid.deploy.server import TOKEN_ENV, ServeSettings, is_loopback
    at_least("--max-topk", args.max_topk, 1)
    at_least("--max-pixels", args.max_pixels, 1)
    if not 0 <= args.port <= 65535:
        raise UserError("--port must be in 0..65535, got %d" % args.port)
    if args.max_upload_mb <= 0 or args.batch_window_ms < 0 or args.reload_interval < 0:
        raise UserError("--max-upload-mb must be positive, --batch-window-ms and --reload-interval at least 0")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and not token:
        raise UserError("binding %s lets other machines in: give an access token with --token TOKEN (or the %s "
                        "environment variable), or bind 127.0.0.1" % (args.host, TOKEN_ENV))
    from reid.deploy.milvus_store import parse_store
    spec = parse_store(args.store)
    if spec.kind == "npz" and not args.index:
        raise UserError("give the gallery index: --index FILE.npz, or --store milvus:PATH.db / "
                        "milvus://HOST:PORT[/COLLECTION]")
    if spec.kind != "npz" and args.index:
        raise UserError("--index %s and --store %s name two indexes; give one of them" % (args.index, spec))
    if spec.kind == "npz" and not os.path.isfile(args.index):
        raise UserError("index file %s does not exist; write it with tools/index.py --gallery DIR --output %s"
                        % (args.index, args.index))
    return ServeSettings(index=args.index, store=args.store, gallery_root=os.path.abspath(args.gallery)
                         if args.gallery else None, token=token, max_upload=int(args.max_upload_mb * 1024 * 1024),
                         max_pixels=args.max_pixels, max_topk=args.max_topk, max_batch=args.batch,
                         window_s=args.batch_window_ms / 1000.0, reload_s=args.reload_interval, nprobe=args.nprobe,
                         ef=args.ef, nlist=args.nlist)


def recorded_source(settings):
    """The model source the index records (what builds the extractor when no model is given)."""
    from reid.deploy.gallery import load_index
    from reid.deploy.milvus_store import open_gallery, parse_store
    spec = parse_store(settings.store)
    if spec.kind == "npz":
        return load_index(settings.index).model.get("source") or {}
    with open_gallery(spec) as gallery:
        return gallery.model.get("source") or {}


def main(argv=None):
    args = parse(build_parser(), argv)
    from reid.deploy.server import require_web, run_server
    require_web()
    settings = settings_of(args)
    source = recorded_source(settings) if settings.store in (None, "", "npz") else None

    def extractor():
        src = source if source is not None else recorded_source(settings)
        return build_extractor(args, progress=False, source=src)
    return run_server(settings, extractor, args.host, args.port, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
