"""The search server (tools/serve.py, reid/deploy/server.py): its API against tools/search.py's lists, batching
that changes no result and a batch window that waits only for requests on their way, a full server's 503, bad
input answered 4xx and the server still healthy (a bounded fuzz loop), the index replaced on disk, the access
token, the real server on a free loopback port stopped by SIGTERM mid-upload, and the page in headless
Chromium (tests/test_serve_browser.py); 16 clients' soak: tests/test_serve_soak.py.

Cheap: the demo-width baseline (seeded, calibrated weights of tests/test_retrieval.py), op by op, over the
synthetic target's 69 gallery images; one extractor for the module, on one model thread shared by the apps."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.crossenv import ROOT
from tests.test_retrieval import DEMO, _one_torch_thread, opts_for  # noqa: F401
from tests.test_retrieval_tools import tool

pytest.importorskip("fastapi", reason="the web modules are in requirements-torch.txt / requirements.txt; "
                                      "this environment does not serve (tests/test_serve_missing.py)")


@pytest.fixture(scope="module")
def world(retrieval_world):
    return retrieval_world


@pytest.fixture(scope="module")
def index_file(world):
    path = str(world["root"] / "serve_gallery.npz")
    if not os.path.exists(path):
        tool("index").main(["--gallery", world["gallery"], "--output", path, "--config-file", DEMO, "--engine",
                            "eager", "--no-progress"] + opts_for(world))
    return path


@pytest.fixture(scope="module")
def model(world, index_file):
    """(model thread, extractor factory): the extractor is built once, on that thread, and reused."""
    from reid.deploy import FeatureExtractor
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-model")
    extractor = pool.submit(lambda: FeatureExtractor(config=DEMO, opts=opts_for(world), engine="eager",
                                                     batch_size=8)).result()
    yield pool, (lambda: extractor)
    pool.shutdown()


def client_for(model, index, **settings):
    from fastapi.testclient import TestClient
    from reid.deploy.server import Service, ServeSettings, build_app
    settings = ServeSettings(index=index, **dict(dict(max_batch=8, reload_s=0), **settings))
    service = Service(settings, model[1], model_pool=model[0])
    return TestClient(build_app(settings, service=service)), service


@pytest.fixture(scope="module")
def api(model, index_file):
    with client_for(model, index_file)[0] as client:
        yield client


def queries(world, count=4):
    return sorted(os.path.join(world["query"], f) for f in os.listdir(world["query"]))[:count]


def post_image(client, path, params="", name=None, base="", **kwargs):
    with open(path, "rb") as fh:
        return client.post(base + "/api/search" + params, files={"image": (name or os.path.basename(path), fh.read(),
                                                                    "image/jpeg")}, **kwargs)


def search_py(world, index_file, files, tmp_path, *extra):
    os.makedirs(str(tmp_path), exist_ok=True)
    out = str(tmp_path / ("r%d.json" % len(os.listdir(str(tmp_path)))))
    where = ["--index", index_file] if index_file else []
    tool("search").main(where + ["--query"] + list(files) + ["--output", out, "--engine", "eager", "--no-progress"]
                        + list(extra))
    return json.load(open(out))


def assert_same_entry(api_entry, reference):
    """An API answer equals a tools/search.py entry: the same matches (paths, ids), scores within 1e-5."""
    assert [m["path"] for m in api_entry["matches"]] == [m["path"] for m in reference["matches"]]
    for got, want in zip(api_entry["matches"], reference["matches"]):
        assert abs(got["score"] - want["score"]) <= 1e-5
        assert (got.get("pid"), got.get("camid")) == (want.get("pid"), want.get("camid"))
    assert (api_entry.get("pid"), api_entry.get("camid")) == (reference.get("pid"), reference.get("camid"))


# ------------------------------------------------------------------------------------------ the API
def test_api_answers_the_lists_of_search_py(world, index_file, api, tmp_path):
    """The same images give the same lists through the API as through tools/search.py (also with the camera
    filter, the query's camera taken from its Market-1501-style name either way); ids name the matches."""
    from reid.deploy.gallery import load_index
    files = queries(world, 4)
    index = load_index(index_file)
    for extra, params in (((), "?topk=10"), (("--filter", "camera"), "?topk=7&filter=camera")):
        topk = re.search(r"topk=(\d+)", params).group(1)
        reference = search_py(world, index_file, files, tmp_path, "--topk", topk, *extra)
        for path, want in zip(files, reference):
            response = post_image(api, path, params)
            assert response.status_code == 200, response.text
            got = response.json()
            assert got["query"] == os.path.basename(path) and set(got) == set(want) | {"query"}
            assert len(got["matches"]) == int(topk)
            assert_same_entry(got, want)
            for m in got["matches"]:
                assert index.image_path(m["id"]) == m["path"]
            if extra:
                assert all(m["camid"] != got["camid"] for m in got["matches"])
    summary = api.get("/api/summary").json()
    assert summary["images"] == 69 and summary["feature_size"] == index.features.shape[1]
    assert summary["model"]["engine"] == "eager" and summary["model"]["config_sha256"] == index.model[
        "config_sha256"][:12]
    assert api.get("/api/health").json() == {"status": "ok", "images": 69}
    assert "/api/search" in api.get("/api/openapi.json").json()["paths"]


def test_gallery_images_by_id_and_search_from_one(world, index_file, api, tmp_path):
    from reid.deploy.gallery import load_index
    index = load_index(index_file)
    response = api.get("/api/gallery/5/image")
    assert response.status_code == 200 and response.content == open(index.image_path(5), "rb").read()
    assert response.headers["content-type"] == "image/jpeg"
    item = api.get("/api/gallery/5").json()
    assert item["path"] == index.image_path(5) and item["pid"] == int(index.pids[5])
    again = api.post("/api/gallery/5/search?topk=5")
    assert again.status_code == 200
    reference = search_py(world, index_file, [index.image_path(5)], tmp_path, "--topk", "5")[0]
    assert_same_entry(again.json(), reference)
    assert again.json()["matches"][0]["id"] == 5 and again.json()["matches"][0]["score"] == pytest.approx(1, abs=1e-5)


def test_requests_that_arrive_together_share_one_extraction(world, model, index_file):
    """Eight concurrent queries with a wide collection window run in fewer batches than queries, and each gets
    the lists it gets alone."""
    files = queries(world, 8)
    client, service = client_for(model, index_file, window_s=0.5)
    with client:
        alone = [post_image(client, f).json() for f in files]
        batches = service.batcher.batches
        assert batches == 8 and service.batcher.largest == 1
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda f: post_image(client, f), files))
        assert all(r.status_code == 200 for r in together)
        assert service.batcher.batches - batches < 8 and service.batcher.largest > 1
        for got, want in zip(together, alone):
            assert_same_entry(got.json(), want)


