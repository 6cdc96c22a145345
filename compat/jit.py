"""Compiled (static-graph) execution on MindSpore; plain eager calls on torch.

    fwd = compat.jit.compiled(fn, name)               # fwd(*tensors) -> fn(*tensors), one graph per input signature
    vg = compat.jit.value_and_grad(fn, params, name)  # vg(*tensors) -> (loss, aux, grads), like compat.value_and_grad
    compat.jit.prepare(model)                         # once per model, before its first compiled call

On MindSpore `compiled` wraps `fn` in `mindspore.jit`, and `value_and_grad` compiles loss, gradients and the
aux outputs into one graph. MindSpore builds the graph by *parsing* the Python source of `fn` and of everything
it calls (modules' forward included), not by tracing it. So code reachable from a compiled function follows
these rules (tests/test_compiled.py compares every module type, tests/test_training.py every step kind,
against op-by-op execution):

- no in-place tensor ops (`add_`, `inplace=True`, `out=`): compiled, they give wrong values without an error;
- no device->host reads (`.asnumpy()`, `float(t)`, numpy on tensors): compiled, they read garbage;
- no `raise` of the project's exception classes, no `with`, no function-local `import` (parse errors), even
  in branches that are not taken. Input checks and bookkeeping that need Python run under
  `if not torch.compiler.is_compiling()` (True while compat builds a graph; compat's own code uses
  `eager_only`): op by op as usual, skipped inside a compiled function (where tensor values do not exist yet);
- containers are passed by value: a callee that writes into a dict it was given leaves the caller's dict
  unchanged (no error; the key is missing later), so callees return what they computed. Lists of tuples of
  tensors fail to compile in some places ("Expect tensor type"): use tuples. No `dict(key=...)`, no dict
  comprehensions, no `.detach()` (the layer's does not parse: a comparison needs none), no `.eq()`;
- a MindSpore export may switch its "JIT fallback" (how graphs run Python they cannot compile: dict outputs,
  the torch-API layer's `warnings.warn`...) off for the rest of the process by setting the process variable
  MS_DEV_ENABLE_FALLBACK_RUNTIME=0; graphs built after that return a dict as a tuple or fail to parse.
  compat/export.py exports inside `fallback_kept()`, which puts the variable back, and a graph build here stops
  with a UserError if it finds the variable set behind the user's back;
- a tensor that is broadcast over a feature map in an elementwise op is expanded first (`w.expand_as(x) * x`,
  not `w * x`): a broadcasting CPU kernel in a graph can keep several times its output for the life of the graph
  (bench/graph_memory.py measures it), `BroadcastTo` and same-shape kernels keep nothing.
  tests/test_modeling_units.py finds implicit broadcasts over feature maps in the network;
- Python state (a module's dict attributes, `model.training`, globals) is read once, when the graph is built,
  and is baked into it. Callers therefore build one compiled function per configuration of that state (step
  kind, batch-norm mode) and cache it; `in_graph()` is True while a graph is
  being built, so code can pick a graph-friendly formulation at that time.

Compiled training steps (reid/engine/steps.py, MODEL.JIT) follow this contract: the differentiated function
takes only tensors (images, labels, domains; meta steps also their domain ids as 0-d tensors); everything else it
reads (model, loss settings as plain Python values, label offsets, chunk count) is fixed when it is built, and
it is cached per step kind (the basic step's losses weigh every source domain by whether the batch holds it;
a meta batch holds a fixed number of domains per chunk; by default the basic and meta-train steps share one
graph that weighs the two objectives by tensor arguments); the batch-norm mode is set
around the call; fast weights are written into the parameters around the call (`swap_in` / `restore`) rather
than passed in, which is exact for first-order steps (the step is detached); `fn` returns (loss, dict of scalar
terms); gradients come back for every parameter (zeros where unused) and optimizer updates run outside the
graph.

Every Parameter and buffer a graph touches must have a unique name: `prepare(model)` names them by their
`named_parameters()` / `named_buffers()` names (MindSpore refuses duplicates). Buffers must be Parameters
there (see `state_buffer`). Tensor *methods* compile to MindSpore's own, whose keywords differ from torch's
(`x.sum(1, keepdim=True)` fails at run time): use positional forms or compat helpers in compiled code.

Compile cache (`set_cache_dir`, MODEL.COMPILE_CACHE): building a graph is mostly MindSpore's type inference
over the Python source it parsed (docs/performance.md#build-time), so a later process can
load the graph MindSpore saved instead (its `enable_compile_cache`). That cache is unsafe as MindSpore ships it:
it numbers graphs by the order a process compiles them and checks the source of only some files, so a graph
can load another graph's file without any error, and a function's graph comes back with zero weights unless
the weights are registered first; it also hashes the entry script and what it imports, so train.py's
graphs would never load in test.py (`_fixed_dependencies`). So here a graph is cached only when its caller
names its `owner` (the module whose parameters and buffers it reads) and a `key` (the Python state it bakes
in), and each graph gets a directory of its own, named by a hash of that key, its name, its inputs' shapes
and dtypes, the owner's parameter names and shapes, the MindSpore / torch-API versions and the source of
compat/ and reid/: any change there builds (and saves) anew. The cache is on only while such a graph is
built. Graphs MindSpore cannot write to its cache (the training-step graphs: "Cannot export a interpret node
in MindIR") are built again without it: MODEL.JIT's graphs are therefore not given a key. The weights are
registered with the executor `mindspore.jit` compiles with (`_graph_executor`: MindSpore 2.7 has two).

Memory: what a build frees stays resident in the heap's holes unless glibc is asked to hand it back, which
`_Timed` does once per build (compat/allocator.py).

The CPU kernel pool is sized to the machine's cores when compat is imported (`set_threads`; MindSpore's
default is 30 threads whatever the machine), overridable with REID_NUM_THREADS or MODEL.NUM_THREADS.

Built graphs run on a helper thread at the lowest CPU priority (`set_helper_thread`, MODEL.JIT_HELPER_THREAD),
the calling thread asleep until the outputs are there: MindSpore's runtime spin-waits in the thread that waits
for a graph for as long as the graph runs (the thread that next waits for its asynchronous queue, at full
speed), and on a machine with few cores that thread
takes CPU from the graph's own kernel threads (docs/performance.md#helper-thread). At nice 19 the spinning gets
only what the kernel threads leave; the calling thread's own priority, which op-by-op work and data loading run
at, is untouched. The first call, which builds the graph, stays on the calling thread.
"""
import contextlib
import functools
import hashlib
import os
import time

