#!/usr/bin/env python
"""Index a folder of person crops: the features of every image under it, in one file tools/search.py searches.

    python tools/index.py --gallery DIR --output gallery.npz \\
        --config-file output/synthetic/acl/config.yaml MODEL.WEIGHTS output/synthetic/acl/model_final.pth
    python tools/index.py --gallery DIR --output gallery.npz --model deploy/acl.onnx

The folder is walked recursively (hidden files left out). Person and camera ids come from Market-1501-style
names (0002_c3s1_000451_01.jpg: person 2, camera 3), or from --labels CSV (header path,pid,camid; paths
relative to the CSV's folder, as a custom dataset's list: docs/datasets.md). Running it
again on the same --output updates the index: only new and changed images are extracted, removed ones are
dropped. Files that are not images, and images that cannot be read, are skipped and counted (--strict: an
error). The file is replaced atomically: an interrupted run leaves the previous index as it was.

    python tools/index.py --gallery DIR --store milvus:gallery.db ...            # Milvus Lite (embedded)
    python tools/index.py --gallery DIR --store milvus://HOST:19530/gallery ...  # a Milvus server
    python tools/index.py --gallery DIR --output gallery.npz --nproc 2 ...       # extraction in 2 processes

--store puts the index in a Milvus collection instead (updated the same way: new and changed images upserted,
removed ones deleted); --nproc N (--nnodes, --node-rank, --master-addr, --master-port, as train.py) spreads
the extraction over N processes on the training launchers, and gives the same index.
Format, engines and speed: docs/retrieval.md; the Milvus store: docs/milvus.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.deploy.commands import add_model_args, build_extractor, parse, plural  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gallery", required=True, metavar="DIR", help="folder of gallery images (walked recursively)")
    p.add_argument("--output", default=None, metavar="FILE", help="the index file to write or update (.npz)")
    p.add_argument("--store", default="npz", metavar="STORE",
                   help="npz (default: the --output file), milvus:PATH.db (Milvus Lite) or "
                        "milvus://HOST:PORT[/COLLECTION] (a Milvus server): docs/milvus.md")
    milvus = p.add_argument_group("Milvus vector index (made with the collection; given again on an update, it "
                                  "replaces the collection's)")
    milvus.add_argument("--milvus-index", choices=("flat", "ivf", "hnsw"), default=None,
                        help="flat: exact search (the default for a new collection); ivf: IVF_FLAT (--nlist); "
                             "hnsw: HNSW (--hnsw-m, --hnsw-ef-construction)")
    milvus.add_argument("--nlist", type=int, default=None, metavar="N", help="IVF clusters (default sqrt(images))")
    milvus.add_argument("--hnsw-m", type=int, default=16, metavar="M", help="HNSW links per node (default 16)")
    milvus.add_argument("--hnsw-ef-construction", type=int, default=200, metavar="EF",
                        help="HNSW candidates while building (default 200)")
    dist = p.add_argument_group("sharded extraction, on the launchers of data-parallel training "
                                "(docs/retrieval.md#sharded-extraction)")
    dist.add_argument("--nproc", type=int, default=1, metavar="N", help="extraction processes on this machine")
    dist.add_argument("--nnodes", type=int, default=1, metavar="M", help="machines in the run (default 1)")
    dist.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's index, 0..M-1")
    dist.add_argument("--master-addr", default="127.0.0.1", metavar="HOST", help="address of node 0")
    dist.add_argument("--master-port", type=int, default=29500, metavar="PORT", help="its port (default 29500)")
    p.add_argument("--labels", default=None, metavar="CSV",
                   help="person / camera ids from a CSV with the header path,pid,camid (paths relative to the "
                        "CSV's folder) instead of the file names")
    p.add_argument("--float16", action="store_true", help="store the features as float16 (half the size)")
    p.add_argument("--rebuild", action="store_true",
                   help="index every image afresh, ignoring an existing --output (also: after changing the model)")
    p.add_argument("--strict", action="store_true",
                   help="a file that is not an image or an image that cannot be read is an error, not a skip")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_args(p, "--model or the config picks the engine")
    return p


def store_of(args):
    """The StoreSpec the arguments name: --output FILE (.npz) or --store milvus:..., not both (and the other
    arguments' checks that need no model)."""
    from compat.errors import UserError
    from reid.deploy.milvus_store import parse_store
    if args.nproc < 1 or args.nnodes < 1:
        raise UserError("--nproc and --nnodes must be at least 1, got %d and %d" % (args.nproc, args.nnodes))
    spec = parse_store(args.store)
    if spec.kind == "npz" and not args.output:
        raise UserError("give the index to write: --output FILE.npz, or --store milvus:PATH.db / "
                        "milvus://HOST:PORT[/COLLECTION]")
    if spec.kind != "npz":
        if args.output:
            raise UserError("--output %s and --store %s name two indexes; give one of them" % (args.output, spec))
        if args.float16:
            raise UserError("a Milvus collection holds float32 vectors; leave out --float16")
    elif args.milvus_index:
        raise UserError("--milvus-index is for a Milvus store (--store milvus:...); leave it out for an .npz index")
    return spec


def unchanged(args, spec):
    """What a failed sharded run left: the index as it was."""
    if spec.kind == "npz":
        return ("%s is as it was" % args.output if os.path.exists(args.output)
                else "no index was written to %s" % args.output)
    return ("%s is as it was (rank 0 writes only once every shard is in; an interrupted write completes when "
            "run again)" % spec)


def milvus_index_params(args):
    if args.milvus_index == "ivf":
        return {"nlist": args.nlist} if args.nlist else None
    if args.milvus_index == "hnsw":
        return {"M": args.hnsw_m, "efConstruction": args.hnsw_ef_construction}
    return None


def main(argv=None):
    args = parse(build_parser(), argv)
    from reid.deploy.sharded import ShardRun, join, launch_index, shard_folder
    from reid.engine.distributed import launched_rank
    spec = store_of(args)
    folder = shard_folder(args.output, spec)
    if args.nproc * args.nnodes > 1 and not launched_rank():
        launch_index(__file__, argv, args, folder, lambda: unchanged(args, spec))
        return
    group = join()
    run = ShardRun(group, folder) if group is not None and group.world_size > 1 else None
    if run is not None and not group.is_main:
        run.work(build_extractor(args, progress=False), args.strict)
        leave()
        return
    from reid.deploy.gallery import read_labels
    labels = read_labels(args.labels, args.gallery) if args.labels else None
    if spec.kind == "npz":
        index_npz(args, labels, run)
    else:
        index_milvus(args, spec, labels, run)
    if run is not None:
        run.finish()
        leave()


def leave():
    """A rank of a MindSpore cluster ends here, its work done (compat.distributed.leave says why)."""
    import compat
    compat.distributed.leave()


def _extract(args, extractor, plan, run):
    from reid.deploy.gallery import extract_planned
    if run is not None:
        return run.extract(extractor, plan, args.strict, progress=not args.no_progress)
    return extract_planned(extractor, plan.root, plan.todo, args.strict, progress=not args.no_progress)


def index_npz(args, labels, run):
    from reid.deploy.gallery import UNKNOWN, assemble_index, load_index, plan_update, save_index, scan_gallery
    dtype = "float16" if args.float16 else "float32"
    previous = None
    if os.path.exists(args.output) and not args.rebuild:
        previous = load_index(args.output)
    scan = scan_gallery(args.gallery, args.strict)     # the folder's problems before the model is built
    extractor = build_extractor(args, progress=not args.no_progress)
    reuse = previous is not None and str(previous.features.dtype) == dtype
    plan = plan_update(extractor, args.gallery, previous, args.strict, reuse, args.output, scan)
    extracted, problems = _extract(args, extractor, plan, run)
    index, report = assemble_index(plan, extracted, problems, labels, dtype)
    save_index(index, args.output)
    known = int((index.pids != UNKNOWN).sum())
    print("wrote %s: %s, feature size %d (%s), engine %s; %d extracted, %d unchanged, %d removed; ids known "
          "for %d" % (args.output, plural(report["images"], "image"), index.features.shape[1], index.features.dtype,
                      extractor.engine, report["extracted"], report["reused"], report["removed"], known))
    print_skips(report, "all listed in the index's meta")


def index_milvus(args, spec, labels, run):
    from reid.deploy.gallery import plan_update, scan_gallery
    from reid.deploy.milvus_store import open_store, write_plan
    with open_store(spec) as gallery:
        previous = None
        if gallery.exists():
            gallery.meta                   # a collection that is not an acl-reid index is never overwritten
            if not args.rebuild:
                previous = gallery.previous()
        scan = scan_gallery(args.gallery, args.strict)
        extractor = build_extractor(args, progress=not args.no_progress)
        where = "collection %s of %s" % (gallery.name, spec)
        plan = plan_update(extractor, args.gallery, previous, args.strict, True, where, scan)
        extracted, problems = _extract(args, extractor, plan, run)
        report = write_plan(gallery, plan, extracted, problems, labels, args.milvus_index, milvus_index_params(args),
                            progress=not args.no_progress)
        kind, params = gallery.index_info()
        known = gallery.count_known()
        print("wrote %s: %s, feature size %d (float32), %s index%s, engine %s; %d extracted, %d unchanged, "
              "%d removed; ids known for %d" % (
                  where, plural(report["images"], "image"), gallery.meta["feature_size"], kind.upper(),
                  "".join(" %s %d" % kv for kv in sorted(params.items())), extractor.engine, report["extracted"],
                  report["reused"], report["removed"], known))
    print_skips(report, "the next run tries them again")


def print_skips(report, where):
    if report["non_images"]:
        n = len(report["non_images"])
        print("skipped %s that %s, e.g. %s" % (plural(n, "file"), "is not an image" if n == 1 else "are not images",
                                             report["non_images"][0]))
    if report["skipped"]:
        n = len(report["skipped"])
        print("skipped %s that cannot be read, e.g. %s: %s (%s)"
              % (plural(n, "image"), report["skipped"][0][0], report["skipped"][0][1], where))


if __name__ == "__main__":
    main()
