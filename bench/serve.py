"""The search server's throughput and latency (tools/serve.py) with 1, 4 and 16 concurrent clients on loopback,
against calling FeatureExtractor + search directly in one process on the same images, measured in one run, in
turn (in-process, then the server at each client count) for --rounds rounds, of which the medians are printed:

  in-process, one by one   each query's file decoded, extracted alone, searched (what a script would do)
  in-process, one batch    every query extracted in one call, then searched: the most batching can give
  server, C clients        C threads, each with its own keep-alive HTTP connection (the standard library's
                           http.client, each query's multipart body made once before the clock starts: the
                           clients share the CPU with the server, and the lighter they are the more of it the
                           server gets), posting the query files round-robin (a bounded number of requests
                           each); the server batches what arrives together (its --batch-window-ms and --batch)

Prints queries/s, p50 and p99 latency per query (ms), the ratio to the one-by-one baseline, and for the server
the mean batch size it ran (from /api/summary); then one line per ratio the search server is held to
(docs/serving.md#speed): 16 clients against the better in-process figure, 4 clients against one by one, one
client's p50 against a direct call's. Every server answer's scores are checked against the in-process ones
(to 1e-5), after the clock stops.
The default model is the demo network (configs/synthetic/acl.yml) with seeded weights over the synthetic
target's gallery (69 images, 21 queries; made in a temporary folder); --index FILE serves an index of yours
(its recorded model) with --query DIR. Setup (the synthetic data, the index, the server's start) is not timed.

    python bench/serve.py [--clients 1,4,16] [--requests 64] [--rounds 3] [--engine eager] [--window-ms 10] [--batch 16]
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


class Direct:
    """The baselines in this process: FeatureExtractor + search called directly on the same query files."""

    def __init__(self, index_file, files, engine, batch):
        from reid.deploy.commands import build_extractor
        from reid.deploy.gallery import load_index
        self.index = load_index(index_file)
        args = argparse.Namespace(config_file="", model=None, opts=[], engine=engine, batch=batch)
        self.extractor = build_extractor(args, progress=False, source=self.index.model.get("source"))
        self.files, self.blobs = files, [open(f, "rb").read() for f in files]
        self.lists = {f: self.one(blob)[1][0] for f, blob in zip(files, self.blobs)}   # one-time work untimed

    def one(self, blob):
        from reid.data.common import image_bytes_or_problem
        from reid.deploy.search import exact_search
        return exact_search(self.extractor([image_bytes_or_problem(blob)[0]]), self.index.features, 10)

    def round(self, repeats):
        """(one-by-one latencies, their seconds, one batch's seconds) of `repeats` passes over the queries."""
        from reid.data.common import image_bytes_or_problem
        from reid.deploy.search import exact_search
        latencies = []
        start = time.perf_counter()
        for _ in range(repeats):
            for blob in self.blobs:
                t = time.perf_counter()
                self.one(blob)
                latencies.append(time.perf_counter() - t)
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(repeats):
            images = [image_bytes_or_problem(b)[0] for b in self.blobs]
            exact_search(self.extractor(images), self.index.features, 10)
        return latencies, sequential, time.perf_counter() - start


def start_server(index_file, engine, batch, window_ms):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--index", index_file, "--port",
                             "0", "--engine", engine, "--batch", str(batch), "--batch-window-ms", str(window_ms),
                             "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        found = re.search(r" at (http://127\.0\.0\.1:\d+)/", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the server did not start (its error is above)")


BOUNDARY = "bench-serve-boundary"


def multipart(name, blob):
    """The multipart/form-data body of one image in the field `image`."""
    head = ('--%s\r\nContent-Disposition: form-data; name="image"; filename="%s"\r\nContent-Type: image/jpeg'
            '\r\n\r\n' % (BOUNDARY, name)).encode()
    return head + blob + ("\r\n--%s--\r\n" % BOUNDARY).encode()


def summary(url):
    import json
    from urllib.request import urlopen
    with urlopen(url + "/api/summary", timeout=60) as response:
        return json.loads(response.read())


def load_clients(url, files, clients, requests, lists):
    """(latencies, seconds, images, batches) of `clients` threads sending `requests` queries in all."""
    import http.client
    import json
    from urllib.parse import urlsplit
    where = urlsplit(url)
    bodies = [(os.path.basename(f), multipart(os.path.basename(f), open(f, "rb").read()), lists[f]) for f in files]
    headers = {"Content-Type": "multipart/form-data; boundary=" + BOUNDARY}
    per = [requests // clients + (1 if c < requests % clients else 0) for c in range(clients)]
    answers, failures = [[] for _ in range(clients)], []

    def client(c):
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
        try:
            for i in range(per[c]):
                name, body, expected = bodies[(c * 7 + i) % len(bodies)]
                t = time.perf_counter()
                connection.request("POST", "/api/search?topk=10", body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                answers[c].append((time.perf_counter() - t, name, response.status, data, expected))
        except Exception as exc:          # a broken connection: reported after the run
            failures.append("client %d: %s" % (c, exc))
        finally:
            connection.close()
    before = summary(url)["batching"]
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    after = summary(url)["batching"]
    errors, latencies = list(failures), []
    for took, name, status, data, expected in (a for mine in answers for a in mine):
        latencies.append(took)
        got = [m["score"] for m in json.loads(data)["matches"]] if status == 200 else []
        if len(got) != len(expected) or np.abs(np.asarray(got) - expected).max() > 1e-5:
            errors.append((name, status, data[:200]))
    if errors or len(latencies) != requests:
        raise SystemExit("%d of %d answers failed or differ from the in-process scores, e.g. %s" % (
            max(len(errors), requests - len(latencies)), requests, errors[:1]))
    return latencies, seconds, after["images"] - before["images"], after["batches"] - before["batches"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated (default 1,4,16)")
    parser.add_argument("--requests", type=int, default=64, help="requests per client count (default 64)")
    parser.add_argument("--engine", default="eager", help="the extractor's engine, both sides (default eager)")
    parser.add_argument("--batch", type=int, default=16, help="the server's largest batch (default 16)")
    parser.add_argument("--window-ms", type=float, default=10, help="the server's collection window (default 10)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="passes over the queries in-process per round (default: about --requests queries)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of in-process and server measurements, in turn; medians shown (default 3)")
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
        repeats = args.repeats or max(2, -(-args.requests // len(files)))
        direct = Direct(index_file, files, args.engine, args.batch)
        proc, url = start_server(index_file, args.engine, args.batch, args.window_ms)
        runs = {}          # row name -> [(queries, queries/s, p50, p99, images, batches)], one per round
        try:
            load_clients(url, files[:2], 1, 2, direct.lists)   # connections and the first requests untimed
            for _ in range(args.rounds):
                # in-process and server measured in turn, round after round: a machine whose speed drifts
                # during the run shifts both alike
                latencies, sequential, batched = direct.round(repeats)
                n = len(latencies)
                runs.setdefault("in-process, one by one", []).append(
                    (n, n / sequential, percentile(latencies, 50), percentile(latencies, 99), n, n))
                runs.setdefault("in-process, one batch of %d" % len(files), []).append(
                    (n, n / batched, float("nan"), float("nan"), n * len(files), n))
                for c in clients:
                    lat, seconds, images, batches = load_clients(url, files, c, args.requests, direct.lists)
                    runs.setdefault("server, %d client%s" % (c, "" if c == 1 else "s"), []).append(
                        (len(lat), len(lat) / seconds, percentile(lat, 50), percentile(lat, 99), images, batches))
        finally:
            proc.terminate()
            proc.wait(60)
    rows = []
    for name, got in runs.items():
        middle = sorted(got, key=lambda r: r[1])[len(got) // 2]      # the round of the median queries/s
        rows.append((name, sum(r[0] for r in got), middle[1], float(np.median([r[2] for r in got])),
                     float(np.median([r[3] for r in got])), sum(r[4] for r in got) / max(1, sum(r[5] for r in got))))
    base_qps = rows[0][2]
    import compat
    report = {}
    print("search server vs in-process (%s backend, engine %s, %d gallery queries of %s; medians of %d rounds); CPU: "
          "%s; load average %.1f before, %.1f after" % (compat.BACKEND, args.engine, len(files),
                                                        os.path.basename(index_file), args.rounds, cpu_model(),
                                                        load_before, os.getloadavg()[0]))
    print("%-30s %8s %10s %9s %9s %10s %11s" % ("", "queries", "queries/s", "p50 ms", "p99 ms", "vs 1-by-1",
                                                  "mean batch"))
    for name, count, qps, p50, p99, mean in rows:
        report[name] = (qps, p50)
        print("%-30s %8d %10.1f %9s %9s %9.2fx %11.1f" % (name, count, qps, "-" if p50 != p50 else "%.1f" % p50,
                                                            "-" if p99 != p99 else "%.1f" % p99, qps / base_qps, mean))
    for line in ratio_lines(report, len(files), cpu_model()):
        print(line)


def ratio_lines(report, batch, cpu):
    """The ratios the server is held to (docs/serving.md#speed), one line each, for the client counts run."""
    one_by_one, p50_direct = report["in-process, one by one"]
    batched = report["in-process, one batch of %d" % batch][0]
    best = max(one_by_one, batched)
    lines = []
    if "server, 16 clients" in report:
        qps = report["server, 16 clients"][0]
        lines.append("16 clients: %.1f queries/s = %.2fx the better in-process figure (%.1f, %s); wanted >= 0.90x"
                     % (qps, qps / best, best, "one batch" if batched >= one_by_one else "one by one"))
    if "server, 4 clients" in report:
        qps = report["server, 4 clients"][0]
        lines.append("4 clients: %.1f queries/s = %.2fx in-process one by one (%.1f); wanted >= 1.00x"
                     % (qps, qps / one_by_one, one_by_one))
    if "server, 1 client" in report:
        p50 = report["server, 1 client"][1]
        lines.append("1 client: p50 %.2f ms = %.2fx a direct call's p50 (%.2f ms); wanted <= 1.20x"
                     % (p50, p50 / p50_direct, p50_direct))
    return ["%s  [CPU: %s]" % (line, cpu) for line in lines]


if __name__ == "__main__":
    main()
