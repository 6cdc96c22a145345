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


def on_both_backends(target, kwargs, variants=None):
    """{backend: result} of the case `target` run under MindSpore, then under torch, each in a fresh process of
    its own environment (one after the other, so they never share the CPU, and each result's `peak_rss_mb` is
    that process's own peak). `variants`: {label: (backend, extra kwargs)} instead of one run per backend."""
    variants = variants or {"mindspore": ("mindspore", {}), "torch": ("torch", {})}
    return {label: run_isolated(backend, target, dict(kwargs, **extra)) for label, (backend, extra) in variants.items()}


def run_isolated(backend, target, kwargs, timeout=3600):
    """The result of `target(**kwargs)` in a new process of `backend`'s environment, with its peak RSS."""
    import os
    import pickle
    import subprocess
    import tempfile
    from pathlib import Path
    from tests.crossenv import PYTHONS, ROOT, require_backend
    require_backend(backend)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as fh:
            pickle.dump([("bench.timing:with_peak_rss", {"target": target, "kwargs": kwargs})], fh, protocol=4)
        env = dict(os.environ, REID_BACKEND=backend, PYTHONPATH=str(ROOT))
        proc = subprocess.run([str(PYTHONS[backend]), str(ROOT / "tests" / "_crossenv_child.py"), str(src), str(dst)],
                              cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError("%s run of %s failed (rc %d):\n%s" % (backend, target, proc.returncode,
                                                                      proc.stderr[-4000:]))
        with open(dst, "rb") as fh:
            return pickle.load(fh)[0]


def with_peak_rss(target, kwargs):
    """Run `target` ("module:function") and add the process's peak resident memory (MB) to its result."""
    import importlib
    import resource
    module, name = target.split(":")
    result = getattr(importlib.import_module(module), name)(**kwargs)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return result


def layer_name():
    import compat
    info = compat.info()
    return "%s %s on %s %s" % (info["torch_api"], info["torch_api_version"], info["framework"],
                               info["framework_version"])
