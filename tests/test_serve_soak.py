"""A bounded soak of the search server (reid/deploy/server.py) on loopback: 16 clients, each on its own keep-alive
connection, send a few hundred searches; every answer must be the in-process result (FeatureExtractor + exact
search of the same file: the same paths, scores to 1e-5), no request may fail, and the resident memory of the
process that serves must stay flat; then the same while the index file is replaced again and again.

The server is uvicorn on a free 127.0.0.1 port in a thread of this process, on the module's one extractor (the
demo-width baseline of tests/test_retrieval.py, op by op); the RSS measured is this process's, clients
included. Bounded by request counts, never by time: no assertion on speed (bench/serve.py measures that)."""
import http.client
import os
import socket
import threading
import time

import numpy as np
import pytest

from tests.test_retrieval import _one_torch_thread  # noqa: F401
from tests.test_serve import half_index, index_file, model, queries, world  # noqa: F401

pytest.importorskip("uvicorn", reason="the web modules are in requirements-torch.txt / requirements.txt")

CLIENTS = 16
BOUNDARY = "soak-boundary"
# RSS growth allowed over the 256 requests measured after the warm-up: a leak of each request's prepared
# image (24 KB) would pass it
FLAT_MB = 4


def rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS in /proc/self/status")


def multipart(path):
    name = os.path.basename(path)
    with open(path, "rb") as fh:
        blob = fh.read()
    head = ('--%s\r\nContent-Disposition: form-data; name="image"; filename="%s"\r\nContent-Type: image/jpeg\r\n\r\n'
            % (BOUNDARY, name)).encode()
    return name, head + blob + ("\r\n--%s--\r\n" % BOUNDARY).encode()


class LiveServer:
    """The app of `settings` served by uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, settings, model):  # noqa: F811
        import uvicorn
        from reid.deploy.server import Service, build_app
        self.service = Service(settings, model[1], model_pool=model[0])
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(build_app(settings, service=self.service), log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise AssertionError("the server did not start on port %d" % self.port)

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()


def load(port, bodies, per_client, keep_going=None, most=None, answers=None):
    """[(file name, status, index generation, body)] of CLIENTS threads, each on one keep-alive connection,
    sending `per_client` searches (round-robin over `bodies`); with `keep_going` (an Event), on until it is
    cleared and at most `most` each. `answers`: CLIENTS lists the answers are added to as they come."""
    answers = [[] for _ in range(CLIENTS)] if answers is None else answers
    headers = {"Content-Type": "multipart/form-data; boundary=" + BOUNDARY}

    def client(c):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            i = 0
            while i < per_client or (keep_going is not None and keep_going.is_set() and i < most):
                name, body = bodies[(c * 5 + i) % len(bodies)]
                connection.request("POST", "/api/search?topk=10", body=body, headers=headers)
                response = connection.getresponse()
                answers[c].append((name, response.status, response.getheader("X-Index-Generation"),
                                   response.read()))
                i += 1
        except Exception as exc:        # a failed connection is a failed request, reported by the caller
            answers[c].append(("client %d" % c, None, None, repr(exc).encode()))
        finally:
            connection.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return [a for mine in answers for a in mine]


def in_process(model, files, index):  # noqa: F811
    """{file name: (paths, scores)} of FeatureExtractor + exact search, on the model's thread."""
    from reid.deploy.search import exact_search
    extractor = model[1]()

    def run():
        out = {}
        for path in files:
            idx, scores = exact_search(extractor(path), index.features, 10)
            out[os.path.basename(path)] = ([index.image_path(j) for j in idx[0]], scores[0])
        return out
    return model[0].submit(run).result()


def same(body, want):
    import json
    matches = json.loads(body)["matches"]
    return ([m["path"] for m in matches] == want[0]
            and np.abs(np.array([m["score"] for m in matches]) - want[1]).max() <= 1e-5)


