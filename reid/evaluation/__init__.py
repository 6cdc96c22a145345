"""Evaluation: feature extraction (backend), distances, ranking metrics, re-ranking, AQE, rank-list images,
the colour-histogram reference.

numpy-only except ``extract`` (which runs the model through ``compat``).
"""
from reid.evaluation.distance import compute_distance, distance_blocks  # noqa: F401
from reid.evaluation.rank import evaluate_rank  # noqa: F401
from reid.evaluation.rerank import re_ranking  # noqa: F401
from reid.evaluation.query_expansion import aqe  # noqa: F401
from reid.evaluation.extract import extract_features  # noqa: F401
from reid.evaluation.evaluator import (evaluate, evaluate_features, format_results_table,  # noqa: F401
                                       format_rows_table, metrics_dict, options_from_cfg, METRIC_KEYS)
from reid.evaluation.histogram import evaluate_histogram, hsv_histogram, REFERENCES  # noqa: F401
from reid.evaluation.visualize import save_rank_lists, rank_list_image  # noqa: F401

__all__ = ["compute_distance", "distance_blocks", "evaluate_rank", "re_ranking", "aqe", "extract_features",
           "evaluate", "evaluate_features", "format_results_table", "format_rows_table", "metrics_dict",
           "options_from_cfg", "METRIC_KEYS", "save_rank_lists", "rank_list_image", "evaluate_histogram",
           "hsv_histogram", "REFERENCES"]