import numpy as np

import compat as _c
from compat import allocator
from compat.graph_mode import (eager_only, exporting, in_graph, set_building,  # noqa: F401 (public here)
                               in_grad_graph)

_state = {"threads": None, "cache_dir": None, "source": None, "helper_thread": True, "helper": None}
log = print  # replaced by callers that log elsewhere; the compile-time line is printed once per graph


def compiled_form(graph_fn):
    """Decorator for a method: inside graphs MindSpore parses `graph_fn` (same signature) instead of it.

    For a method whose Python generality compiled code never needs, e.g. a lookup that only op-by-op code
    can hit: every branch of a method a graph calls is specialised for each call site, so a branch-free
    compiled form keeps the graph (and its build time and memory) smaller. The classes' methods are swapped
    only while a graph is built (`_Timed`); op by op, and on torch, the method itself runs. `graph_fn` must
    give the method's result in every state compiled code can be in."""
    def mark(fn):
        if not _c.IS_MINDSPORE:
            return fn
        return _CompiledForm(fn, graph_fn)
    return mark


class _CompiledForm:
    """Placeholder a `compiled_form` method stays in the class body: it registers (class, name, method, graph
    form) when the class is made and puts the plain method in its own place."""

    def __init__(self, fn, graph_fn):
        self.fn, self.graph_fn = fn, graph_fn

    def __set_name__(self, owner, name):
        setattr(owner, name, self.fn)
        _COMPILED_FORMS.append((owner, name, self.fn, self.graph_fn))


_COMPILED_FORMS = []


