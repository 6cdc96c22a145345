"""Child side of tests/crossenv.py: run pickled case calls under this interpreter's backend."""
import pickle
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from tests.crossenv import call  # noqa: E402

with open(sys.argv[1], "rb") as fh:
    calls = pickle.load(fh)
results = [call(target, kwargs) for target, kwargs in calls]
with open(sys.argv[2], "wb") as fh:
    pickle.dump(results, fh, protocol=4)