def test_a_full_server_answers_503_with_retry_after_and_serves_the_rest(world, model, index_file):
    """At most max_queue search requests are in the server: with the model's thread held, two wait in it and a
    third is refused at once (503, Retry-After, counted in the summary); freed, the two get their lists."""
    files = queries(world, 3)
    client, service = client_for(model, index_file, max_queue=2)
    with client:
        alone = [post_image(client, f).json() for f in files[:2]]
        release = threading.Event()
        held = model[0].submit(release.wait, 60)
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(post_image, client, f) for f in files[:2]]
            for _ in range(3000):
                if service.in_flight == 2:
                    break
                time.sleep(0.01)
            assert service.in_flight == 2
            refused = post_image(client, files[2])
            release.set()
            held.result()
            answers = [w.result(60) for w in waiting]
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"].startswith("the server is busy: 2 search requests are in it, its limit")
        for got, want in zip(answers, alone):
            assert got.status_code == 200, got.text
            assert_same_entry(got.json(), want)
        summary = client.get("/api/summary").json()
        assert summary["limits"]["max_queue"] == 2
        assert summary["batching"]["refused_busy"] == 1 and summary["batching"]["in_flight"] == 0


class _Queued:
    """What the Batcher reads of a request."""
    queued, cancelled = 0.0, False


