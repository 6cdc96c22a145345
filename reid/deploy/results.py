"""What tools/search.py writes and shows, apart from the search: the names of its result files, which queries
--vis draws, and the names in its summary table."""
import os

from reid.errors import UserError
from reid.deploy.commands import plural

OUTPUT_SUFFIXES = (".json", ".csv")
VIS_COUNT = 10


def output_paths(output):
    """(FILE.json, FILE.csv) of --output FILE.json or FILE.csv; another suffix is an error."""
    stem, suffix = os.path.splitext(output)
    if suffix.lower() not in OUTPUT_SUFFIXES:
        raise UserError("--output %s: name the results FILE.json or FILE.csv (both are written: the JSON lists and "
                        "the CSV rows)" % output)
    given = {suffix.lower(): output}
    return given.get(".json", stem + ".json"), given.get(".csv", stem + ".csv")


def vis_choice(args):
    """What --vis draws: ("first", N) or ("named", [numbers or names]); checked before any model work."""
    if args.vis_queries is not None and not args.vis:
        raise UserError("--vis-queries picks the queries --vis draws; add --vis DIR")
    if args.vis_queries is None:
        return "first", VIS_COUNT if args.vis_count is None else args.vis_count
    if args.vis_count is not None:
        raise UserError("give --vis-count (the first N queries) or --vis-queries (these), not both")
    picks = []
    for item in (x.strip() for x in args.vis_queries.split(",")):
        bounds = item.split("-") if item.replace("-", "").isdigit() else None
        if bounds and len(bounds) == 2 and all(bounds) and int(bounds[0]) <= int(bounds[1]):
            picks += list(range(int(bounds[0]), int(bounds[1]) + 1))
        elif item.isdigit():
            picks.append(int(item))
        elif item and not bounds:
            picks.append(item)
        else:
            raise UserError("--vis-queries %s: %r is neither a query number, a range a-b nor a file name"
                            % (args.vis_queries, item))
    return "named", picks


def resolve_vis(choice, files):
    """The positions in `files` ([(path, relative path)]) of the queries --vis draws, ascending."""
    how, picks = choice
    if how == "first":
        return list(range(min(picks, len(files))))
    chosen = []
    for pick in picks:
        if isinstance(pick, int):
            if pick >= len(files):
                raise UserError("--vis-queries %d: there are %s (0-%d)" % (pick, plural(len(files), "query",
                                                                                         "queries"), len(files) - 1))
            found = [pick]
        else:
            found = [i for i, (path, rel) in enumerate(files) if pick in (path, rel, os.path.basename(path))]
            if not found:
                raise UserError("--vis-queries: no query is named %s; give a file name of the queries or a number"
                                % pick)
        chosen += found
    return sorted(set(chosen))


def runs(numbers):
    """'0-9, 12' for [0, ..., 9, 12]."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(n) if n == start else "%d-%d" % (start, n))
            start = None
    return ", ".join(parts)


def fit(name, width, pad=True):
    """`name` in `width` characters: long ones keep their start and their end (where the ids and the suffix are)."""
    if len(name) > width:
        tail = (width - 3) // 2
        name = name[:width - 3 - tail] + "..." + name[-tail:]
    return name.ljust(width) if pad else name
