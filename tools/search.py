#!/usr/bin/env python
"""Search a gallery index (tools/index.py) for query images: ranked lists as JSON and CSV, a short table,
and rank-list pictures.

    python tools/search.py --index gallery.npz --query person.jpg --topk 10 --output results.json
    python tools/search.py --index gallery.npz --query queries/ --filter protocol --vis ranks/ --output r.json
    python tools/search.py --store milvus:gallery.db --query queries/ --filter camera --output r.json

The model is the one the index was made with (the index records it), or the one given (--config-file ...
MODEL.WEIGHTS ..., --model FILE), which must be the same: features of another model or config are refused.
--output names the results: FILE.json or FILE.csv (another suffix is an error); both are written, FILE.json
[{"query": path, "matches": [{"path": ..., "score": ...}, ...]}, ...] (with pid / camid where known; "distance"
instead of "score" after --rerank; UTF-8, paths as they are) and FILE.csv query,rank,path,score.
--vis draws the rank lists of the first --vis-count queries (10), or of those --vis-queries names.
--filter camera leaves out gallery images from the query's camera; --filter protocol is test.py's evaluation
protocol (same person in the same camera and junk images left out) and prints Rank-1 when the queries' ids
are known. Ids come from Market-1501-style names or --query-labels. --store searches a Milvus collection
written by tools/index.py --store (its vector index: exact FLAT unless made otherwise; --nprobe, --ef).
Details: docs/retrieval.md; a Milvus store: docs/milvus.md.
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.deploy.commands import add_index_args, add_model_args, at_least, build_extractor, gives_model, parse, plural  # noqa: E402
from reid.deploy.results import fit, output_paths, resolve_vis, runs, vis_choice  # noqa: E402
from reid.deploy.search import FILTERS, METHODS  # noqa: E402

TABLE_ROWS = 10


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_index_args(p)
    p.add_argument("--query", required=True, nargs="+", metavar="IMAGE|DIR", help="query images or folders")
    p.add_argument("--topk", type=int, default=10, metavar="K", help="matches per query (default 10)")
    p.add_argument("--output", required=True, metavar="FILE.json",
                   help="ranked lists: FILE.json and FILE.csv, both written (give either name)")
    p.add_argument("--filter", choices=FILTERS, default="none",
                   help="none (default); camera: leave out the query's camera; protocol: test.py's protocol")
    p.add_argument("--rerank", action="store_true", help="k-reciprocal re-ranking (TEST.RERANK.K1/K2/LAMBDA)")
    p.add_argument("--aqe", action="store_true", help="average query expansion (TEST.AQE.QE_TIME/QE_K/ALPHA)")
    p.add_argument("--method", choices=METHODS, default="exact",
                   help="exact (default, numpy, bounded memory), faiss-flat (exact), faiss-ivf (approximate)")
    p.add_argument("--nlist", type=int, default=None, help="faiss-ivf clusters (default sqrt(gallery size))")
    p.add_argument("--nprobe", type=int, default=16,
                   help="faiss-ivf / Milvus IVF clusters searched per query (default 16)")
    p.add_argument("--ef", type=int, default=64, help="Milvus HNSW candidates per query (default 64, at least --topk)")
    p.add_argument("--query-labels", default=None, metavar="CSV",
                   help="query ids from a CSV with the header path,pid,camid (paths relative to the CSV's folder)")
    p.add_argument("--gallery", default=None, metavar="DIR",
                   help="where the gallery images are now, if the folder moved since indexing (paths in the index "
                        "are relative to it)")
    p.add_argument("--vis", default=None, metavar="DIR", help="write rank-list PNGs here")
    p.add_argument("--vis-count", type=int, default=None, metavar="N",
                   help="--vis draws the first N queries (default 10)")
    p.add_argument("--vis-queries", default=None, metavar="LIST",
                   help="--vis draws these queries instead, comma-separated: numbers from 0 in the order the "
                        "queries are given (a folder's images sorted; ranges a-b), or file names")
    p.add_argument("--strict", action="store_true", help="a query file that cannot be read is an error, not a skip")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_args(p, "default: the model the index records")
    return p


def query_files(items, strict):
    """[(path as given, path relative to its folder)], [non-image files]."""
    from compat.errors import UserError
    from reid.deploy.extractor import list_image_files
    files, others = [], []
    for item in items:
        if os.path.isdir(item):
            images, other = list_image_files(item)
            if not images:
                raise UserError("query folder %s holds no images%s; give a folder of query images" % (
                    item, " (only %d other file(s))" % len(other) if other else ""))
            files += [(os.path.join(item, rel), rel.replace(os.sep, "/")) for rel in images]
            others += [os.path.join(item, rel) for rel in other]
        elif os.path.exists(item):
            files.append((item, os.path.basename(item)))
        else:
            raise UserError("query %s does not exist; give image files or folders" % item)
    if strict and others:
        raise UserError("%d query file(s) are not images (%s); remove them or leave out --strict" % (
            len(others), others[0]))
    return files, others


def check_args(args):
    """Every check of the arguments that needs no model, before the model is built and queries extracted."""
    at_least("--topk", args.topk, 1)
    at_least("--nprobe", args.nprobe, 1)
    at_least("--nlist", args.nlist, 1)
    at_least("--vis-count", args.vis_count, 1)
    return output_paths(args.output), vis_choice(args)


def write_results(paths, results, kind):
    from reid.engine.launch import write_json
    path, csv_path = paths
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    write_json(path, results, sort_keys=False)
    with open(csv_path + ".tmp", "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["query", "rank", "path", kind])
        for row in results:
            for rank, match in enumerate(row["matches"], 1):
                out.writerow([row["query"], rank, match["path"], "%.6f" % match[kind]])
    os.replace(csv_path + ".tmp", csv_path)


def main(argv=None):
    args = parse(build_parser(), argv)
    outputs, vis = check_args(args)
    from compat.errors import UserError
    from reid.config import load_cfg
    from reid.deploy.gallery import UNKNOWN, check_same_model, labels_for, load_index, read_labels
    from reid.deploy.milvus_store import open_gallery, parse_store
    from reid.deploy.search import exclusion, rank1_from_lists, rank_gallery
    from reid.evaluation import options_from_cfg
    from reid.evaluation.visualize import write_rank_list

    spec = parse_store(args.store)
    if spec.kind == "npz":
        if not args.index:
            raise UserError("give the gallery index: --index FILE.npz, or --store milvus:PATH.db / "
                            "milvus://HOST:PORT[/COLLECTION]")
        index, gallery, name = load_index(args.index), None, args.index
        model = index.model
    else:
        if args.index:
            raise UserError("--index %s and --store %s name two indexes; give one of them" % (args.index, spec))
        if args.rerank or args.aqe or args.method != "exact":
            raise UserError("a Milvus store is searched by its own vector index (tools/index.py --milvus-index); "
                            "--rerank, --aqe and --method faiss-* run on an .npz index (--index FILE)")
        gallery = open_gallery(spec)
        index, name, model = None, "collection %s of %s" % (gallery.name, spec), gallery.model
    try:     # a Milvus store is closed on every error (its process ended, a Milvus Lite file free again)
        source = model.get("source") or {}
        files, others = query_files(args.query, args.strict)
        vis_files = resolve_vis(vis, files) if args.vis else []
        query_labels = read_labels(args.query_labels) if args.query_labels else None   # keyed by absolute path
        extractor = build_extractor(args, progress=not args.no_progress, source=source)
        fix = ("search with the model the index was made with (leave out the model arguments), or index the gallery "
               "with this one (tools/index.py --rebuild)")
        check_same_model(name, model, extractor.describe(), fix)
        features, kept, problems = extractor.extract_files([f for f, _ in files], "stop" if args.strict else "skip")
        if not kept:
            raise UserError("none of the %d query images could be read (first: %s: %s)" % (len(files), *problems[0]))
        check_same_model(name, model, extractor.describe(), fix)
        files = [files[i] for i in kept]
        searched = {f: row for row, f in enumerate(kept)}
        vis_rows = [searched[f] for f in vis_files if f in searched]    # unreadable queries are not searched
        q_pids, q_camids = labels_for([os.path.abspath(f) if query_labels is not None else rel for f, rel in files],
                                      query_labels)

        cameras = (index.camids != UNKNOWN).any() if index is not None else gallery.has_cameras()
        if args.filter != "none" and not cameras:
            raise UserError("--filter %s needs camera ids, and the index has none (Market-1501-style names, or "
                            "tools/index.py --labels); search without --filter" % args.filter)
    except BaseException:
        if gallery is not None:
            gallery.close()
        raise
    rank1 = None
    if index is not None:
        root = os.path.abspath(args.gallery) if args.gallery else index.root
        exclude = exclusion(args.filter, q_pids, q_camids, index.pids, index.camids)
        if gives_model(args):
            config_file, opts = args.config_file or None, list(args.opts)
        else:
            config_file, opts = source.get("config_file"), list(source.get("opts") or []) + list(args.opts)
        opts += ["TEST.RERANK.ENABLED", "True"] if args.rerank else []
        opts += ["TEST.AQE.ENABLED", "True"] if args.aqe else []
        options = options_from_cfg(load_cfg(config_file, opts))
        ranked = rank_gallery(features, index.features, args.topk, exclude, args.method, options["rerank"],
                              options["aqe"], args.nlist, args.nprobe)
        kind = ranked["value"]
        lists = [[index.record(j, root) + (float(v),) for j, v in zip(idx, values) if j >= 0]
                 for idx, values in zip(ranked["indices"], ranked["values"])]
        if args.filter == "protocol":
            rank1 = rank1_from_lists(ranked["indices"], q_pids, index.pids, q_camids, index.camids)
        method = args.method + (", re-ranked" if options["rerank"] else "") + (
            ", query expansion" if options["aqe"] else "")
        size = len(index)
    else:
        with gallery:
            root = os.path.abspath(args.gallery) if args.gallery else gallery.root
            hits = gallery.search(features, args.topk, args.filter, q_pids, q_camids, args.nprobe, args.ef)
            kind = "score"
            lists = [[(os.path.join(root, *rel.split("/")), pid, camid, score)
                      for rel, score, pid, camid in row] for row in hits]
            if args.filter == "protocol":
                rank1 = gallery.rank1(hits, q_pids, q_camids)
            method = "Milvus %s" % gallery.index_info()[0].upper()
            size = gallery.count()

    results = []
    for q, ((path, _), matches) in enumerate(zip(files, lists)):
        entry = {"query": path}
        for key, ids in (("pid", q_pids), ("camid", q_camids)):
            if ids[q] != UNKNOWN:
                entry[key] = int(ids[q])
        entry["matches"] = []
        for path, pid, camid, v in matches:
            match = {"path": path, kind: round(float(v), 6)}
            match.update({k: val for k, val in (("pid", pid), ("camid", camid)) if val is not None})
            entry["matches"].append(match)
        results.append(entry)
    write_results(outputs, results, kind)

    print("%s searched in %s (%s, filter %s), engine %s" % (
        plural(len(results), "query", "queries"), plural(size, "gallery image"), method, args.filter,
        extractor.engine))
    for entry in results[:TABLE_ROWS]:
        best = "  ".join("%s %.3f" % (fit(os.path.basename(m["path"]), 32, pad=False), m[kind])
                         for m in entry["matches"][:3])
        print("  %s %s" % (fit(os.path.basename(entry["query"]), 32), best or "(no match left)"))
    if len(results) > TABLE_ROWS:
        print("  ... %d more in %s" % (len(results) - TABLE_ROWS, outputs[0]))
    if problems or others:
        first = "%s: %s" % problems[0] if problems else "%s: not an image" % others[0]
        print("skipped %s, e.g. %s" % (plural(len(problems) + len(others), "query file"), first))
    if rank1 is not None:
        rank1, counted = rank1
        if counted:
            print("Rank-1 from the file names: %.1f%% over %d queries with a match in another camera"
                  % (rank1, counted))
    print("wrote %s and %s" % outputs)
    if args.vis:
        os.makedirs(args.vis, exist_ok=True)
        for q in vis_rows:
            entry = results[q]
            missing = [m["path"] for m in entry["matches"] if not os.path.exists(m["path"])]
            if missing:
                raise UserError("gallery image %s does not exist: the gallery moved since indexing? give its folder "
                                "with --gallery DIR" % missing[0])
            records = [(m["path"], m.get("pid"), m.get("camid")) for m in entry["matches"]]
            name = "rank_%05d_%s.png" % (q, os.path.splitext(os.path.basename(entry["query"]))[0])
            write_rank_list(os.path.join(args.vis, name), (entry["query"], entry.get("pid"), entry.get("camid")),
                            records, [m[kind] for m in entry["matches"]])
        how = "the first %d; --vis-queries picks others" % vis[1] if vis[0] == "first" else "--vis-queries"
        print("%s written to %s: queries %s (%s)" % (plural(len(vis_rows), "rank list"), args.vis,
                                                     runs(vis_rows) or "none", how))


if __name__ == "__main__":
    main()