def test_the_batch_window_waits_only_while_requests_are_on_their_way():
    """A request alone runs at once, whatever the window; one queued while another is still on its way waits
    for it (one batch of two); one whose companion never comes runs when the window ends; a batch holds at
    most max_batch; a request dropped on its way (bad input) ends the wait."""
    from reid.deploy.server import Batcher
    ran, done = [], threading.Semaphore(0)

    def run(batch):
        ran.append(len(batch))
        done.release()
    pool = ThreadPoolExecutor(1)
    try:
        lone = Batcher(run, pool, max_batch=8, window_s=600)
        lone.coming()
        lone.put(_Queued())
        assert done.acquire(timeout=60) and ran == [1]          # not the 600 s window

        pair = Batcher(run, pool, max_batch=8, window_s=600)
        pair.coming()
        pair.coming()
        release = threading.Event()
        held = pool.submit(release.wait, 60)
        pair.put(_Queued())                 # the drain starts behind `held` with one queued, one on its way
        release.set()
        held.result()
        pair.put(_Queued())
        assert done.acquire(timeout=60) and ran == [1, 2]

        dropped = Batcher(run, pool, max_batch=8, window_s=600)
        dropped.coming()
        dropped.coming()
        dropped.put(_Queued())
        dropped.gone()                      # the other's upload was refused: nothing left to wait for
        assert done.acquire(timeout=60) and ran == [1, 2, 1]

        short = Batcher(run, pool, max_batch=8, window_s=0.05)
        short.coming()
        short.coming()
        short.put(_Queued())                # its companion never comes: it runs once the window ends
        assert done.acquire(timeout=60) and ran == [1, 2, 1, 1] and short.on_the_way == 1

        full = Batcher(run, pool, max_batch=8, window_s=600)
        release.clear()
        held = pool.submit(release.wait, 60)
        for _ in range(10):
            full.coming()
            full.put(_Queued())
        release.set()
        assert done.acquire(timeout=60) and done.acquire(timeout=60) and ran[4:] == [8, 2]
        assert (full.batches, full.images, full.largest) == (2, 10, 8)
    finally:
        pool.shutdown()


