"""bench/train_step.py --rounds: how several rounds of per-variant results become one (the figures the
performance docs quote), without running a benchmark."""
from bench.train_step import combine_rounds


def _result(basic, meta, peak, parts=None):
    result = {"basic": basic, "meta": meta, "peak_rss_mb": peak, "layer": "x", "graphs": ["build %s" % basic],
              "warmed_domains": [0, 1, 2]}
    if parts is not None:
        result["meta_parts"] = {"whole meta step": parts}
    return result


def test_rounds_give_each_number_its_median_and_keep_the_first_rounds_text():
    rounds = [{"a": _result(1.0, 10.0, 100, 5.0), "torch": _result(2.0, 20.0, 50)},
              {"a": _result(3.0, 30.0, 300, 7.0), "torch": _result(2.5, 21.0, 52)},
              {"a": _result(2.0, 11.0, 200, 6.0), "torch": _result(9.0, 22.0, 51)}]
    got = combine_rounds(rounds, ["a", "torch"])
    assert got["a"]["basic"] == 2.0 and got["a"]["meta"] == 11.0 and got["a"]["peak_rss_mb"] == 200.0
    assert got["a"]["meta_parts"] == {"whole meta step": 6.0}
    assert got["torch"]["basic"] == 2.5 and got["torch"]["meta"] == 21.0
    assert got["a"]["graphs"] == ["build 1.0"] and got["a"]["warmed_domains"] == [0, 1, 2]
    assert list(got) == ["a", "torch"]      # the variants' order, whatever order a round ran them in


def test_a_variant_killed_in_any_round_is_reported_killed():
    rounds = [{"a": _result(1.0, 10.0, 100)}, {"a": {"killed_above_mb": 4096, "peak_rss_mb": 4100.0}},
              {"a": {"killed_above_mb": 4096, "peak_rss_mb": 4200.0}}]
    got = combine_rounds(rounds, ["a"])
    assert got["a"] == {"killed_above_mb": 4096, "peak_rss_mb": 4200.0}


def test_per_round_ratios_are_taken_within_each_round(capsys):
    from bench.train_step import _print_rounds
    # the host twice as slow in round 2: every ratio within a round is the same
    rounds = [{"ms27-compiled": _result(1.2, 3.3, 130), "torch": _result(1.0, 3.0, 100)},
              {"ms27-compiled": _result(2.4, 6.6, 130), "torch": _result(2.0, 6.0, 100)}]
    _print_rounds("full", rounds, ("basic", "meta"))
    lines = capsys.readouterr().out.splitlines()
    assert "full    rounds ms27-compiled: basic 1.20 / 2.40 s; meta 3.30 / 6.60 s" in lines
    assert ("full    per-round ratios ms27-compiled: basic 1.20x torch (1.20-1.20); meta 1.10x torch (1.10-1.10); "
            "peak RSS 1.30x torch (1.30-1.30)") in lines
