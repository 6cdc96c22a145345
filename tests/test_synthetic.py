"""The built-in synthetic domains (reid/data/synthetic.py): layout, names, splits, determinism, domain
differences, ensure_synthetic's caching, the CLI, and a cheap learnability proxy (HSV histograms + a
Market-style evaluator written here, independent of reid/evaluation).

Full-size proxy figures (all 4 domains, 300 ids each; not part of the test run):
    .venv/bin/python tests/test_synthetic.py --proxy DIR
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reid.data import synthetic as syn  # noqa: E402
from tests.crossenv import child_env  # noqa: E402

NAME = re.compile(r"^(-1|\d{4})_c([1-9])s([1-9])_(\d{6})_00\.jpg$")
SPLITS = ("bounding_box_train", "query", "bounding_box_test")
TINY_IDS = 12


def parse(name):
    m = NAME.match(name)
    assert m, "bad file name %r" % name
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))


def records(domain_dir, split):
    """[(path, pid, cam)] of one split, sorted by name."""
    d = os.path.join(domain_dir, split)
    return [(os.path.join(d, n),) + parse(n)[:2] for n in sorted(os.listdir(d))]


def tree_bytes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth") / "data"
    out = syn.ensure_synthetic(root, seed=0, num_ids=TINY_IDS, workers=1, progress=False)
    assert out == str(root)
    return root


# ------------------------------------------------------------------------------------------- layout / splits
def test_layout_names_and_meta(tiny):
    assert sorted(os.listdir(tiny)) == list(syn.SYNTHETIC_DOMAINS)     # no temp dirs left behind
    for name, style in zip(syn.SYNTHETIC_DOMAINS, syn.STYLES):
        d = tiny / name
        assert sorted(os.listdir(d)) == sorted(SPLITS + ("meta.json",))
        meta = syn._read_meta(str(d))
        assert meta["seed"] == 0 and meta["num_ids"] == TINY_IDS and meta["version"] == syn.GENERATOR_VERSION
        assert meta["domain"] == name
        c = meta["counts"]
        n_files = dict((s, len(os.listdir(d / s))) for s in SPLITS)
        assert (n_files["bounding_box_train"], n_files["query"], n_files["bounding_box_test"]) == \
            (c["train_images"], c["query_images"], c["gallery_images"])
        for split in SPLITS:
            for path, pid, cam in records(str(d), split):
                assert 1 <= cam <= style.cameras
            # frame numbers are unique per (camera, sequence), as in Market
            keys = [parse(n)[1:] for n in os.listdir(d / split)]
            assert len(set(keys)) == len(keys)
        # images decode, are 3-channel, and Market-sized domains keep the fixed 128x64 box
        sample = [p for p, _, _ in records(str(d), "query")[:5]]
        shapes = set(cv2.imread(p).shape for p in sample)
        assert all(len(s) == 3 and s[2] == 3 and s[0] > s[1] for s in shapes)
        if style.size_jitter == 0:
            assert shapes == {style.size + (3,)}


def test_pid_camera_parsing():
    assert parse("0012_c3s2_001234_00.jpg") == (12, 3, 2, 1234)
    assert parse("-1_c1s1_000401_00.jpg") == (-1, 1, 1, 401)
    assert syn._filename(7, 4, 5, 42) == "0007_c4s5_000042_00.jpg"
    assert syn._filename(-1, 1, 1, 401) == "-1_c1s1_000401_00.jpg"
    for bad in ("12_c3s2_001234_00.jpg", "0012_c3s2_1234_00.jpg", "0012_c0s2_001234_00.jpg"):
        assert not NAME.match(bad)


def test_splits_queries_distractors_junk(tiny):
    for name in syn.SYNTHETIC_DOMAINS:
        d = str(tiny / name)
        train = records(d, "bounding_box_train")
        query = records(d, "query")
        gallery = records(d, "bounding_box_test")
        train_ids = set(p for _, p, _ in train)
        query_ids = set(p for _, p, _ in query)
        gallery_ids = set(p for _, p, _ in gallery if p > 0)
        assert min(train_ids) > 0 and not train_ids & gallery_ids and not train_ids & query_ids
        assert len(train_ids) + len(gallery_ids) == TINY_IDS and len(train_ids) == TINY_IDS // 2
        assert query_ids == gallery_ids
        # one query per (identity, camera), each with a same-id gallery image from another camera
        assert len(set((p, c) for _, p, c in query)) == len(query)
        for _, pid, cam in query:
            assert any(gp == pid and gc != cam for _, gp, gc in gallery), (name, pid, cam)
        # Market-style extras, only in the gallery
        assert sum(p == 0 for _, p, _ in gallery) >= 2 and sum(p == -1 for _, p, _ in gallery) >= 2
        assert all(p > 0 for _, p, _ in query)
        # 5..15 images per identity, seen by 2..4 cameras
        per_id = {}
        for _, pid, cam in train + query + gallery:
            if pid > 0:
                per_id.setdefault(pid, []).append(cam)
        assert all(5 <= len(v) <= 15 and 2 <= len(set(v)) <= 4 for v in per_id.values())


# ------------------------------------------------------------------------------------------- determinism
def test_deterministic_across_workers_and_seed_sensitive(tiny, tmp_path):
    again = syn.ensure_synthetic(tmp_path / "again", seed=0, num_ids=TINY_IDS, workers=2, progress=False)
    a, b = tree_bytes(str(tiny)), tree_bytes(again)
    assert sorted(a) == sorted(b) and len(a) > 300
    assert all(a[k] == b[k] for k in a)
    other = syn.ensure_synthetic(tmp_path / "other", seed=1, num_ids=TINY_IDS, domains="A", workers=1,
                                 progress=False)
    c = tree_bytes(other)
    old = dict((k, v) for k, v in a.items() if k.startswith("SynthA"))
    assert set(c) != set(old)                                  # other split/frames
    same_name = set(c) & set(old)
    assert all(c[k] != old[k] for k in same_name if k.endswith(".jpg"))


def test_domains_statistically_different(tiny):
    """Brightness, colour cast and sharpness separate every pair of domains."""
    sig = {}
    for name in syn.SYNTHETIC_DOMAINS:
        rgb, sharp = [], []
        for path, _, _ in records(str(tiny / name), "bounding_box_train"):
            img = cv2.imread(path)[:, :, ::-1].astype(np.float64)
            rgb.append(img.reshape(-1, 3).mean(0))
            gray = cv2.resize(img.mean(2), (64, 128), interpolation=cv2.INTER_AREA)
            sharp.append(np.abs(cv2.Laplacian(gray, cv2.CV_64F)).mean() / (gray.mean() + 1.0))
        r, g, b = np.mean(rgb, 0)
        sig[name] = np.log([np.mean(rgb), r / b, 2 * g / (r + b), np.mean(sharp)])
    names = list(sig)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            assert np.linalg.norm(sig[names[i]] - sig[names[j]]) > 0.15, (names[i], names[j], sig)
    # the intended looks: D is the dark one, B the bluest, C the greenest and softest
    assert sig["SynthD"][0] < min(sig[n][0] for n in ("SynthA", "SynthB", "SynthC")) - 0.4
    assert sig["SynthB"][1] == min(s[1] for s in sig.values())
    assert sig["SynthC"][2] == max(s[2] for s in sig.values())
    assert sig["SynthC"][3] < sig["SynthA"][3] - 0.3


# ------------------------------------------------------------------------------------------- ensure / CLI
def test_ensure_is_idempotent_and_regenerates_when_stale(tmp_path, capsys):
    root = tmp_path / "data"
    syn.ensure_synthetic(root, seed=3, num_ids=4, domains=["SynthA", "C"], workers=1, progress=True)
    assert sorted(os.listdir(root)) == ["SynthA", "SynthC"]
    assert "synthetic SynthA,SynthC" in capsys.readouterr().err      # the tqdm bar
    meta = root / "SynthA" / "meta.json"
    one = sorted((root / "SynthA" / "query").iterdir())[0]
    before = (meta.stat().st_mtime_ns, one.stat().st_mtime_ns, (root / "SynthA").stat().st_ino)
    syn.ensure_synthetic(root, seed=3, num_ids=4, domains="A,C", workers=1, progress=False)
    assert (meta.stat().st_mtime_ns, one.stat().st_mtime_ns, (root / "SynthA").stat().st_ino) == before
    # a changed seed or a damaged set rebuilds; an untouched domain stays
    c_ino = (root / "SynthC").stat().st_ino
    syn.ensure_synthetic(root, seed=4, num_ids=4, domains="A,C", workers=1, progress=False)
    assert syn._read_meta(str(root / "SynthA"))["seed"] == 4 and (root / "SynthC").stat().st_ino != c_ino
    c_ino = (root / "SynthC").stat().st_ino
    victim = sorted((root / "SynthA" / "bounding_box_train").iterdir())[0]
    victim.unlink()
    assert not syn.is_current(str(root / "SynthA"), 4, 4)
    syn.ensure_synthetic(root, seed=4, num_ids=4, domains="A,C", workers=1, progress=False)
    assert victim.exists() and (root / "SynthC").stat().st_ino == c_ino
    assert sorted(os.listdir(root)) == ["SynthA", "SynthC"]


def test_failed_build_leaves_the_previous_domain_intact(tmp_path, monkeypatch):
    root = tmp_path / "data"
    syn.ensure_synthetic(root, seed=3, num_ids=4, domains="A", workers=1, progress=False)
    before = tree_bytes(str(root))
    calls = []

    def failing(*args):
        calls.append(args)
        if len(calls) > 5:
            raise RuntimeError("disk full")
        return b"x"

    monkeypatch.setattr(syn, "render_image", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        syn.ensure_synthetic(root, seed=4, num_ids=4, domains="A", workers=1, progress=False)
    assert os.listdir(root) == ["SynthA"]                    # the temporary build is gone
    assert tree_bytes(str(root)) == before and syn.is_current(str(root / "SynthA"), 3, 4)


def test_bad_input_is_a_user_error(tmp_path):
    from compat.errors import UserError
    with pytest.raises(UserError, match="num_ids"):
        syn.ensure_synthetic(tmp_path, num_ids=3)
    with pytest.raises(UserError, match="unknown synthetic domain"):
        syn.ensure_synthetic(tmp_path, domains="A,E")
    with pytest.raises(UserError, match="seed"):
        syn.ensure_synthetic(tmp_path, seed=-1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        syn.ensure_synthetic(tmp_path / "file", num_ids=4)
    with pytest.raises(UserError, match="unknown synthetic domain"):
        syn.main(["--out", str(tmp_path / "cli"), "--domains", "Z"])
    assert not (tmp_path / "cli").exists()


def test_cli_writes_requested_domains(tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "reid.data.synthetic", "--out", str(out), "--num-ids", "4", "--domains", "B,D",
           "--seed", "5", "--workers", "1"]
    env = child_env()
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["SynthB", "SynthD"]
    assert syn._read_meta(str(out / "SynthD"))["seed"] == 5
    assert proc.stdout.count("written") == 2
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("up to date") == 2


# ------------------------------------------------------------------------------------------- learnability proxy
def market_map(dist, q_pids, g_pids, q_cams, g_cams):
    """Market protocol mAP: same pid in the same camera is removed from each query's gallery."""
    aps = []
    for i in range(len(q_pids)):
        keep = ~((g_pids == q_pids[i]) & (g_cams == q_cams[i]))
        order = np.argsort(dist[i][keep], kind="stable")
        match = g_pids[keep][order] == q_pids[i]
        if not match.any():
            continue
        ranks = np.nonzero(match)[0] + 1.0
        aps.append(float(np.mean(np.arange(1, len(ranks) + 1) / ranks)))
    return float(np.mean(aps))


