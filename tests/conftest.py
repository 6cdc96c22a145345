import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory):
    """A tiny synthetic data root (4 domains of 16 identities) shared by the training tests; read-only."""
    from reid.data.synthetic import ensure_synthetic
    root = tmp_path_factory.mktemp("data")
    ensure_synthetic(str(root / "synthetic"), seed=0, num_ids=16, workers=1, progress=False)
    return str(root)
