"""Shared timing helper of the benchmarks."""
import time

import numpy as np


def median_seconds(named_calls, repeats):
    """{name: median seconds of `repeats` calls} for each (name, zero-argument callable), each called once
    first as a warm-up (kernel selection and graph building happen on the first call of each shape)."""
    result = {}
    for name, call in named_calls:
        call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        result[name] = float(np.median(times))
    return result


def size_args(doc, sizes, default=None):
    """The benchmarks' common command line: --sizes (comma-separated keys of `sizes`; all unless `default`)
    and --repeats."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=default or ",".join(sizes), help="comma-separated: %s" % ", ".join(sizes))
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def on_both_backends(target, kwargs):
    """{backend: result} of the case `target` run under MindSpore, then under torch (each in its own
    environment, one after the other, so they never share the CPU)."""
    from tests.crossenv import run_cases
    return {backend: run_cases(backend, [(target, kwargs)], timeout=3600)[0] for backend in ("mindspore", "torch")}


def layer_name():
    import compat
    info = compat.info()
    return "%s %s on %s %s" % (info["torch_api"], info["torch_api_version"], info["framework"],
                               info["framework_version"])
