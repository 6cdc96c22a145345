"""Child side of tests/crossenv.py: run pickled case calls under this interpreter's backend.

    _crossenv_child.py IN.pkl OUT.pkl      one batch of calls, then exit (an error exits non-zero)
    _crossenv_child.py --serve FD          batches until stdin closes: each stdin line "IN.pkl<TAB>OUT.pkl",
                                           answered on descriptor FD with "ok" (OUT holds the results) or
                                           "error" (OUT holds the traceback)
"""
import os
import pickle
import sys
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from tests.crossenv import call  # noqa: E402


def run(src, dst):
    with open(src, "rb") as fh:
        calls = pickle.load(fh)
    results = [call(target, kwargs) for target, kwargs in calls]
    with open(dst, "wb") as fh:
        pickle.dump(results, fh, protocol=4)


if sys.argv[1] == "--serve":
    answers = os.fdopen(int(sys.argv[2]), "w")
    for line in sys.stdin:
        src, dst = line.rstrip("\n").split("\t")
        try:
            run(src, dst)
            answer = "ok"
        except Exception:
            with open(dst, "wb") as fh:
                pickle.dump(traceback.format_exc()[-4000:], fh, protocol=4)
            answer = "error"
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(answer + "\n")
        answers.flush()
else:
    run(sys.argv[1], sys.argv[2])