# ------------------------------------------------------------------------------------------ bad input
def png_header(width, height):
    """A PNG whose header claims width x height pixels (and holds no pixel data)."""
    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def bad_requests(jpeg):
    """(what, method, path, request kwargs, status, words the error must hold)."""
    def upload(data, name="x.jpg", kind="image/jpeg"):
        return {"files": {"image": (name, data, kind)}}
    import cv2
    big = cv2.imencode(".png", np.random.default_rng(0).integers(0, 255, (400, 400, 3), np.uint8))[1].tobytes()
    return [
        ("not an image", "post", "/api/search", upload(b"hello, I am text"), 400, "not a JPEG/PNG/BMP"),
        ("a truncated JPEG", "post", "/api/search", upload(jpeg[:len(jpeg) // 2]), 400, "truncated JPEG"),
        ("an empty file", "post", "/api/search", upload(b""), 400, "empty"),
        ("an empty body", "post", "/api/search", {"content": b"", "headers": {"content-type": "image/jpeg"}}, 400,
         "empty"),
        ("no image field", "post", "/api/search", {"files": {"photo": ("x.jpg", jpeg, "image/jpeg")}}, 400,
         "field 'image'"),
        ("a form without files", "post", "/api/search", {"data": {"a": "b"}}, 415, "multipart/form-data"),
        ("over the upload limit", "post", "/api/search", upload(big), 413, "over the server's limit"),
        ("a Content-Length over it", "post", "/api/search", {"content": b"x" * 10,
         "headers": {"content-type": "image/jpeg", "content-length": str(50 << 20)}}, 413, "over the server's limit"),
        ("over the pixel limit", "post", "/api/search", upload(png_header(1000, 1000), "p.png", "image/png"), 413,
         "pixels, over the server's limit"),
        ("a decompression bomb", "post", "/api/search", upload(png_header(100000, 100000), "b.png", "image/png"), 413,
         "pixels, over the server's limit"),
        ("a wrong content type", "post", "/api/search", {"content": b"{}", "headers": {"content-type":
                                                                                       "application/json"}}, 415,
         "multipart/form-data"),
        ("a negative topk", "post", "/api/search?topk=-3", upload(jpeg), 400, "topk must be in 1..100"),
        ("a huge topk", "post", "/api/search?topk=100000", upload(jpeg), 400, "topk must be in 1..100"),
        ("topk not a number", "post", "/api/search?topk=ten", upload(jpeg), 400, "topk must be an integer"),
        ("an unknown filter", "post", "/api/search?filter=everything", upload(jpeg), 400, "unknown filter"),
        ("an unknown method", "post", "/api/search?method=magic", upload(jpeg), 400, "unknown method"),
        ("a camera id not a number", "post", "/api/search?camid=x", upload(jpeg), 400, "camid must be an integer"),
        ("an unknown gallery id", "get", "/api/gallery/69/image", {}, 404, "no gallery image has id 69"),
        ("a negative gallery id", "get", "/api/gallery/-1/image", {}, 404, "no gallery image has id -1"),
        ("a gallery id not a number", "get", "/api/gallery/abc/image", {}, 400, "gid"),
        ("a path for an id", "get", "/api/gallery/..%2F..%2Fetc%2Fpasswd/image", {}, 404, "no such page"),
        ("a search from an unknown id", "post", "/api/gallery/1000/search", {}, 404, "no gallery image has id 1000"),
        ("a stale generation", "get", "/api/gallery/3/image?generation=7", {}, 409, "reloaded since"),
        ("an unknown route", "get", "/api/nothing", {}, 404, "no such page"),
        ("a wrong method", "get", "/api/search", {}, 405, "not allowed"),
    ]


def test_bad_input_is_a_4xx_json_error_naming_it_and_changes_nothing(world, model, index_file):
    files = queries(world, 1)
    jpeg = open(files[0], "rb").read()
    client, _ = client_for(model, index_file, max_upload=100_000, max_pixels=500_000)
    with client:
        before = post_image(client, files[0]).json()
        for what, method, path, kwargs, status, words in bad_requests(jpeg):
            response = getattr(client, method)(path, **kwargs)
            assert response.status_code == status, (what, response.status_code, response.text)
            assert words in response.json()["error"], (what, response.json())
        assert client.get("/api/health").status_code == 200
        assert_same_entry(post_image(client, files[0]).json(), before)


def test_a_bounded_fuzz_loop_leaves_the_server_healthy(world, model, index_file):
    """300 random requests (garbled bodies, headers, parameters, paths): never a 5xx, every refusal a JSON
    error; afterwards the server answers a query as before."""
    files = queries(world, 1)
    jpeg = open(files[0], "rb").read()
    rng = random.Random(0)
    client, _ = client_for(model, index_file, max_upload=60_000)

    def garble(data):
        data = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data[:rng.randint(0, len(data))] if rng.random() < 0.5 else data)
    kinds = ["image/jpeg", "image/png", "application/octet-stream", "text/plain", "multipart/form-data",
             "multipart/form-data; boundary=zzz", "", "application/json"]
    params = ["", "?topk=%d" % rng.randint(-5, 500), "?topk=1e9", "?filter=camera&camid=-7", "?method=faiss-flat",
              "?camid=99999999999999999999999", "?pid=%00", "?topk=&filter="]
    with client:
        before = post_image(client, files[0]).json()
        statuses = {}
        for i in range(300):
            choice = rng.random()
            if choice < 0.4:
                response = client.post("/api/search" + rng.choice(params),
                                       files={"image": ("f%d.jpg" % i, garble(jpeg), rng.choice(kinds))})
            elif choice < 0.7:
                body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3000)))
                response = client.post("/api/search" + rng.choice(params), content=body,
                                       headers={"content-type": rng.choice(kinds)})
            elif choice < 0.85:
                gid = rng.choice([str(rng.randint(-100, 200)), "abc", "1.5", "%ff", "9" * 30])
                response = client.get("/api/gallery/%s/image" % gid + rng.choice(["", "?generation=x",
                                                                                   "?generation=1"]))
            else:
                response = client.request(rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH"]),
                                          rng.choice(["/api/search", "/api/summary", "/api/gallery/1", "/api/x",
                                                      "/%2e%2e/etc/passwd"]), content=garble(jpeg[:200]))
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (i, response.status_code, response.text[:300])
            if response.status_code >= 400:
                assert response.json()["error"], response.text
        assert sum(v for k, v in statuses.items() if k >= 400) > 150 and statuses.get(200, 0) > 10
        assert client.get("/api/health").json()["status"] == "ok"
        assert_same_entry(post_image(client, files[0]).json(), before)


