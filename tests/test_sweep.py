"""Recipe sweeps (reid/engine/sweep.py, tools/sweep.py): variants and seeds parsed, per-variant statistics and
per-seed differences on known answers, and a tiny sweep end to end on torch: each row carries its run's
results.json, a second sweep skips the finished runs, and changed settings are refused with nothing lost."""
import json
import math
import subprocess
import sys

import pytest

from compat.errors import UserError
from reid.engine import sweep
from tests.crossenv import ROOT, active_backend, child_env


def test_variants_parse_into_name_config_and_overrides():
    assert sweep.parse_variant("base=", "a.yml") == ("base", "a.yml", [])
    assert sweep.parse_variant('lr@b.yml=SOLVER.BASE_LR 0.2 SOLVER.STEPS "[26, 27]"', "a.yml") == (
        "lr", "b.yml", ["SOLVER.BASE_LR", "0.2", "SOLVER.STEPS", "[26, 27]"])
    for text, default, words in [("x", "a.yml", "no '='"), ("x=SOLVER.BASE_LR", "a.yml", "KEY VALUE pairs"),
                                 ("a b=", "a.yml", "variant name"), ("x=", "", "no config"),
                                 ('x=SOLVER.BASE_LR "0.2', "a.yml", "quote")]:
        with pytest.raises(UserError, match=words):
            sweep.parse_variant(text, default)


def test_seeds_parse_from_lists_and_ranges():
    assert sweep.parse_seeds("0-2,7") == [0, 1, 2, 7]
    assert sweep.parse_seeds(" 3 ") == [3]
    assert sweep.parse_seeds("2,1,2") == [1, 2]
    for bad in ["", "a", "3-a", "-1", "5-3"]:
        with pytest.raises(UserError):
            sweep.parse_seeds(bad)


def _row(variant, seed, m, r1=None, rc=0):
    metrics = {"mAP": m, "Rank-1": m + 10 if r1 is None else r1, "mINP": m / 2}
    return {"variant": variant, "seed": seed, "rc": rc, "results": {"SynthD": metrics} if rc == 0 else None}


def test_summary_gives_means_stds_and_paired_differences():
    rows = [_row("a", 0, 10.0), _row("a", 1, 20.0), _row("a", 2, 30.0),
            _row("b", 0, 12.0), _row("b", 1, 21.0), _row("b", 2, 33.0), _row("b", 3, 99.0, rc=1),
            _row("c", 1, 25.0, r1=5.0)]
    table = {r["variant"]: r for r in sweep.summarise(rows)}
    assert table["a"]["n"] == 3 and table["a"]["seeds"] == [0, 1, 2] and table["a"]["target"] == "SynthD"
    assert table["a"]["mAP"] == pytest.approx((20.0, 10.0))
    assert table["b"]["mAP"] == pytest.approx((22.0, math.sqrt(((12 - 22) ** 2 + 1 + 11 ** 2) / 2)))
    assert "paired" not in table["a"]                      # the reference has no difference from itself
    assert table["b"]["paired"]["mAP"] == pytest.approx((2.0, 1.0)) and table["b"]["paired_n"] == 3
    assert table["b"]["paired"]["mINP"] == pytest.approx((1.0, 0.5))
    assert table["c"]["paired"]["Rank-1"][0] == pytest.approx(5.0 - 30.0) and table["c"]["paired_n"] == 1
    assert math.isnan(table["c"]["mAP"][1])               # one seed: no spread
    assert [r["variant"] for r in sweep.summarise(rows, order=["b", "a"])] == ["b", "a", "c"]
    assert sweep.summarise(rows, order=["b"])[1]["paired"]["mAP"] == pytest.approx((-2.0, 1.0))
    assert sweep.unfinished(rows) == [("b", 3)]
    assert sweep.unfinished(rows + [_row("b", 3, 30.0)]) == []   # retried and finished
    text = sweep.format_table(sweep.summarise(rows))
    assert "| b | 0,1,2 | 22.0 ± 10.5 |" in text and "+2.0 ± 1.0 (n=3)" in text and "| c | 1 | 25.0 |" in text
    assert "| +5.0 (n=1) | -25.0 (n=1) |" in text                       # one shared seed: no spread shown
    # the reference is the first variant in `order` that has runs
    assert [r["variant"] for r in sweep.summarise(rows, order=["missing", "b"])] == ["b", "a", "c"]
    assert sweep.summarise(rows, order=["missing", "b"])[1]["paired"]["mAP"] == pytest.approx((-2.0, 1.0))


def test_a_broken_line_in_the_rows_is_named(tmp_path):
    path = tmp_path / "sweep.jsonl"
    path.write_text(json.dumps(_row("a", 0, 10.0)) + "\n\n" + '{"variant": "a", "se')
    with pytest.raises(UserError, match="line 3 is not JSON"):
        sweep.load_rows(str(path))
    path.write_text(json.dumps(_row("a", 0, 10.0)) + "\n")
    assert sweep.load_rows(str(path)) == [_row("a", 0, 10.0)]
    assert sweep.load_rows(str(tmp_path / "none.jsonl")) == []


