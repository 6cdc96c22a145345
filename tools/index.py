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
Format, engines and speed: docs/retrieval.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid.deploy.commands import add_model_args, build_extractor, parse, plural  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gallery", required=True, metavar="DIR", help="folder of gallery images (walked recursively)")
    p.add_argument("--output", required=True, metavar="FILE", help="the index file to write or update (.npz)")
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


def main(argv=None):
    args = parse(build_parser(), argv)
    from reid.deploy.gallery import UNKNOWN, build_index, load_index, read_labels, save_index, scan_gallery
    previous = None
    if os.path.exists(args.output) and not args.rebuild:
        previous = load_index(args.output)
    labels = read_labels(args.labels, args.gallery) if args.labels else None
    scan = scan_gallery(args.gallery, args.strict)     # the folder's problems before the model is built
    extractor = build_extractor(args, progress=not args.no_progress)
    index, report = build_index(extractor, args.gallery, previous, labels, strict=args.strict,
                                dtype="float16" if args.float16 else "float32", progress=not args.no_progress,
                                index_path=args.output, scan=scan)
    save_index(index, args.output)
    known = int((index.pids != UNKNOWN).sum())
    print("wrote %s: %s, feature size %d (%s), engine %s; %d extracted, %d unchanged, %d removed; ids known "
          "for %d" % (args.output, plural(report["images"], "image"), index.features.shape[1], index.features.dtype,
                      extractor.engine, report["extracted"], report["reused"], report["removed"], known))
    if report["non_images"]:
        n = len(report["non_images"])
        print("skipped %s that %s, e.g. %s" % (plural(n, "file"), "is not an image" if n == 1 else "are not images",
                                             report["non_images"][0]))
    if report["skipped"]:
        n = len(report["skipped"])
        print("skipped %s that cannot be read, e.g. %s: %s (all listed in the index's meta)"
              % (plural(n, "image"), report["skipped"][0][0], report["skipped"][0][1]))


if __name__ == "__main__":
    main()
