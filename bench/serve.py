"""The search server's throughput and latency (tools/serve.py) with 1, 4 and 16 concurrent clients on loopback,
against calling FeatureExtractor + search directly in one process on the same images, measured in one run:

  in-process, one by one   each query's file decoded, extracted alone, searched (what a script would do)
  in-process, one batch    every query extracted in one call, then searched: the most batching can give
  server, C clients        C threads, each with its own keep-alive HTTP connection, posting the query files
                           round-robin (a bounded number of requests each); the server batches what arrives
                           together (its --batch-window-ms and --batch)

Prints queries/s, p50 and p99 latency per query (ms), the ratio to the one-by-one baseline, and for the server
the mean batch size it ran (from /api/summary). Every server answer's scores are checked against the
in-process ones (to 1e-5).
The default model is the demo network (configs/synthetic/acl.yml) with seeded weights over the synthetic
target's gallery (69 images, 21 queries; made in a temporary folder); --index FILE serves an index of yours
(its recorded model) with --query DIR. Setup (the synthetic data, the index, the server's start) is not timed.

    python bench/serve.py [--clients 1,4,16] [--requests 64] [--engine eager] [--window-ms 10] [--batch 16]
"""
import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEMO = os.path.join(ROOT, "configs", "synthetic", "acl.yml")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            names = re.findall(r"^model name\s*:\s*(.*)$", fh.read(), re.M)
        return "%s x %d" % (names[0], len(names)) if names else platform.processor()
    except OSError:
        return platform.processor() or "unknown CPU"


def demo_world(folder, engine):
    """(index file, query files) of the demo network with seeded weights over the synthetic target."""
    import compat
    from reid.config import load_cfg
    from reid.data.synthetic import ensure_synthetic
    from reid.modeling import build_model
    data = os.path.join(folder, "data")
    ensure_synthetic(os.path.join(data, "synthetic"), seed=0, num_ids=16, workers=1, progress=False)
    domain = os.path.join(data, "synthetic", "SynthD")
    opts = ["MODEL.HEADS.NUM_CLASSES", "[5, 6, 7]"]
    np.random.seed(0)
    weights = os.path.join(folder, "weights.pth")
    compat.checkpoint.save(build_model(load_cfg(DEMO, opts)).state_dict(), weights)
    index = os.path.join(folder, "gallery.npz")
    import importlib.util
    spec = importlib.util.spec_from_file_location("index_tool", os.path.join(ROOT, "tools", "index.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(["--gallery", os.path.join(domain, "bounding_box_test"), "--output", index, "--config-file", DEMO,
                "--engine", engine, "--no-progress", "MODEL.WEIGHTS", weights] + opts)
    query = os.path.join(domain, "query")
    return index, sorted(os.path.join(query, f) for f in os.listdir(query))


def percentile(values, q):
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def in_process(index_file, files, engine, batch, repeats):
    """The baselines: one-by-one latencies and seconds, one batch's seconds, the scores {file: top-10 scores}."""
    from reid.data.common import image_bytes_or_problem
    from reid.deploy.commands import build_extractor
    from reid.deploy.gallery import load_index
    from reid.deploy.search import exact_search
    index = load_index(index_file)
    args = argparse.Namespace(config_file="", model=None, opts=[], engine=engine, batch=batch)
    extractor = build_extractor(args, progress=False, source=index.model.get("source"))
    blobs = [open(f, "rb").read() for f in files]

    def one(blob):
        image = image_bytes_or_problem(blob)[0]
        feature = extractor([image])
        return exact_search(feature, index.features, 10)
    one(blobs[0])                                   # one-time work out of the timing
    lists, latencies = {}, []
    start = time.perf_counter()
    for r in range(repeats):
        for f, blob in zip(files, blobs):
            t = time.perf_counter()
            _, scores = one(blob)
            latencies.append(time.perf_counter() - t)
            lists[f] = scores[0]
    sequential = time.perf_counter() - start
    start = time.perf_counter()
    for r in range(repeats):
        images = [image_bytes_or_problem(b)[0] for b in blobs]
        exact_search(extractor(images), index.features, 10)
    batched = time.perf_counter() - start
    return latencies, sequential, batched, lists


