"""From a model (or features) to the metrics dict, and the results table printed by test.py.

Metrics dicts use the keys ``Rank-1``, ``Rank-5``, ``Rank-10``, ``mAP``, ``mINP`` in percent.
Without re-ranking, distances are computed and ranked block by block (the full query x gallery matrix is
never held, so MSMT17-scale evaluation runs in bounded memory); re-ranking needs the full matrices.
"""
import numpy as np

from reid.errors import UserError
from reid.evaluation.distance import check_metric, compute_distance, distance_blocks
from reid.evaluation.extract import extract_features
from reid.evaluation.query_expansion import aqe as average_query_expansion
from reid.evaluation.rank import RankAccumulator
from reid.evaluation.rerank import re_ranking

METRIC_KEYS = ("Rank-1", "Rank-5", "Rank-10", "mAP", "mINP")


def options_from_cfg(cfg):
    """evaluate()/evaluate_features() keyword arguments from a config's TEST section."""
    t = cfg.TEST
    return dict(metric=t.METRIC, flip=bool(t.FLIP), max_rank=int(t.MAX_RANK), use_metric_cuhk03=bool(t.METRIC_CUHK03),
                rerank=dict(k1=int(t.RERANK.K1), k2=int(t.RERANK.K2), lambda_value=float(t.RERANK.LAMBDA))
                if t.RERANK.ENABLED else None,
                aqe=dict(qe_times=int(t.AQE.QE_TIME), qe_k=int(t.AQE.QE_K), alpha=float(t.AQE.ALPHA))
                if t.AQE.ENABLED else None)


def metrics_dict(cmc, mAP, mINP):
    cmc = np.asarray(cmc)
    at = lambda r: float(cmc[min(r, len(cmc)) - 1]) * 100.0  # noqa: E731  (galleries smaller than 10)
    return {"Rank-1": at(1), "Rank-5": at(5), "Rank-10": at(10), "mAP": float(mAP) * 100.0,
            "mINP": float(mINP) * 100.0}


def evaluate_features(qf, gf, q_pids, g_pids, q_camids, g_camids, metric="cosine", rerank=None, aqe=None,
                      max_rank=50, use_metric_cuhk03=False, return_distmat=False, chunk_size=None, flip=None):
    """Metrics of query/gallery features. ``rerank``: None or dict(k1, k2, lambda_value); ``aqe``: None or
    dict(qe_times, qe_k, alpha). With ``return_distmat=True`` returns (metrics, distmat). ``flip`` is accepted
    (and ignored: it applies at extraction) so that ``options_from_cfg(cfg)`` can be passed as is."""
    check_metric(metric)
    qf, gf = np.asarray(qf, np.float32), np.asarray(gf, np.float32)
    if aqe:
        qf, gf = average_query_expansion(qf, gf, **aqe)
    q_pids, q_camids = np.asarray(q_pids).reshape(-1), np.asarray(q_camids).reshape(-1)
    if len(q_pids) != len(qf) or len(g_pids) != len(gf):
        raise UserError("got %d query features for %d query pids and %d gallery features for %d gallery pids"
                        % (len(qf), len(q_pids), len(gf), len(g_pids)))
    acc = RankAccumulator(g_pids, g_camids, max_rank, use_metric_cuhk03)
    distmat = None
    if rerank or return_distmat:
        distmat = compute_distance(qf, gf, metric)
        if rerank:
            distmat = re_ranking(distmat, compute_distance(qf, qf, metric), compute_distance(gf, gf, metric),
                                 **rerank)
        step = int(chunk_size) if chunk_size else acc.chunk_size()
        for start in range(0, len(qf), step):
            acc.add(distmat[start:start + step], q_pids[start:start + step], q_camids[start:start + step])
    else:
        for start, stop, block in distance_blocks(qf, gf, metric, chunk_size or acc.chunk_size()):
            acc.add(block, q_pids[start:stop], q_camids[start:stop])
    results = metrics_dict(*acc.result())
    return (results, distmat) if return_distmat else results


