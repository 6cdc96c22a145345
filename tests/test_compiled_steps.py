"""Compiled training steps (MODEL.JIT on MindSpore) with two DataParallel chunks, against op-by-op MindSpore and
against torch, step by step (`make test-compiled`; the single-split compiled steps, what the demo runs, are
compared in `make test`: tests/test_training.py::test_steps_match_between_backends[1-20]).

One teacher-forced run serves all three comparisons (tests/test_training.py's machinery): torch runs the
iterations and saves its state before every step; MindSpore op by op and compiled each start every step from
that state and take torch's fast-weight step in meta steps. Op by op runs one forward over the batch with
per-chunk batch-norm statistics (MODEL.CHUNK_FORWARDS False), the function the compiled step computes.

Run twice: with the basic and meta-train steps in one graph (MODEL.JIT_SHARED_GRAPH True, the default: two
graphs) and with a graph per step kind (False: three), the path the shared graph replaced, kept selectable.
torch's run and the op-by-op one do not depend on that option: both cases follow one of each (`leading`).

Cost: the compiled side builds its graphs, ~35-40 s each on an idle 2-core machine at this depth (26x); op by
op builds one backward per (step kind, domains per chunk).
"""
import pytest

from tests.crossenv import run_cases
from tests.test_training import assert_compiled_steps_match, following, torch_leads

pytestmark = [pytest.mark.slow, pytest.mark.parity]

ITERATIONS = 7  # 2 + 6 basic steps and 3 meta steps (iterations 0, 3, 6): every step kind, both BN modes
EXTRA = ["MODEL.NUM_SPLITS", "2", "SOLVER.MAX_EPOCH", "10", "MODEL.CHUNK_FORWARDS", "False"]


@pytest.fixture(scope="module")
def leading(synth_root, tmp_path_factory):
    """torch's teacher-forced run and MindSpore's op-by-op one following it: (keywords of a following run,
    torch's record, op by op's record)."""
    work = tmp_path_factory.mktemp("two-chunks")
    _, pt, kwargs = torch_leads(synth_root, work, ITERATIONS, EXTRA)
    eager = run_cases("mindspore", [following(kwargs, work / "ms", ["MODEL.JIT", "False"])])[0]
    return kwargs, pt, eager


@pytest.mark.parametrize("shared_graph", [True, False], ids=["shared-graph", "graph-per-step"])
def test_compiled_steps_with_two_chunks_match_op_by_op_and_torch(leading, tmp_path, shared_graph):
    kwargs, pt, eager = leading
    # in this pytest process (make test runs this file in one of its own)
    compiled = run_cases("mindspore", [following(kwargs, tmp_path / "jit", [
        "MODEL.JIT", "True", "MODEL.JIT_SHARED_GRAPH", str(shared_graph)])])[0]
    plan = [k for it in range(ITERATIONS) for k in ["basic"] * (2 if it == 0 else 1) + ["meta"] * (it % 3 == 0)]
    assert pt["kinds"] == plan
    # chunks of 8 images (4 identities) from 3 domains: some basic step had a chunk without one of them, which
    # the compiled basic graph weighs out (one graph; op by op built one function per chunk signature)
    basic = [present for kind, present in eager["signatures"] if kind == "basic"]
    assert len(basic) > 1 and any(len(chunk) < 3 for present in basic for chunk in present), basic
    assert_compiled_steps_match(plan, pt, eager, compiled, 2, shared_graph)