def start_server(index_file, engine, batch, window_ms):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--index", index_file, "--port",
                             "0", "--engine", engine, "--batch", str(batch), "--batch-window-ms", str(window_ms),
                             "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        found = re.search(r" at (http://127\.0\.0\.1:\d+)/", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the server did not start (its error is above)")


def load_clients(url, files, clients, requests, lists):
    """(latencies, seconds, images, batches) of `clients` threads sending `requests` queries in all."""
    import httpx
    blobs = [(os.path.basename(f), open(f, "rb").read(), lists[f]) for f in files]
    latencies, errors, lock = [], [], threading.Lock()
    per = [requests // clients + (1 if c < requests % clients else 0) for c in range(clients)]

    def client(c):
        with httpx.Client(base_url=url, timeout=120) as http:
            for i in range(per[c]):
                name, blob, expected = blobs[(c * 7 + i) % len(blobs)]
                t = time.perf_counter()
                response = http.post("/api/search?topk=10", files={"image": (name, blob, "image/jpeg")})
                took = time.perf_counter() - t
                got = [m["score"] for m in response.json()["matches"]] if response.status_code == 200 else []
                with lock:
                    latencies.append(took)
                    if len(got) != len(expected) or np.abs(np.asarray(got) - expected).max() > 1e-5:
                        errors.append((name, response.status_code, response.text[:200]))
    before = httpx.get(url + "/api/summary").json()["batching"]
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    after = httpx.get(url + "/api/summary").json()["batching"]
    if errors:
        raise SystemExit("%d answers differ from the in-process scores, e.g. %s" % (len(errors), errors[0]))
    return latencies, seconds, after["images"] - before["images"], after["batches"] - before["batches"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated (default 1,4,16)")
    parser.add_argument("--requests", type=int, default=64, help="requests per client count (default 64)")
    parser.add_argument("--engine", default="eager", help="the extractor's engine, both sides (default eager)")
    parser.add_argument("--batch", type=int, default=16, help="the server's largest batch (default 16)")
    parser.add_argument("--window-ms", type=float, default=10, help="the server's collection window (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the queries in-process (default 2)")
    parser.add_argument("--index", default=None, help="an index of yours (default: the synthetic demo world)")
    parser.add_argument("--query", default=None, help="its query images' folder (with --index)")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.requests < max(clients):
        raise SystemExit("--requests must be at least the largest client count")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as folder:
        os.environ.setdefault("REID_CACHE", os.path.join(folder, "cache"))
        if args.index:
            if not args.query:
                raise SystemExit("--index needs --query DIR")
            index_file = args.index
            files = sorted(os.path.join(args.query, f) for f in os.listdir(args.query))
        else:
            index_file, files = demo_world(folder, args.engine)
        latencies, sequential, batched, lists = in_process(index_file, files, args.engine, args.batch, args.repeats)
        n = len(latencies)
        base_qps = n / sequential
        rows = [("in-process, one by one", n, base_qps, percentile(latencies, 50), percentile(latencies, 99), 1.0,
                 "1"),
                ("in-process, one batch of %d" % len(files), n, n / batched, float("nan"), float("nan"),
                 (n / batched) / base_qps, str(len(files)))]
        proc, url = start_server(index_file, args.engine, args.batch, args.window_ms)
        try:
            load_clients(url, files[:2], 1, 2, lists)      # connections and the first requests out of the timing
            for c in clients:
                lat, seconds, images, batches = load_clients(url, files, c, args.requests, lists)
                qps = len(lat) / seconds
                rows.append(("server, %d client%s" % (c, "" if c == 1 else "s"), len(lat), qps, percentile(lat, 50),
                             percentile(lat, 99), qps / base_qps, "%.1f" % (images / max(batches, 1))))
        finally:
            proc.terminate()
            proc.wait(60)
    import compat
    print("search server vs in-process (%s backend, engine %s, %d gallery queries of %s); CPU: %s; load average "
          "%.1f before, %.1f after" % (compat.BACKEND, args.engine, len(files), os.path.basename(index_file),
                                       cpu_model(), load_before, os.getloadavg()[0]))
    print("%-30s %8s %10s %9s %9s %10s %11s" % ("", "queries", "queries/s", "p50 ms", "p99 ms", "vs 1-by-1",
                                                  "mean batch"))
    for name, count, qps, p50, p99, ratio, mean in rows:
        print("%-30s %8d %10.1f %9s %9s %9.2fx %11s" % (name, count, qps, "-" if p50 != p50 else "%.1f" % p50,
                                                          "-" if p99 != p99 else "%.1f" % p99, ratio, mean))


if __name__ == "__main__":
    main()