def test_the_access_token(model, index_file, monkeypatch):
    client, _ = client_for(model, index_file, token="s3cret")
    with client:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"}):
            response = client.get("/api/summary", headers=headers)
            assert response.status_code == 401 and "token" in response.json()["error"]
        assert client.post("/api/search").status_code == 401
        assert client.get("/api/gallery/1/image").status_code == 401
        ok = client.get("/api/summary", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["token"] is True
        assert client.get("/api/health").status_code == 200     # for load balancers: says nothing of the index
        assert client.get("/").status_code == 200               # the page asks for the token
    # binding beyond loopback without a token is refused before anything is loaded
    monkeypatch.delenv("ACL_REID_TOKEN", raising=False)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "serve.py"), "--index", index_file, "--host",
                           "0.0.0.0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: binding 0.0.0.0 lets other machines in: give an access token with --token TOKEN (or the "
        "ACL_REID_TOKEN environment variable), or bind 127.0.0.1"]


def test_the_page_has_no_outside_assets(api):
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "/api/search" in text and "Authorization" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text) and "@import" not in text
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text)


# ------------------------------------------------------------------------------------------ index reload
def half_index(full):
    """(index, rows): every second image of the GalleryIndex `full` as an index of its own (a replacement that
    answers differently), and the rows of `full` it holds."""
    from reid.deploy.gallery import GalleryIndex
    keep = list(range(0, len(full), 2))
    return GalleryIndex(full.root, [full.paths[i] for i in keep], full.features[keep], full.pids[keep],
                        full.camids[keep], full.sizes[keep], full.mtimes[keep], dict(full.meta, count=len(keep))), keep