def evaluate(model, query_loader, gallery_loader=None, num_query=None, flip=False, return_distmat=False, **options):
    """Extract features with the active backend and evaluate.

    Either separate query and gallery loaders, or one joint loader (``gallery_loader=None``) whose first
    ``num_query`` samples are the queries (fast-reid's layout). ``options``: see ``evaluate_features``
    (``options_from_cfg(cfg)`` builds them from a config). Returns the metrics dict, or
    ``(metrics, distmat, query_data, gallery_data)`` with ``return_distmat=True``, where ``*_data`` are
    ``(features, pids, camids, paths)``.
    """
    q = extract_features(model, query_loader, flip)
    if gallery_loader is None:
        if num_query is None:
            raise UserError("a joint query+gallery loader needs num_query (the number of query images first)")
        feats, pids, camids, paths = q
        q = (feats[:num_query], pids[:num_query], camids[:num_query], paths[:num_query])
        g = (feats[num_query:], pids[num_query:], camids[num_query:], paths[num_query:])
    else:
        g = extract_features(model, gallery_loader, flip)
    out = evaluate_features(q[0], g[0], q[1], g[1], q[2], g[2], return_distmat=return_distmat, **options)
    if return_distmat:
        return out[0], out[1], q, g
    return out


def format_results_table(results_by_dataset, keys=METRIC_KEYS):
    """Plain-text table, one row per dataset (values in percent, 1 decimal), plus the average when >1 row."""
    names = list(results_by_dataset)
    width = max([len("Dataset")] + [len(n) for n in names] + [len("Average")])
    header = "| %s | %s |" % ("Dataset".ljust(width), " | ".join(k.rjust(7) for k in keys))
    rule = "|-%s-|-%s-|" % ("-" * width, "-|-".join("-" * 7 for _ in keys))
    lines = [header, rule]
    for name in names:
        lines.append("| %s | %s |" % (name.ljust(width), " | ".join(
            ("%7.1f" % results_by_dataset[name][k]) if k in results_by_dataset[name] else "      -" for k in keys)))
    if len(names) > 1:
        avg = [np.mean([results_by_dataset[n][k] for n in names if k in results_by_dataset[n]]) for k in keys]
        lines.append("| %s | %s |" % ("Average".ljust(width), " | ".join("%7.1f" % v for v in avg)))
    return "\n".join(lines)


def format_rows_table(rows, keys=METRIC_KEYS):
    """Plain-text table of several evaluated models: `rows` are dicts with "name", "iteration" (None or
    negative: not a training iteration, printed "-") and "results" ({dataset: metrics}); one line per row
    and dataset, plus the row's average when it has several datasets."""
    lines = []
    for row in rows:
        it = row.get("iteration")
        it = "-" if it is None or it < 0 else str(it)
        results = row["results"]
        for dataset in results:
            lines.append((row["name"], it, dataset, [results[dataset].get(k) for k in keys]))
        if len(results) > 1:
            avg = [np.mean([m[k] for m in results.values() if k in m]) for k in keys]
            lines.append((row["name"], it, "Average", avg))
    head = ("Model", "Iteration", "Dataset")
    widths = [max([len(head[i])] + [len(line[i]) for line in lines]) for i in range(3)]
    out = ["| %s | %s |" % (" | ".join(h.ljust(w) for h, w in zip(head, widths)), " | ".join(k.rjust(7) for k in keys)),
           "|-%s-|-%s-|" % ("-|-".join("-" * w for w in widths), "-|-".join("-" * 7 for _ in keys))]
    for name, it, dataset, values in lines:
        out.append("| %s | %s | %s | %s |" % (name.ljust(widths[0]), it.rjust(widths[1]), dataset.ljust(widths[2]),
                                              " | ".join("      -" if v is None else "%7.1f" % v for v in values)))
    return "\n".join(out)
