"""Every console command as a user runs it: a fresh process of the command this environment installed (beside
sys.executable), with the options the README and docs show, on the small synthetic data, checked by its exit
status and the files it writes. `make test` runs the file in each environment, so it covers each stack.

One tiny trained model (acl-reid-train, 4 iterations: conftest.py's cli_run, which tests/test_training.py
checks too) serves every case; the others convert it, evaluate it
(op by op, with rank lists; with the ONNX file acl-reid-export writes), index a 20-image gallery (an .npz
file by 2 extraction processes; Milvus Lite), search it (both stores, with rank-list pictures), serve the
Milvus one over HTTP (acl-reid-serve, where the server's requirements are installed) and sweep
one seed of the same recipe. MindSpore's and the other libraries' log settings are the user's: GLOG_v is left
unset, as in a fresh shell."""
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.crossenv import ROOT
from tests.test_training import TINY as TRAINING_TINY

BIN = os.path.dirname(sys.executable)
DEMO = str(ROOT / "configs" / "synthetic" / "acl.yml")
# the sweep's run: the training tests' tiny recipe (tests/test_training.py) for 2 iterations, evaluated once
# at the end, op by op
TINY = TRAINING_TINY + ["SOLVER.MAX_EPOCH", "1", "SOLVER.ITERS_PER_EPOCH", "2", "SOLVER.WARMUP_EPOCHS", "0",
                        "TEST.EVAL_AT_START", "False", "TEST.REFERENCE", ""]
METRICS = ("Rank-1", "mAP")
# metrics of the same weights from two evaluations (another engine, another process): percentages of 21 queries
SAME_METRICS = 0.1
ROUNDING = 1.5e-6     # scores in the JSON have 6 decimals


