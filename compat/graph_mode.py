"""What code that may run inside a compiled graph asks about the build: whether a graph is being built now
(`in_graph`, `in_grad_graph`), and the decorator that keeps Python-only code out of it
(`eager_only`). compat.jit sets the flags around each build (`set_building`) and re-exports the three names,
their public home (`compat.jit.in_graph`, `compat.eager_only`); the modules below it (compat.norm,
compat.functional, the layers' graph modules) import them from here, so that compat.jit may use them without
a circle. The rules for code reachable from a compiled function are in compat/jit.py's docstring.
"""
import compat as _c

_state = {"graph": False, "grad_graph": False, "export": False}


def set_building(graph, grad_graph=False, export=False):
    """compat.jit, around a graph build: `graph` True while MindSpore builds one, `grad_graph` True while the
    graph is a differentiated one that hands its state updates out through gradients, `export` True while
    the graph is built to be written to a file (compat.export, on the ms27 stack)."""
    _state["graph"], _state["grad_graph"], _state["export"] = graph, grad_graph, export


def exporting():
    """True while MindSpore builds a graph for a deployment file on the ms27 stack: code then picks the ops the
    file formats take (compat.functional.vector_norm)."""
    return _state["export"]


def in_graph():
    """True while MindSpore builds a graph: a branch on it is resolved then, once, and baked into the graph."""
    return _state["graph"]


def in_grad_graph():
    """True while MindSpore builds a differentiated graph (`compat.jit.value_and_grad`, where
    `compat.jit.grad_graph_forms()`): the batch norms then take the forms such a graph needs (`compat.norm`)."""
    return _state["grad_graph"]


def eager_only(fn):
    """Decorator for code that needs Python: argument checks (label ranges, UserError), host-side bookkeeping.

    Op by op the function runs on every call with the real arguments and its result is returned. Inside a
    compiled function it becomes a compile-time constant op whose body is skipped and which returns None
    (tensor arguments have no values while the graph is built): the checks cost nothing there and the parser
    never sees their `raise` / `import` statements. (MindSpore parses every function a compiled function
    may call, even in branches that are never taken, so such code must sit behind this decorator.)
    """
    if not _c.IS_MINDSPORE:
        return fn

    from mindspore import ops

    def run(*args):
        if _state["graph"]:
            return None
        return fn(*args)

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return ops.constexpr(run, check=False, reuse_result=False)