def test_sixteen_clients_get_the_in_process_answers_and_memory_stays_flat(world, model, index_file):  # noqa: F811
    from reid.deploy.gallery import load_index
    from reid.deploy.server import ServeSettings
    files = queries(world, 21)
    expected = in_process(model, files, load_index(index_file))
    bodies = [multipart(f) for f in files]
    settings = ServeSettings(index=index_file, max_batch=8, reload_s=0)
    with LiveServer(settings, model) as live:
        # what a server holds once it has run: every batch size once (the framework's per-shape work and
        # buffers), connections, allocator pools
        size = live.service.extractor.image_size
        model[0].submit(lambda: [live.service.model.run(np.zeros((n, 3) + size, np.float32))
                                 for n in range(1, settings.max_batch + 1)]).result()
        warm = load(live.port, bodies, 3)
        levels = [rss_mb()]
        rounds = []
        for _ in range(4):
            rounds.append(load(live.port, bodies, 4))
            levels.append(rss_mb())
        batcher = live.service.batcher
        refused, in_flight = live.service.refused, live.service.in_flight
    answers = warm + [a for r in rounds for a in r]
    failed = [(name, status, body[:200]) for name, status, _, body in answers if status != 200]
    assert not failed and len(answers) == CLIENTS * 19, (len(answers), failed[:3])
    wrong = [name for name, _, _, body in answers if not same(body, expected[name])]
    assert not wrong, "%d of %d answers differ from the in-process ones, e.g. %s" % (len(wrong), len(answers),
                                                                                      wrong[:3])
    assert refused == 0 and in_flight == 0
    assert batcher.images == len(answers) and batcher.largest > 1      # concurrent requests shared batches
    growth = max(levels) - levels[0]
    assert growth <= FLAT_MB, "RSS grew %.1f MB over %d requests (MB after the warm-up and each quarter of them: "\
        "%s)" % (growth, CLIENTS * 16, ", ".join("%.1f" % v for v in levels))


def test_the_index_replaced_under_load_answers_each_request_from_one_whole_index(world, model, index_file,  # noqa: F811
                                                                                   tmp_path):
    """While 16 clients search, the file is replaced by a half index and the full one in turn: every request is
    answered, by the in-process result of the index generation it names (the same one for every request of
    a generation), and both indexes answered some."""
    import shutil
    from reid.deploy.gallery import load_index, save_index
    from reid.deploy.server import ServeSettings, _file_stamp
    live_file = str(tmp_path / "live.npz")
    shutil.copy(index_file, live_file)
    full = load_index(index_file)
    half = half_index(full)[0]
    files = queries(world, 21)
    expected = {"full": in_process(model, files, full), "half": in_process(model, files, half)}
    bodies = [multipart(f) for f in files]
    settings = ServeSettings(index=live_file, max_batch=8, reload_s=0.02)
    replacing, generations, coming = threading.Event(), [], [[] for _ in range(CLIENTS)]
    replacing.set()
    with LiveServer(settings, model) as live:
        gallery = live.service.gallery

        def answered(generation):
            return any(a[2] == str(generation) for mine in coming for a in mine[-CLIENTS:])

        def replace():
            try:
                for i in range(6):
                    save_index(half if i % 2 == 0 else full, live_file)
                    # the next file once this one has answered a request (reloads are checked every 20 ms)
                    for _ in range(3000):
                        generation = gallery.snapshot().generation
                        if gallery.snapshot().stamp == _file_stamp(live_file) and answered(generation):
                            break
                        time.sleep(0.01)
                    generations.append(generation)
            finally:
                replacing.clear()
        writer = threading.Thread(target=replace)
        writer.start()
        answers = load(live.port, bodies, 2, keep_going=replacing, most=40, answers=coming)
        writer.join(60)
        assert gallery.reload_error is None
    failed = [(name, status, body[:200]) for name, status, _, body in answers if status != 200]
    assert not failed, failed[:3]
    seen = {}      # generation -> the indexes its answers fit (a query whose lists are alike in both fits both)
    for name, _, generation, body in answers:
        kinds = {k for k in ("full", "half") if same(body, expected[k][name])}
        assert kinds, (name, generation, body[:300])
        seen[int(generation)] = seen.get(int(generation), kinds) & kinds
    assert all(len(kinds) == 1 for kinds in seen.values()), seen
    assert {k for kinds in seen.values() for k in kinds} == {"full", "half"} and len(seen) >= 3, seen
    assert generations == list(range(2, 8))         # each replacement loaded, in turn