def _swap_forms(graph):
    """Put every registered compiled form (graph True) or the method itself (False) in place, and the torch-API
    layer's graph forms (its `graph_forms`: compat/layers/ms27/graph.py)."""
    for owner, name, fn, graph_fn in _COMPILED_FORMS:
        setattr(owner, name, graph_fn if graph else fn)
    if _c.layer is not None:
        _c.layer.graph_forms(graph)


@contextlib.contextmanager
def building(grad=False, export=False):
    """Around MindSpore's parse of the project's code (a compiled function's first call; on a layer that
    `BUILDS_THROUGH_FORMS` also an export, `export` True): `in_graph()` True (`grad`: `in_grad_graph()`
    too; `export`: `exporting()`), the compiled forms in place and the torch-API layer's graph forms
    (compat/layers/)."""
    set_building(True, grad, export)
    _swap_forms(True)
    try:
        yield
    finally:
        set_building(False, False)
        _swap_forms(False)


def state_buffer(array):
    """A float32 buffer for module state that compiled code updates (running statistics): a tensor on torch,
    a Parameter without gradient on MindSpore (a compiled graph can only write Parameters). Register it with
    `module.register_buffer`; `prepare` gives it its unique name."""
    tensor = _c.as_tensor(np.asarray(array, np.float32))
    if not _c.IS_MINDSPORE:
        return tensor
    return _c.nn.Parameter(tensor, requires_grad=False)  # the torch-API layer's Parameter: a mindspore one


def prepare(model):
    """Give every parameter and buffer of `model` its full name (MindSpore graphs need unique names) and
    ask the batch-norm kernel what it saves (compat.norm.probe_kernel). Idempotent; a no-op on torch."""
    if not _c.IS_MINDSPORE:
        return model
    import mindspore
    from compat.norm import probe_kernel
    probe_kernel()  # eager, before any graph: compiled batch norm bakes its answer in
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if isinstance(p, mindspore.Parameter):
            if p.name != name:
                p.name = name
        elif _is_graph_weight(p):
            # mindnlp's mindtorch (ms27): its Parameter is a Tensor that graphs take for a weight by MindSpore's
            # marker and its `param_info` (named by a random uuid, and read-only through `name`)
            p.param_info.name = name
    _direct_construct(model)
    return model


def _is_graph_weight(t):
    """Whether a graph reads tensor `t` as a weight (a Parameter to MindSpore's parser) although it is not a
    `mindspore.Parameter`: the ms27 layer's Parameter class."""
    return hasattr(t, "__parameter__") and hasattr(t, "param_info")


def _direct_construct(model):
    """Make each module class's `forward` its MindSpore `construct` (on the torch-API layer's module classes
    whose `construct` is the layer's trampoline `construct(self, *inputs, **kwargs): return self.forward(...)`).

    A graph calls a submodule by parsing its `construct`; the trampoline's variadic packing and unpacking is
    specialised for every call site, a large share of a graph's nodes (docs/performance.md#build-time). With
    `forward` itself as `construct` the graph calls the layer's code directly. Op by op nothing changes: the
    layer's `__call__` (hooks and all) calls `construct` with the same arguments, which now is `forward`."""
    base = _c.nn.Module
    trampoline = base.__dict__.get("construct")
    if trampoline is None:
        return
    for module in model.modules():
        cls = type(module)
        forward = getattr(cls, "forward", None)
        if (getattr(cls, "construct", None) is trampoline and forward is not None
                and forward is not base.__dict__.get("forward")):
            cls.construct = forward


def steps_supported():
    """Whether compiled training steps (MODEL.JIT) build on this stack: on MindSpore (through `grad_graph_forms`
    and the layer's graph forms, compat/layers/ms27/graph.py)."""
    return _c.IS_MINDSPORE


def grad_graph_forms():
    """Whether differentiated graphs are built with forms of their own here (on MindSpore), `in_grad_graph()`
    True while they are built: the batch norms run the pure training kernel and hand their running-statistics
    update out as the gradient of the running statistics (compat.norm's statistics tap; `value_and_grad`'s
    `state`), and aux dicts leave as tuples: a dict output of a differentiated graph fails to build on 2.7
    (`repros/ms27_defects.py dict-aux`; docs/ms27.md#step-graphs)."""
    return _c.IS_MINDSPORE


