"""Rank lists people look at: one PNG per query, the query then its top-k gallery images, each with a green
(correct identity) or red (wrong identity) border, titled with the rank and distance. OpenCV only.

Gallery images with the query's pid and camera are left out, as in the evaluation protocol.
"""
import os

import numpy as np

from reid.errors import UserError
from reid.data.common import read_image

CELL_H, CELL_W = 128, 64
BORDER = 4
TITLE_H = 22
GAP = 8
GREEN, RED, GREY = (0, 170, 0), (220, 0, 0), (90, 90, 90)  # RGB


def _cell(path, color, label):
    import cv2
    img = read_image(path, on_bad="skip")
    if img is None:
        img = np.full((CELL_H, CELL_W, 3), 200, np.uint8)
    img = cv2.resize(img, (CELL_W, CELL_H), interpolation=cv2.INTER_AREA)
    cell = np.full((CELL_H + 2 * BORDER + TITLE_H, CELL_W + 2 * BORDER, 3), 255, np.uint8)
    cell[TITLE_H:, :] = color
    cell[TITLE_H + BORDER:TITLE_H + BORDER + CELL_H, BORDER:BORDER + CELL_W] = img
    cv2.putText(cell, label, (2, TITLE_H - 7), cv2.FONT_HERSHEY_SIMPLEX, 0.36, (0, 0, 0), 1, cv2.LINE_AA)
    return cell


def rank_list_image(query_record, gallery_records, distances):
    """RGB uint8 grid: the query cell, a gap, then one cell per gallery record in the given order. A pid of None
    is not known: such a cell gets a grey border (neither right nor wrong)."""
    q_pid = query_record[1]
    cells = [_cell(query_record[0], GREY, "query" if q_pid is None else "query %s" % q_pid)]
    for i, (rec, d) in enumerate(zip(gallery_records, distances)):
        color = GREY if q_pid is None or rec[1] is None else GREEN if rec[1] == q_pid else RED
        cells.append(_cell(rec[0], color, "%d: %.3f" % (i + 1, d)))
    gap = np.full((cells[0].shape[0], GAP, 3), 255, np.uint8)
    return np.concatenate([cells[0], gap] + cells[1:], axis=1)


def write_rank_list(path, query_record, gallery_records, values):
    """Draw rank_list_image and write it to `path` (PNG)."""
    import cv2
    grid = rank_list_image(query_record, gallery_records, values)
    if not cv2.imwrite(path, cv2.cvtColor(grid, cv2.COLOR_RGB2BGR)):
        raise UserError("cannot write %s; check that the output folder is writable" % path)
    return path


def save_rank_lists(out_dir, distmat, q_records, g_records, topk=10, num_queries=10, query_indices=None):
    """Write ``<out_dir>/rank_<query index>_<query file>.png`` for `num_queries` queries evenly spread over the
    query list (or the given `query_indices`); returns the written paths. Records are (path, pid, camid, ...);
    ``distmat`` rows follow ``q_records`` and columns ``g_records``."""
    distmat = np.asarray(distmat)
    if distmat.shape != (len(q_records), len(g_records)):
        raise UserError("distmat shape %s does not match %d query and %d gallery records"
                        % (distmat.shape, len(q_records), len(g_records)))
    if query_indices is None:
        count = min(int(num_queries), len(q_records))
        query_indices = np.unique(np.linspace(0, len(q_records) - 1, count).round().astype(int)) if count else []
    os.makedirs(out_dir, exist_ok=True)
    g_pids = np.asarray([r[1] for r in g_records])
    g_cams = np.asarray([r[2] for r in g_records])
    written = []
    for qi in query_indices:
        q = q_records[qi]
        order = np.argsort(distmat[qi], kind="stable")
        order = order[~((g_pids[order] == q[1]) & (g_cams[order] == q[2]))][:int(topk)]
        name = "rank_%05d_%s.png" % (qi, os.path.splitext(os.path.basename(q[0]))[0])
        written.append(write_rank_list(os.path.join(out_dir, name), q, [g_records[j] for j in order],
                                       distmat[qi, order]))
    return written