SWEEP_OPTS = ["MODEL.BACKBONE.BASE_WIDTH", "8", "DATASETS.SYNTHETIC.NUM_IDS", "16", "SOLVER.IMS_PER_BATCH", "16",
              "META.IMS_PER_DOMAIN", "8", "SOLVER.MAX_EPOCH", "1", "SOLVER.ITERS_PER_EPOCH", "2",
              "META.INITIAL_BASIC_STEPS", "1", "TEST.FLIP", "False", "TEST.REFERENCE", "", "MODEL.JIT", "False",
              "TEST.JIT", "False", "SOLVER.CHECKPOINT_ITERS", "0"]


def _sweep(out, synth_root, extra=()):
    args = [sys.executable, str(ROOT / "tools" / "sweep.py"), "--config-file", "configs/synthetic/acl.yml",
            "--out", str(out), "--seeds", "0-1", "--jobs", "2", "--threads", "1", "--variant", "acl=",
            "--variant", "lr@configs/synthetic/acl.yml=SOLVER.BASE_LR 0.05", "DATASETS.ROOT", synth_root]
    return subprocess.run(args + SWEEP_OPTS + list(extra), cwd=str(ROOT), env=child_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(active_backend() != "torch", reason="the sweep's runs are train.py processes, which the "
                    "training tests hold on MindSpore; torch runs them in seconds")
def test_tiny_sweep_end_to_end(synth_root, tmp_path):
    out = tmp_path / "sweep"
    proc = _sweep(out, synth_root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = sweep.load_rows(str(out / "sweep.jsonl"))
    assert sorted((r["variant"], r["seed"]) for r in rows) == [("acl", 0), ("acl", 1), ("lr", 0), ("lr", 1)]
    for r in rows:
        assert r["rc"] == 0 and r["opts"] == ([] if r["variant"] == "acl" else ["SOLVER.BASE_LR", "0.05"])
        with open(r["output_dir"] + "/results.json") as fh:
            assert r["results"] == json.load(fh)["results"]
        with open(r["output_dir"] + "/config.yaml") as fh:
            text = fh.read()
        assert "SEED: %d" % r["seed"] in text and ("BASE_LR: 0.05" in text) == (r["variant"] == "lr")
        assert math.isfinite(r["loss_cls_last"])
    by_run = {(r["variant"], r["seed"]): r["results"] for r in rows}
    by = {k: v["SynthD"]["mAP"] for k, v in by_run.items()}
    summary = {r["variant"]: r for r in json.loads((out / "summary.json").read_text())}
    assert summary["acl"]["mAP"][0] == pytest.approx((by["acl", 0] + by["acl", 1]) / 2)
    assert summary["lr"]["paired"]["mAP"][0] == pytest.approx((by["lr", 0] - by["acl", 0] + by["lr", 1]
                                                              - by["acl", 1]) / 2)
    assert (out / "summary.md").read_text().strip() in proc.stdout

    again = _sweep(out, synth_root)                       # nothing left to run: the same table, no new rows
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(sweep.load_rows(str(out / "sweep.jsonl"))) == 4

    # a run the sweep has no row for (stopped, say) runs again; its earlier folder is kept beside, and at one
    # thread per run torch repeats it to the last digit
    kept = [r for r in rows if (r["variant"], r["seed"]) != ("lr", 1)]
    (out / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    retry = _sweep(out, synth_root)
    assert retry.returncode == 0, retry.stderr[-3000:]
    rerun = [r for r in sweep.load_rows(str(out / "sweep.jsonl")) if (r["variant"], r["seed"]) == ("lr", 1)]
    assert len(rerun) == 1 and rerun[0]["results"] == by_run["lr", 1]
    assert (out / "runs" / "lr_s1.attempt-1" / "results.json").exists()

    before = (out / "sweep.jsonl").read_text()
    changed = _sweep(out, synth_root, extra=["SOLVER.WEIGHT_DECAY", "0.001"])
    assert changed.returncode != 0
    assert "trained with other settings" in changed.stderr and len(changed.stderr.strip().splitlines()) == 1
    assert (out / "sweep.jsonl").read_text() == before


def test_bad_override_fails_before_any_run(tmp_path):
    args = [sys.executable, str(ROOT / "tools" / "sweep.py"), "--config-file", "configs/synthetic/acl.yml",
            "--out", str(tmp_path / "s"), "--variant", "x=SOLVER.BASE_LRR 0.1"]
    proc = subprocess.run(args, cwd=str(ROOT), env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "SOLVER.BASE_LRR" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