def enabled(flag):
    """Whether a MODEL.JIT setting means compiled training steps here (torch runs eagerly; see steps_supported)."""
    return bool(flag) and steps_supported()


def swap_in(params, steps):
    """Write p - step into every parameter (no gradient) and return copies of the old values for `restore`.
    On MindSpore one in-place `AssignSub` kernel per parameter (the same subtraction): not the layer's `-` then
    an assign, two ops through the torch-API layer's Python (several times as long on the ms27 stack)."""
    saved = snapshot(params)
    for p, step in zip(params, steps):
        if _c.IS_MINDSPORE:
            _ms_ops.assign_sub(p, step)
        else:
            _c.assign_(p, p - step)
    return saved


def snapshot(tensors):
    """Copies of the values of `tensors` (e.g. the parameters `swap_in` overwrites), for `restore`."""
    return [_copy(t) for t in tensors]


def restore(params, saved):
    for p, value in zip(params, saved):
        _c.assign_(p, value)


def _copy(t):
    if _c.IS_MINDSPORE:
        return _c.torch.cast_to_adapter_tensor(_ms_ops.deepcopy(t))
    return t.detach().clone()


def default_threads():
    """REID_NUM_THREADS if set, else the CPU cores this process may use."""
    env = os.environ.get("REID_NUM_THREADS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise _c.UserError("REID_NUM_THREADS must be a positive integer, got %r" % env) from None
        if value < 1:
            raise _c.UserError("REID_NUM_THREADS must be a positive integer, got %r" % env)
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def set_threads(num_threads=None):
    """Size MindSpore's CPU kernel pool: `num_threads`, or (0/None) `default_threads()`. Runs at import of
    compat with the default; MODEL.NUM_THREADS > 0 calls it again. Returns the count (None on torch, which
    keeps its own setting).

    MindSpore also gets as many threads to run a graph's kernels side by side
    (`inter_op_parallel_num`, at least 2): with its default some training-step graphs (the basic step's of a
    graph per step kind) ran much slower than others of the same size, the calling thread spinning while it
    waits for them (docs/ms27.md#graph-layout)."""
    if not _c.IS_MINDSPORE:
        return None
    n = int(num_threads) if num_threads else default_threads()
    if n < 1:
        raise _c.UserError("MODEL.NUM_THREADS must be >= 0 (0 = one per core), got %r" % (num_threads,))
    if _state["threads"] != n:
        import mindspore
        mindspore.set_context(runtime_num_threads=n, inter_op_parallel_num=max(2, n))
        _state["threads"] = n
    return n


def set_step_graph_layout(shared):
    """Tell the runtime how the compiled training steps are laid out before their graphs are built: `shared`,
    the basic and meta-train steps in one graph (MODEL.JIT_SHARED_GRAPH), else a graph per step kind. On
    MindSpore the two layouts want opposite settings of `inter_op_parallel_num` (set_threads'
    side-by-side kernels): a graph per step kind runs its basic-step graph much slower without them, the shared
    graph slower with them (docs/ms27.md#graph-layout), so the shared layout goes back to MindSpore's default.
    Nothing to do on torch."""
    if not _c.IS_MINDSPORE:
        return
    import mindspore
    n = _state["threads"] or default_threads()
    mindspore.set_context(inter_op_parallel_num=0 if shared else max(2, n))


def _split(out):
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], out[1]
    return out, None


def set_jit_level(level):
    """MindSpore's JitConfig jit_level ("O0"-"O2") for graphs built from now on; None: MindSpore's default.
    The level hardly changes a build's time (the build is type inference, which the level does not touch:
    docs/performance.md#build-time); kept for bench/graph_build.py --jit-level."""
    _state["jit_level"] = level or None


def _jit(fn):
    import mindspore
    if _state.get("jit_level"):
        return mindspore.jit(fn, jit_level=_state["jit_level"])
    return mindspore.jit(fn)


def set_cache_dir(path):
    """Keep compiled graphs that name an owner and a key under `path` (created on first use), for later
    processes to load (module docstring); None: keep none. No-op on torch. Call it before the first graph."""
    _state["cache_dir"] = os.path.abspath(os.path.expanduser(path)) if path else None


