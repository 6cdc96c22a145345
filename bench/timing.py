"""Shared timing helper of the benchmarks."""
import os
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


# The MindSpore stacks by their environment (docs/install.md): `--stacks` times each against torch in
# one run (one stack today; a second torch-API layer would add its environment here). Without it the MindSpore
# side is the interpreter running the benchmark when it has MindSpore, else .venv (the default stack).
STACK_ENVS = {"ms27": ".venv"}
RETIRED_STACKS = {"msadapter": "the legacy msadapter stack (MindSpore 2.0 + MSAdapter 0.1.0, Python 3.9) was retired; "
                               "use the default stack: --stacks ms27 (.venv)"}


def size_args(doc, sizes, default=None, extra=None):
    """The benchmarks' common command line: --sizes (comma-separated keys of `sizes`; all unless `default`),
    --repeats and --stacks; `extra(parser)` adds a benchmark's own options."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if extra is not None:
        extra(parser)
    parser.add_argument("--sizes", default=default or ",".join(sizes), help="comma-separated: %s" % ", ".join(sizes))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stacks", default="", help="comma-separated MindSpore stacks to time, each against "
                        "torch in this one run: %s (default: the MindSpore side of tests/crossenv.py)"
                        % ", ".join(STACK_ENVS))
    args = parser.parse_args()
    retired = [RETIRED_STACKS[s] for s in args.stacks.split(",") if s in RETIRED_STACKS]
    if retired:
        parser.error(retired[0])
    unknown = [s for s in args.stacks.split(",") if s and s not in STACK_ENVS]
    if unknown:
        parser.error("unknown stack %s; use %s" % (", ".join(unknown), ", ".join(STACK_ENVS)))
    return args


def stack_variants(stacks, extra=None):
    """`on_both_backends` variants for the `--stacks` value: {label: (backend, kwargs, python)}, torch last;
    labels are the stack names, or 'mindspore' when `stacks` is empty. `extra`: {label suffix: kwargs} adds,
    per MindSpore stack, a variant with those kwargs (e.g. {'-jit': {'jit': True}})."""
    from tests.crossenv import PYTHONS, ROOT
    names = [s for s in stacks.split(",") if s]
    base = [(n, ROOT / STACK_ENVS[n] / "bin" / "python") for n in names] or [("mindspore", None)]
    variants = {}
    for label, python in base:
        variants[label] = ("mindspore", {}, python)
        for suffix, kwargs in (extra or {}).items():
            variants[label + suffix] = ("mindspore", kwargs, python)
    # with stacks, every side names its interpreter: the calling one may have any backend (or none) active
    variants["torch"] = ("torch", {}, PYTHONS["torch"] if names else None)
    return variants


def on_both_backends(target, kwargs, variants=None):
    """{backend: result} of the case `target` run under MindSpore, then under torch, each in a fresh process of
    its own environment (one after the other, so they never share the CPU, and each result's `peak_rss_mb` is
    that process's own peak). `variants`: {label: (backend, extra kwargs[, python])} instead of one run per
    backend; `python` (an interpreter path) picks that backend's environment (`stack_variants`)."""
    variants = variants or {"mindspore": ("mindspore", {}), "torch": ("torch", {})}
    return {label: run_isolated(v[0], target, dict(kwargs, **v[1]), python=v[2] if len(v) > 2 else None)
            for label, v in variants.items()}


def run_isolated(backend, target, kwargs, timeout=3600, python=None, max_rss_mb=None, environ=None):
    """The result of `target(**kwargs)` in a new process of `backend`'s environment (or of the interpreter
    `python`), with its peak RSS. `max_rss_mb`: a watchdog polls the process's resident memory and kills it
    above that (an address-space limit would not do: MindSpore reserves far more than it touches); the result
    is then {"killed_above_mb": max_rss_mb, "peak_rss_mb": the last reading}. `environ`: variables set in the
    process's environment (what must hold before the framework is imported)."""
    import os
    import pickle
    import subprocess
    import tempfile
    from pathlib import Path
    from tests.crossenv import PYTHONS, ROOT, require_backend
    if python is None:
        require_backend(backend)
        python = PYTHONS[backend]
    elif not Path(python).exists():
        raise SystemExit("%s is missing; run 'make setup'" % python)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as fh:
            pickle.dump([("bench.timing:with_peak_rss", {"target": target, "kwargs": kwargs})], fh, protocol=4)
        env = dict(os.environ, REID_BACKEND=backend, PYTHONPATH=str(ROOT), **(environ or {}))
        command = [str(python), str(ROOT / "tests" / "_crossenv_child.py"), str(src), str(dst)]
        if max_rss_mb:
            killed = _watched(command, env, timeout, max_rss_mb, Path(tmp))
            if killed is not None:
                return {"killed_above_mb": max_rss_mb, "peak_rss_mb": killed}
            proc = subprocess.CompletedProcess(command, 0, "", (Path(tmp) / "stderr").read_text())
        else:
            proc = subprocess.run(command, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError("%s run of %s failed (rc %d):\n%s" % (backend, target, proc.returncode,
                                                                      proc.stderr[-4000:]))
        with open(dst, "rb") as fh:
            return pickle.load(fh)[0]


def _rss_mb(pid, field="VmRSS"):
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _watched(command, env, timeout, max_rss_mb, tmp):
    """Run `command`, polling its resident memory twice a second: kill it above `max_rss_mb` and return the
    reading, else None once it ends (a non-zero exit raises, with its stderr)."""
    import subprocess
    from tests.crossenv import ROOT
    with open(tmp / "stderr", "w") as err:
        proc = subprocess.Popen(command, cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=err)
        start = time.time()
        while proc.poll() is None:
            rss = _rss_mb(proc.pid)
            if rss > max_rss_mb:
                proc.kill()
                proc.wait()
                return rss
            if time.time() - start > timeout:
                proc.kill()
                raise RuntimeError("run timed out after %d s" % timeout)
            time.sleep(0.5)
    if proc.returncode != 0:
        raise RuntimeError("run failed (rc %d):\n%s" % (proc.returncode, (tmp / "stderr").read_text()[-4000:]))
    return None


_discarded_peak_mb = [0.0]  # the highest high-water mark reset_peak_rss has cleared in this process


def reset_peak_rss():
    """Start this process's resident-memory high-water mark (VmHWM) again from its current RSS (Linux:
    clear_refs 5), so that a later reading is the peak of what ran in between. The kernel's getrusage peak is
    cleared with it, so the mark cleared is kept for `with_peak_rss`, which still gives the process's peak."""
    _discarded_peak_mb[0] = max(_discarded_peak_mb[0], _rss_mb(os.getpid(), "VmHWM"))
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def with_peak_rss(target, kwargs):
    """Run `target` ("module:function") and add the process's peak resident memory (MB) to its result."""
    import importlib
    import resource
    module, name = target.split(":")
    result = getattr(importlib.import_module(module), name)(**kwargs)
    result["peak_rss_mb"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, _discarded_peak_mb[0])
    return result


def layer_name():
    import compat
    info = compat.info()
    return "%s %s on %s %s" % (info["torch_api"], info["torch_api_version"], info["framework"],
                               info["framework_version"])