def test_a_replaced_index_is_reloaded_and_a_damaged_one_keeps_the_old(world, model, index_file, tmp_path, caplog):
    from reid.deploy.gallery import load_index, save_index
    live = str(tmp_path / "live.npz")
    shutil.copy(index_file, live)
    full = load_index(index_file)
    half, keep = half_index(full)
    files = queries(world, 2)
    client, service = client_for(model, live, reload_s=0.05)

    def wait_for(condition, what):
        deadline = time.time() + 20
        while time.time() < deadline:
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError("waited 20 s for " + what)
    with client:
        assert client.get("/api/summary").json()["generation"] == 1
        save_index(half, live)           # tools/index.py's atomic replacement
        wait_for(lambda: client.get("/api/summary").json()["images"] == len(keep), "the new index")
        summary = client.get("/api/summary").json()
        assert summary["generation"] == 2 and summary["reload_error"] is None
        got = post_image(client, files[0], "?topk=69").json()
        assert len(got["matches"]) == len(keep)
        assert {m["path"] for m in got["matches"]} == {half.image_path(i) for i in range(len(keep))}

        # damaged replacements: the half index keeps serving, the error is logged and shown
        for damaged in (b"garbage, not a zip", open(live, "rb").read()[:5000]):
            serving = client.get("/api/summary").json()["generation"]
            with open(str(tmp_path / "tmp"), "wb") as fh:
                fh.write(damaged)
            os.replace(str(tmp_path / "tmp"), live)
            wait_for(lambda: client.get("/api/summary").json()["reload_error"], "the reload error")
            summary = client.get("/api/summary").json()
            assert summary["generation"] == serving and summary["images"] == len(keep)
            assert "not an acl-reid gallery index or is damaged" in summary["reload_error"]
            assert len(post_image(client, files[0], "?topk=69").json()["matches"]) == len(keep)
            save_index(half, live)
            wait_for(lambda: client.get("/api/summary").json()["reload_error"] is None, "the good file")
            assert client.get("/api/summary").json()["generation"] == serving + 1
        assert any("keeps serving" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")

        # replaced over and over while queries run: each answer is whole, of the generation it names
        sizes, stop = {}, threading.Event()

        def replace():
            for i in range(12):
                save_index(full if i % 2 else half, live)
                time.sleep(0.08)
            stop.set()
        writer = threading.Thread(target=replace)
        writer.start()
        answers = []
        while not stop.is_set():
            response = post_image(client, files[1], "?topk=69")
            assert response.status_code == 200
            answers.append((int(response.headers["X-Index-Generation"]), len(response.json()["matches"])))
        writer.join()
        for generation, count in answers:
            sizes.setdefault(generation, set()).add(count)
        assert all(len(counts) == 1 and counts <= {len(full), len(keep)} for counts in sizes.values()), sizes
        assert len(sizes) >= 2


# ------------------------------------------------------------------------------------------ the real server
def start_server(args, env=None):
    """tools/serve.py in a fresh process on a free loopback port: (process, base URL) once it serves."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "serve.py"), "--port", "0"] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines, deadline = [], time.time() + 240
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r" at (http://127\.0\.0\.1:\d+/)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise AssertionError("the server did not start: %s %s" % ("".join(lines), proc.stderr.read()[-3000:]))


def test_the_real_server_answers_and_sigterm_lets_requests_finish(world, index_file, api):
    """SIGTERM arrives while a request is half uploaded: the server stops accepting connections, the request
    is still answered (its lists as in-process), and the process exits 0."""
    import http.client
    import socket
    import httpx
    files = queries(world, 1)
    expected = post_image(api, files[0]).json()
    proc, url = start_server(["--index", index_file, "--engine", "eager", "--batch", "4", "--log-level", "warning"])
    try:
        assert httpx.get(url + "api/health", timeout=30).json()["status"] == "ok"
        host, port = url.split("//")[1].rstrip("/").split(":")
        with open(files[0], "rb") as fh:
            body = (b'--zz\r\nContent-Disposition: form-data; name="image"; filename="%s"\r\nContent-Type: image/jpeg'
                    b"\r\n\r\n" % os.path.basename(files[0]).encode() + fh.read() + b"\r\n--zz--\r\n")
        sock = socket.create_connection((host, int(port)), timeout=60)
        sock.sendall(b"POST /api/search HTTP/1.1\r\nHost: %s\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
                     b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body[:len(body) // 2])
        proc.send_signal(signal.SIGTERM)
        for _ in range(600):              # until the server has stopped accepting connections
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the server still accepts connections 30 s after SIGTERM")
        sock.sendall(body[len(body) // 2:])
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        sock.close()
        assert response.status == 200, data[:300]
        assert_same_entry(json.loads(data), expected)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "api/health", timeout=5)


# ------------------------------------------------------------------------------------------ a Milvus store
def test_a_milvus_store_is_served_with_the_lists_of_search_py(world, model, tmp_path):
    """The gallery indexed into Milvus Lite (--store milvus:PATH.db): the API's lists are tools/search.py
    --store's (searched first: Milvus Lite lets one process at a time hold the file), ids name the matches."""
    pytest.importorskip("pymilvus", reason="pymilvus is in both environments' requirements: run 'make setup'")
    from fastapi.testclient import TestClient
    from reid.deploy.server import Service, ServeSettings, build_app
    store = "milvus:" + str(tmp_path / "g.db")
    tool("index").main(["--gallery", world["gallery"], "--store", store, "--config-file", DEMO, "--engine", "eager",
                        "--no-progress"] + opts_for(world))
    files = queries(world, 3)
    reference = search_py(world, None, files, tmp_path / "out", "--topk", "8", "--filter", "camera", "--store", store)
    settings = ServeSettings(store=store, max_batch=8, reload_s=0)
    service = Service(settings, model[1], model_pool=model[0])
    with TestClient(build_app(settings, service=service)) as client:
        summary = client.get("/api/summary").json()
        assert summary["images"] == 69 and summary["store"] == store and summary["vector_index"] == "FLAT"
        for path, want in zip(files, reference):
            got = post_image(client, path, "?topk=8&filter=camera").json()
            assert_same_entry(got, want)
            for m in got["matches"]:
                assert client.get("/api/gallery/%d" % m["id"]).json()["path"] == m["path"]
        refused = post_image(client, files[0], "?method=faiss-flat")
        assert refused.status_code == 400 and "its own vector index" in refused.json()["error"]
