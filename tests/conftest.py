import atexit
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", category=DeprecationWarning)

# The feature extractor's cache (exported files, compiled graphs: reid.runtime.user_cache_dir) goes to a
# folder of this session, never the user's ~/.cache/acl-reid; subprocesses inherit it.
os.environ["REID_CACHE"] = tempfile.mkdtemp(prefix="reid-test-cache-")
atexit.register(shutil.rmtree, os.environ["REID_CACHE"], True)


def pytest_sessionstart(session):
    """REID_TEST_DEVICE=gpu|ascend (tools/gpu_ms27.sh): this process's backend on that device for the whole
    session (MindSpore's device is global and set before the first op); the reference environments that parity
    tests call stay on their CPU. Unset, nothing is imported here."""
    device = os.environ.get("REID_TEST_DEVICE", "").strip()
    if device:
        import compat
        compat.set_device(device)


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory):
    """A tiny synthetic data root (4 domains of 16 identities) shared by the training tests; read-only."""
    from reid.data.synthetic import ensure_synthetic
    root = tmp_path_factory.mktemp("data")
    ensure_synthetic(str(root / "synthetic"), seed=0, num_ids=16, workers=1, progress=False)
    return str(root)


@pytest.fixture(scope="session")
def cli_run(synth_root, tmp_path_factory):
    """One tiny training as a user runs it: the installed acl-reid-train, from a folder of its own, the checkout
    not on PYTHONPATH, with tests/test_training.py's `cli_train_opts` (the tiny recipe, 2 epochs of 2
    iterations, evaluated before training and after each epoch). Returns (OUTPUT_DIR, stdout). Shared:
    test_training.py checks what it writes and that train.py, supervised through two crashes, ends where it
    did; test_commands.py converts, evaluates, exports, indexes and searches its weights."""
    from tests.test_commands import command
    from tests.test_training import cli_train_opts
    work = tmp_path_factory.mktemp("cli")
    out = work / "run"
    proc = command("acl-reid-train", cli_train_opts(synth_root, out), work)
    return out, proc.stdout


@pytest.fixture(scope="session")
def retrieval_world(tmp_path_factory, synth_root):
    """The synthetic target (SynthD) copied as a plain folder tree of query/ and bounding_box_test/, the
    training images weights are calibrated on (tests/test_retrieval.py make_weights), and the demo-width
    ResNet-50-IBN-a baseline's weights ("baseline")."""
    import glob
    import os
    import shutil
    from tests.test_retrieval import BASELINE, make_weights, one_torch_thread
    root = tmp_path_factory.mktemp("retrieval")
    domain = os.path.join(synth_root, "synthetic", "SynthD")
    for sub in ("query", "bounding_box_test"):
        shutil.copytree(os.path.join(domain, sub), str(root / "plain" / sub))
    train = sorted(glob.glob(os.path.join(domain, "bounding_box_train", "*.jpg")))[::2]
    with one_torch_thread():
        weights = make_weights(root / "baseline.pth", BASELINE, calibrate_on=train)
    return {"root": root, "data": synth_root, "query": str(root / "plain" / "query"), "train": train,
            "gallery": str(root / "plain" / "bounding_box_test"), "baseline": weights}