def hsv_feature(path):
    """Joint HSV histogram (8x4x4) of 6 horizontal body stripes of the central columns, Hellinger-normalised."""
    img = cv2.resize(cv2.imread(path), (32, 64), interpolation=cv2.INTER_AREA)[4:62, 8:24]
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV).astype(np.int64)
    code = (hsv[..., 0] * 8 // 180) * 16 + (hsv[..., 1] * 4 // 256) * 4 + hsv[..., 2] * 4 // 256
    f = np.sqrt(np.concatenate([np.bincount(code[band].ravel(), minlength=128)
                                for band in np.array_split(np.arange(code.shape[0]), 6)]).astype(np.float64))
    return f / np.linalg.norm(f)


def load_split(domain_dir, split):
    recs = [r for r in records(domain_dir, split) if r[1] != -1]     # junk is ignored, as Market loaders do
    feats = np.stack([hsv_feature(p) for p, _, _ in recs])
    return feats, np.array([r[1] for r in recs]), np.array([r[2] for r in recs])


def cosine_dist(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return 1.0 - a @ b.T


def lda(x, y, dims=64, reg=1e-3):
    """Fisher LDA (ridge-regularised within-class scatter): the cheapest 'trained model' on features."""
    mu = x.mean(0)
    xc = x - mu
    sw = np.zeros((x.shape[1], x.shape[1]))
    means = []
    for c in np.unique(y):
        xi = xc[y == c]
        m = xi.mean(0)
        means.append(m)
        sw += (xi - m).T @ (xi - m)
    sw = sw / len(x)
    sw += reg * np.trace(sw) / len(sw) * np.eye(len(sw))
    mb = np.array(means)
    ev, evec = np.linalg.eigh(sw)
    white = evec / np.sqrt(ev)
    _, evec2 = np.linalg.eigh(white.T @ (mb.T @ mb / len(means)) @ white)
    return mu, white @ evec2[:, ::-1][:, :dims]


def random_map(q, g, seed=0, draws=5):
    rng = np.random.default_rng(seed)
    return float(np.mean([market_map(cosine_dist(rng.normal(size=(len(q[1]), 64)), rng.normal(size=(len(g[1]), 64))),
                                     q[1], g[1], q[2], g[2]) for _ in range(draws)]))


def test_market_map_known_answer():
    # gallery: [same id same cam (removed), other id, same id other cam, same id other cam]
    dist = np.array([[0.0, 0.1, 0.2, 0.3]])
    m = market_map(dist, np.array([1]), np.array([1, 2, 1, 1]), np.array([1]), np.array([1, 2, 2, 3]))
    assert m == pytest.approx((1 / 2 + 2 / 3) / 2)
    # a distractor (pid 0) ranked between the two true matches counts as a miss
    assert market_map(np.array([[0.3, 0.2, 0.1]]), np.array([5]), np.array([5, 0, 5]), np.array([1]),
                      np.array([2, 2, 3])) == pytest.approx((1 + 2 / 3) / 2)


def test_handcrafted_feature_is_informative_but_far_from_solved(tmp_path):
    root = syn.ensure_synthetic(tmp_path, seed=0, num_ids=30, domains="A,D", workers=1, progress=False)
    for name in ("SynthA", "SynthD"):
        q = load_split(os.path.join(root, name), "query")
        g = load_split(os.path.join(root, name), "bounding_box_test")
        hsv, rnd = market_map(cosine_dist(q[0], g[0]), q[1], g[1], q[2], g[2]), random_map(q, g)
        assert hsv > 3 * rnd and hsv > 0.15, (name, hsv, rnd)
        assert hsv < 0.8, (name, hsv)


def proxy_report(root, num_ids=300, seed=0):
    """Per held-out domain: random features, raw HSV, LDA fitted on the 3 other domains, LDA on its own train."""
    root = syn.ensure_synthetic(root, seed=seed, num_ids=num_ids)
    data = dict((n, dict((s, load_split(os.path.join(root, n), s)) for s in SPLITS)) for n in syn.SYNTHETIC_DOMAINS)
    print("mAP %%  (%d ids/domain, seed %d)" % (num_ids, seed))
    print("%-7s %7s %7s %16s %14s" % ("target", "random", "HSV", "LDA(3 sources)", "LDA(own train)"))
    for target in syn.SYNTHETIC_DOMAINS:
        q, g = data[target]["query"], data[target]["bounding_box_test"]

        def mapped(mu, proj):
            return market_map(cosine_dist((q[0] - mu) @ proj, (g[0] - mu) @ proj), q[1], g[1], q[2], g[2])

        sources = [n for n in syn.SYNTHETIC_DOMAINS if n != target]
        xs = np.concatenate([data[n]["bounding_box_train"][0] for n in sources])
        ys = np.concatenate([data[n]["bounding_box_train"][1] + 10000 * i for i, n in enumerate(sources)])
        print("%-7s %7.1f %7.1f %16.1f %14.1f" % (
            target, 100 * random_map(q, g), 100 * market_map(cosine_dist(q[0], g[0]), q[1], g[1], q[2], g[2]),
            100 * mapped(*lda(xs, ys)), 100 * mapped(*lda(*data[target]["bounding_box_train"][:2]))))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--proxy":
        proxy_report(sys.argv[2])
    else:
        sys.exit("usage: python tests/test_synthetic.py --proxy DIR")