def command(name, args, cwd, timeout=900, expect=0):
    """Run the installed command `name` from `cwd`; its CompletedProcess, after checking the exit status."""
    path = os.path.join(BIN, name)
    assert os.access(path, os.X_OK), "%s is not installed in %s: run `make setup`" % (name, BIN)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GLOG_v")}
    proc = subprocess.run([path] + [str(a) for a in args], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == expect, "%s exited with %d (expected %d):\n%s\n%s" % (
        name, proc.returncode, expect, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def metrics(path):
    with open(str(path)) as fh:
        results = json.load(fh)["results"]["SynthD"]
    return {k: results[k] for k in METRICS}


def assert_same_metrics(a, b):
    assert all(abs(a[k] - b[k]) <= SAME_METRICS for k in METRICS), (a, b)


@pytest.fixture(scope="module")
def trained(cli_run, synth_root):
    """acl-reid-train's run (conftest.py's cli_run): its folder (config.yaml, model_final.pth, results.json)."""
    out, stdout = cli_run
    for name in ("config.yaml", "model_final.pth", "results.json", "metrics.json"):
        assert (out / name).is_file(), name
    last = metrics(out / "results.json")
    assert all(0 <= v <= 100 for v in last.values()) and "| last" in stdout, stdout
    return {"out": out, "config": str(out / "config.yaml"), "weights": str(out / "model_final.pth"),
            "data": synth_root, "last": last}


def test_convert_then_test_with_rank_lists(trained, tmp_path):
    """acl-reid-convert writes the original code's format; acl-reid-test reads it (--vis-rank: PNGs) and gives
    the training's last evaluation."""
    original = tmp_path / "acl_dgreid_model.pth"
    command("acl-reid-convert", [trained["weights"], "--to", "original", "--output", original], tmp_path)
    assert original.is_file() and original.stat().st_size > 0
    out = tmp_path / "test"
    proc = command("acl-reid-test", ["--config-file", trained["config"], "MODEL.WEIGHTS", original, "--vis-rank", "2",
                                     "OUTPUT_DIR", out], tmp_path)
    assert "results written to" in proc.stdout
    assert_same_metrics(metrics(out / "eval" / "results.json"), trained["last"])
    assert len(glob.glob(str(out / "eval" / "rank_lists" / "SynthD" / "*.png"))) == 2


def test_export_then_test_on_onnx(trained, tmp_path):
    """acl-reid-export writes ONNX and its sidecar; acl-reid-test --engine onnx evaluates it as the eager
    network was evaluated."""
    onnx = tmp_path / "deploy" / "acl.onnx"
    command("acl-reid-export", ["--config-file", trained["config"], "MODEL.WEIGHTS", trained["weights"],
                                "--output", onnx], tmp_path)
    assert onnx.is_file() and (tmp_path / "deploy" / "acl.onnx.json").is_file()
    out = tmp_path / "test"
    command("acl-reid-test", ["--config-file", trained["config"], "--engine", "onnx", "--model", onnx,
                              "OUTPUT_DIR", out], tmp_path)
    with open(str(out / "eval" / "results.json")) as fh:
        assert json.load(fh)["engine"] == "onnx"
    assert_same_metrics(metrics(out / "eval" / "results.json"), trained["last"])


def _lists(path):
    with open(str(path)) as fh:
        return json.load(fh)


def test_index_and_search_on_both_stores(trained, tmp_path):
    """acl-reid-index into an .npz file with --nproc 2 (whose output has no INFO lines of MindSpore's cluster:
    GLOG_v is unset) and into Milvus Lite; acl-reid-search on each gives the same lists (the Milvus one with
    --vis pictures); a Milvus server that does not answer is a one-line error."""
    from tests.test_distributed import _free_port
    domain = os.path.join(trained["data"], "synthetic", "SynthD")
    gallery, queries = tmp_path / "gallery", tmp_path / "query"
    for folder, sub, count in ((gallery, "bounding_box_test", 20), (queries, "query", 4)):
        folder.mkdir()
        for path in sorted(glob.glob(os.path.join(domain, sub, "*.jpg")))[:count]:
            shutil.copy(path, str(folder))
    model = ["--config-file", trained["config"], "MODEL.WEIGHTS", trained["weights"]]

    proc = command("acl-reid-index", ["--gallery", gallery, "--output", "gallery.npz", "--nproc", "2",
                                      "--master-port", _free_port()] + model, tmp_path)
    assert "wrote gallery.npz: 20 images" in proc.stdout and "20 extracted" in proc.stdout, proc.stdout
    assert "[INFO]" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert not glob.glob(str(tmp_path / ".gallery.npz.shards"))
    proc = command("acl-reid-index", ["--gallery", gallery, "--store", "milvus:gallery.db"] + model, tmp_path)
    assert "of milvus:gallery.db: 20 images" in proc.stdout and "20 extracted" in proc.stdout, proc.stdout

    search = ["--query", queries, "--topk", "5", "--filter", "camera"]
    command("acl-reid-search", ["--store", "milvus:gallery.db", "--output", "milvus.json", "--vis", "ranks"] + search,
            tmp_path)
    command("acl-reid-search", ["--index", "gallery.npz", "--output", "npz.json"] + search, tmp_path)
    milvus, npz = _lists(tmp_path / "milvus.json"), _lists(tmp_path / "npz.json")
    assert len(milvus) == len(npz) == 4 and (tmp_path / "milvus.csv").is_file()
    for a, b in zip(milvus, npz):
        assert a["query"] == b["query"] and len(a["matches"]) == len(b["matches"]) == 5
        scores = np.array([[m["score"] for m in a["matches"]], [m["score"] for m in b["matches"]]])
        assert np.abs(scores[0] - scores[1]).max() <= ROUNDING
        for ma, mb in zip(a["matches"], b["matches"]):     # the same image, or one tied with it
            assert ma["path"] == mb["path"] or abs(ma["score"] - mb["score"]) <= ROUNDING
    assert len(glob.glob(str(tmp_path / "ranks" / "*.png"))) == 4

    if importlib.util.find_spec("uvicorn") is not None:    # the server's requirements (tests/test_serve*.py)
        served = serve_one(["--store", "milvus:gallery.db", "--log-level", "warning"],
                           sorted(queries.iterdir())[0], "?topk=5&filter=camera", tmp_path)
        assert [m["path"] for m in served["matches"]] == [m["path"] for m in milvus[0]["matches"]]
        assert np.abs(np.subtract([m["score"] for m in served["matches"]],
                                  [m["score"] for m in milvus[0]["matches"]])).max() <= ROUNDING

    proc = command("acl-reid-index", ["--gallery", gallery, "--store", "milvus://127.0.0.1:%d/g" % _free_port()]
                   + model, tmp_path, expect=2)
    assert proc.stderr.strip().count("\n") == 0 and "cannot reach the Milvus server" in proc.stderr, proc.stderr


def serve_one(args, image, params, cwd):
    """acl-reid-serve on a free loopback port: the JSON of one POST /api/search of `image`, then SIGTERM, which
    must end it with status 0."""
    import re
    import signal
    import urllib.error
    import urllib.request
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GLOG_v")}
    proc = subprocess.Popen([os.path.join(BIN, "acl-reid-serve"), "--port", "0"] + list(args), cwd=str(cwd), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, lines = None, []
        for line in proc.stdout:            # its first line says where it serves; it ends only if it failed
            lines.append(line)
            found = re.search(r" at (http://127\.0\.0\.1:\d+/)", line)
            if found:
                url = found.group(1)
                break
        assert url, "acl-reid-serve did not start: %s %s" % ("".join(lines), proc.stderr.read()[-3000:])
        boundary = "acl-reid-test-boundary"
        body = ("--%s\r\nContent-Disposition: form-data; name=\"image\"; filename=\"%s\"\r\nContent-Type: "
                "image/jpeg\r\n\r\n" % (boundary, image.name)).encode() + image.read_bytes() + \
            ("\r\n--%s--\r\n" % boundary).encode()
        request = urllib.request.Request(url + "api/search" + params, data=body, method="POST", headers={
            "Content-Type": "multipart/form-data; boundary=%s" % boundary})
        try:    # the address is printed once the socket listens: no connection is refused after it
            with urllib.request.urlopen(request, timeout=120) as response:
                answer = json.loads(response.read().decode())
        except urllib.error.URLError as exc:
            raise AssertionError("acl-reid-serve: %s; %s" % (exc, proc.stderr.read()[-3000:]
                                                             if proc.poll() is not None else "")) from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        return answer
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sweep_of_one_seed(trained, tmp_path):
    """acl-reid-sweep: one variant of the tiny recipe, one seed: its run, the lines and the table."""
    out = tmp_path / "sweep"
    proc = command("acl-reid-sweep", ["--config-file", DEMO, "--out", out, "--seeds", "0", "--variant", "tiny=",
                                      "DATASETS.ROOT", trained["data"]] + TINY, tmp_path)
    assert "tiny" in proc.stdout
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 1 and "error" not in rows[0], rows
    assert (out / "runs" / "tiny_s0" / "model_final.pth").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert "tiny" in json.dumps(summary)