def cache_dir():
    return _state["cache_dir"]


def _source_digest():
    """sha256 of every .py file of compat/ and reid/ (what a graph is parsed from), computed once."""
    if _state["source"] is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        digest = hashlib.sha256()
        for package in ("compat", "reid"):
            for folder, dirs, files in sorted(os.walk(os.path.join(root, package))):
                dirs.sort()
                for name in sorted(f for f in files if f.endswith(".py")):
                    path = os.path.join(folder, name)
                    digest.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as fh:
                        digest.update(hashlib.sha256(fh.read()).digest())
        _state["source"] = digest.hexdigest()
    return _state["source"]


def _weights(owner):
    """{name: Parameter} of `owner`'s parameters and Parameter buffers (running statistics), by the names
    `prepare` gave them: what a graph loaded from the cache binds its weights to."""
    import mindspore
    weights = {}
    for _, p in list(owner.named_parameters()) + list(owner.named_buffers()):
        if isinstance(p, mindspore.Parameter) or _is_graph_weight(p):
            weights[p.name] = p
    return weights


def _graph_dir(name, owner, key, args):
    """The cache directory of one graph: its name and a hash of everything it depends on."""
    import mindspore
    info = _c.info()
    parts = [name, key, mindspore.__version__, info["torch_api"], info["torch_api_version"], _source_digest()]
    parts += ["%s %s %s" % (n, tuple(p.shape), p.dtype) for n, p in sorted(_weights(owner).items())]
    parts += ["arg %s %s" % (tuple(a.shape), a.dtype) if hasattr(a, "shape") else "arg %r" % (a,) for a in args]
    digest = hashlib.sha256("\n".join(str(p) for p in parts).encode()).hexdigest()[:20]
    return os.path.join(_state["cache_dir"], "%s-%s" % (name, digest))


def _cache_files(folder):
    """{path: (mtime, size)} of the graph files under `folder`: unchanged by a first call = loaded, not built
    (a graph that fails to load is built and its file written again)."""
    found = {}
    for sub, _, files in os.walk(folder):
        for f in files:
            if f.endswith(".mindir"):
                st = os.stat(os.path.join(sub, f))
                found[os.path.join(sub, f)] = (st.st_mtime_ns, st.st_size)
    return found


def _fixed_dependencies():
    """MindSpore invalidates its cache when the hash of the entry script and of the repository files it imports
    changes: train.py's graphs would never load in test.py. The graph folders' names already hash the source
    of compat/ and reid/, so MindSpore is given one fixed file to hash instead (this one)."""
    from mindspore.common import api
    api._get_compile_cache_dep_files = lambda: [os.path.abspath(__file__)]


def _cache_on(name, owner, key, args):
    """Before building a cached graph (a cache folder is set, and the caller named an owner and a key): switch
    MindSpore's compile cache on, aimed at this graph's own folder, with the owner's weights registered.
    Returns that folder, else None (cache left off)."""
    if _state["cache_dir"] is None or owner is None or key is None:
        return None
    import mindspore
    folder = _graph_dir(name, owner, key, args)
    _fixed_dependencies()
    _graph_executor().set_weights_values(_weights(owner))
    mindspore.set_context(enable_compile_cache=True, compile_cache_path=folder)
    return folder


def _cache_off():
    """After building a cached graph: the cache off again, so that no other graph is saved or loaded. (The
    context flag alone does not do it: MindSpore caches while the executor holds dependency files.)"""
    import mindspore
    mindspore.set_context(enable_compile_cache=False)
    _graph_executor().set_compile_cache_dep_files([])


def _graph_executor():
    """The executor `mindspore.jit` builds and loads graphs with: MindSpore 2.7 has two, the second one for
    functions compiled in PyNative mode (`JitExecutor_`, where `_run_jit_pipeline()`), which is the one whose
    registered weights a graph loaded from the cache binds to. (Registered with the first one instead, a
    loaded evaluation graph runs without them: its features are all zeros.)"""
    from mindspore import _c_expression
    run_jit = getattr(_c_expression, "_run_jit_pipeline", None)
    if run_jit is not None and run_jit():
        return _c_expression.JitExecutor_.get_instance()
    return _c_expression.GraphExecutor_.get_instance()


def resident_mb(field="VmRSS"):
    """This process's resident memory in MB (Linux; None elsewhere); field "VmHWM": its high-water mark."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) / 1024.0 for line in fh if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


HELPER_NICE = 19


def _run_and_wait(jitted, args):
    """`mindspore.jit`'s own call of a built graph, then a wait until its kernels are done, both on the thread
    that calls this (the helper). The call only queues the graph and returns; whichever
    thread next waits for the queue (`AsyncRQueue::Wait`) spins at full speed until it is empty, so the wait
    belongs on the helper at nice 19, not in the caller's next read of an output."""
    out = jitted(*args)
    _c.synchronize()
    return out


class _HelperThread:
    """One daemon thread at nice HELPER_NICE that runs the calls given to `call`, one at a time, while the
    caller sleeps on an event; the call's exception is raised again in the caller."""

    def __init__(self):
        import queue
        import threading
        self._queue, self._threading = queue.Queue(), threading
        self.native_id, self.calls = None, 0
        started = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(started,), name="compat-jit-graph-runner",
                                        daemon=True)
        self._thread.start()
        started.wait()

    def _loop(self, started):
        self.native_id = self._threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, self.native_id, HELPER_NICE)   # Linux: a thread's own nice value
        except (AttributeError, OSError):   # elsewhere the helper runs at the caller's priority
            pass
        started.set()
        while True:
            fn, args, box, done = self._queue.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:   # handed to the caller, which raises it
                box.append((False, exc))
            done.set()

    def call(self, fn, *args):
        box, done = [], self._threading.Event()
        self._queue.put((fn, args, box, done))
        done.wait()
        self.calls += 1
        ok, value = box[0]
        if not ok:
            raise value
        return value


def _helper():
    if _state["helper"] is None:
        _state["helper"] = _HelperThread()
    return _state["helper"]


def set_helper_thread(enabled):
    """Run built graphs on the low-priority helper thread (True, the default) or on the calling thread."""
    _state["helper_thread"] = bool(enabled)


def helper_thread():
    """The helper thread's (native id, calls run so far), or None before its first call."""
    helper = _state["helper"]
    return None if helper is None else (helper.native_id, helper.calls)


FALLBACK_VARIABLE = "MS_DEV_ENABLE_FALLBACK_RUNTIME"


def _c_getenv(name):
    """The process environment's value of `name` as C code sees it (MindSpore sets variables with setenv, which
    os.environ does not see), or None."""
    import ctypes
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    value = getenv(name.encode())
    return None if value is None else value.decode()


@contextlib.contextmanager
def fallback_kept():
    """Around code that builds export-named graphs (module docstring): FALLBACK_VARIABLE as it was before."""
    if not _c.IS_MINDSPORE:
        yield
        return
    before = _c_getenv(FALLBACK_VARIABLE)
    try:
        yield
    finally:
        if _c_getenv(FALLBACK_VARIABLE) != before:
            if before is None:
                os.unsetenv(FALLBACK_VARIABLE)
            else:
                os.putenv(FALLBACK_VARIABLE, before)


def _check_fallback():
    """A UserError if FALLBACK_VARIABLE is "0" in the process but not in os.environ (set by MindSpore itself,
    not by the user): graphs built now would be wrong."""
    if _c_getenv(FALLBACK_VARIABLE) == "0" and os.environ.get(FALLBACK_VARIABLE) != "0":
        raise _c.UserError("MindSpore's JIT fallback is off in this process (MS_DEV_ENABLE_FALLBACK_RUNTIME=0, "
                           "left by a graph export made outside compat.export): compiled graphs built now would "
                           "give wrong outputs; export through reid.deploy / compat.export or in another process")


def _signature(args):
    """What a graph is specialised on in its inputs: each tensor's shape and dtype, other values as they are."""
    return tuple((tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") and hasattr(a, "dtype") else repr(a)
                 for a in args)


class _Timed:
    """Calls a mindspore.jit function; the first call builds the graph (or loads it from the compile cache)
    and logs how long that took, the resident memory it left and the process's new peak if it set one. Later
    calls go through `mindspore.jit`'s own call (`_run_and_wait`), on the helper thread unless
    `set_helper_thread(False)`."""

    def __init__(self, jitted, name, owner=None, key=None, grad=False):
        self.jitted, self.name, self.owner, self.key, self.grad = jitted, name, owner, key, grad
        self.compile_seconds, self.compile_cpu_seconds, self.loaded = None, None, None
        # resident MB before the build and after it (None where not measured)
        self.memory = (None, None)
        # the input signature (shapes, dtypes) the graph was built for, and the graphs of other signatures
        self.signature, self.others = None, {}

    def __call__(self, *args):
        if self.compile_seconds is not None:
            signature = _signature(args)
            if signature != self.signature:
                # another input signature is another graph, built (with the graph forms in place) by a _Timed
                # of its own
                if signature not in self.others:
                    self.others[signature] = _Timed(self.jitted, self.name, self.owner, self.key, self.grad)
                return self.others[signature](*args)
            if _state["helper_thread"]:
                return _helper().call(_run_and_wait, self.jitted, args)
            return self.jitted(*args)
        self.signature = _signature(args)
        from mindspore.common.api import ms_compile_cache
        _check_fallback()
        start, cpu_start = time.perf_counter(), time.process_time()
        rss_before, hwm_before = resident_mb(), resident_mb("VmHWM")
        phases_before = set(ms_compile_cache)
        folder = _cache_on(self.name, self.owner, self.key, args)
        before = _cache_files(folder) if folder else {}
        note = "; cached in %s" % folder if folder else ""
        try:
            with building(self.grad):
                try:
                    out = self.jitted(*args)
                except RuntimeError as exc:
                    if folder is None or "export" not in str(exc):
                        raise
                    # MindSpore could not write this graph to the cache (e.g. "Cannot export a interpret node
                    # in MindIR"): build it again without the cache
                    _cache_off()
                    folder, note = None, "; not cacheable (%s)" % str(exc).strip().splitlines()[0]
                    out = self.jitted(*args)
        finally:
            if folder is not None:
                _cache_off()
        built = set(ms_compile_cache) - phases_before
        if built:
            # what the build freed stays resident in the heap's holes otherwise (compat/allocator.py)
            allocator.give_back_free_pages()
        rss_built, hwm_built = resident_mb(), resident_mb("VmHWM")
        self.compile_seconds = time.perf_counter() - start
        self.compile_cpu_seconds = time.process_time() - cpu_start
        self.memory = (rss_before, rss_built)
        self.loaded = bool(folder) and bool(before) and _cache_files(folder) == before
        if log is not None:
            how = "loaded from the compile cache" if self.loaded else "compiled"
            mem = ""
            if rss_before is not None and rss_built is not None:
                mem = "; resident memory %+.0f MB" % (rss_built - rss_before)
                if hwm_built is not None and hwm_before is not None and hwm_built > hwm_before:
                    # the process's peak was set during this build (its type inference or first run)
                    mem += "; new peak %.0f MB during it" % hwm_built
            log("graph %s %s in %.1f s (first call included; %.1f s of CPU)%s%s" % (
                self.name, how, self.compile_seconds, self.compile_cpu_seconds, mem, note))
        return out


def compiled(fn, name, owner=None, key=None):
    """`fn` (tensors in, tensors / tuples / dicts of tensors out) compiled on MindSpore; `fn` itself on torch.
    Keep the returned object: each one builds its own graph on its first call. With `owner` (the module whose
    weights `fn` reads, after `prepare`) and `key` (text naming the Python state `fn` bakes in) the graph is
    kept in the compile cache when `set_cache_dir` named one."""
    if not _c.IS_MINDSPORE:
        return fn

    @functools.wraps(fn)
    def graph_fn(*args):
        return fn(*args)
    graph_fn.__name__ = graph_fn.__qualname__ = name
    run = _Timed(_jit(graph_fn), name, owner, key)

    torch = _c.torch

    def call(*args):
        return _cast_tree(run(*args), torch)
    call.graph = run
    return call


def value_and_grad(fn, params, name, state=()):
    """Compiled counterpart of `compat.value_and_grad`: `fn(*args)` returns a scalar loss or (loss, aux), aux a
    dict of scalars or a tuple of such dicts; the call returns (loss, aux, grads), one gradient per parameter
    (zero where unused). On torch this is `compat.value_and_grad` (eager). Never cached: MindSpore cannot
    write these graphs to its compile cache ("Cannot export a interpret node in MindIR").

    The graph is built with `in_grad_graph()` True (`grad_graph_forms`: MindSpore) and writes no Parameter:
    its batch norms in mode 'general' hand torch's running-statistics update out as the gradient of their
    running statistics (compat.norm), and `state`, the module state `fn` updates (the running statistics), is
    differentiated with the parameters: the call adds those gradients to it, so the caller sees what the same
    code op by op does (`call(..., update_state=False)` leaves the state as it was). Aux dicts leave the graph
    as tuples of values (a dict output of a differentiated graph fails to build on 2.7) and are rebuilt here
    with the keys read while it was built."""
    params, state = list(params), list(state)
    if not _c.IS_MINDSPORE:
        return _c.value_and_grad(fn, params)
    import mindspore
    torch = _c.torch
    grad_forms = grad_graph_forms()
    token = "%s#%d" % (name, len(_AUX_KEYS))   # this graph's entry in _AUX_KEYS (names repeat across models)
    _AUX_KEYS[token] = {}
    def loss_and_aux(*args):
        loss, aux = _split(fn(*args))
        if aux is None:  # has_aux needs an aux output: a detached copy of the loss, dropped again below
            return loss, loss
        if grad_forms:
            # dicts leave as tuples of values, converted before the differentiation (a lone dict made into a
            # tuple of one): a dict output of the differentiated function fails to build on 2.7, and one taken
            # apart after it (`tuple(aux.values())`) makes the graph several times slower
            if isinstance(aux, dict):
                _note_aux_keys_c(token, "lone", True)
                aux = (aux,)
            values = ()
            index = 0
            for part in aux:
                _note_aux_keys_c(token, index, tuple(part.keys()))
                values = values + (tuple(part.values()),)
                index = index + 1
            return loss, values
        return loss, aux

    grad_fn = mindspore.value_and_grad(loss_and_aux, None, params + state, has_aux=True)

    def graph_fn(*args):
        (loss, aux), grads = grad_fn(*args)
        return loss, aux, grads
    graph_fn.__name__ = graph_fn.__qualname__ = name
    run = _Timed(_jit(graph_fn), name, grad=grad_forms)

    def call(*args, update_state=True):
        loss, aux, grads = run(*args)
        if _c.is_tensor(aux):
            aux = None
        else:
            aux = _cast_tree(_with_keys(aux, _AUX_KEYS[token] or None), torch)
        n = len(params)
        if update_state:
            for p, step in zip(state, grads[n:]):
                _ms_ops.assign_add(p, step)
        return _cast_tree(loss, torch), aux, tuple(_cast_tree(g, torch) for g in grads[:n])
    call.graph = run
    return call


_AUX_KEYS = {}  # graph token -> {i: keys of the i-th dict of its aux tuple; "lone": True where aux was one dict}


def _note_aux_keys(name, index, keys):
    """Evaluated while graph `name` is built (a compile-time constant op): the keys of its aux dict(s)."""
    _AUX_KEYS[name][index] = keys
    return 0


def _with_keys(values, keys):
    """aux as the graph gave it (values) back into dicts with the keys `_note_aux_keys` recorded; None:
    unchanged."""
    if keys is None:
        return values
    dicts = tuple(dict(zip(keys[i], v)) for i, v in enumerate(values))
    return dicts[0] if keys.get("lone") else dicts


def _cast_tree(obj, torch):
    if isinstance(obj, dict):
        return {k: _cast_tree(v, torch) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_tree(v, torch) for v in obj)
    if obj is None or isinstance(obj, (int, float, str)):
        return obj
    return torch.cast_to_adapter_tensor(obj)


if _c.IS_MINDSPORE:
    from mindspore import ops as _ms_ops
    _note_aux_keys_c = _ms_ops.constexpr(_note_aux_keys, check=False)
