"""The torch-API layers compat runs on MindSpore: one package per stack, each with the same names.

    compat/layers/ms27/       mindnlp 0.5.1's top-level `mindtorch` on MindSpore 2.7 (.venv, the default)

One layer today; a torch-API layer for a later MindSpore (the next mindtorch release, for MindSpore 2.8+)
would be the second package here.

Each package holds everything that exists because of its layer, and only that: `__init__.py` (the interface
below and `DEFECTS`, the layer's table), `defects.py` (the fix of each row) and `graph.py` (what the layer's
code is replaced by while MindSpore builds a graph). The rest of compat is layer-neutral: it calls these names
on the active layer (`compat.layer`), never asks which layer it is. Adding a layer = adding a package here
with the same names and its stack in `ORDER`.

The interface (every layer package defines all of it):

    STACK                    the stack's name (the Makefile's STACK, `compat.STACK`)
    MODULE                   the torch module it provides (`compat.LAYER`)
    probe()                  whether it is installed, from its files, without importing it
    version()                its release
    before_import(mindspore) what must happen after `import mindspore` and before the layer's import
    after_import(torch)      its runtime fixes (defects.py); returns what was done
    functional(F)            the `nn.functional` compat exports as `compat.F`
    graph_forms(on)          its graph forms in place (True) or its own code back (False), around every build
    BUILDS_THROUGH_FORMS     every graph (exports and runners too) must be built with the graph forms in place
    LP_NORM_IN_GRAPHS        compiled norms use the layer's own LpNorm kernel (its op-by-op kernel)
    EXPORT_CLAMP_AS_MAXIMUM  compiled clamps with a lower bound only are written as a maximum (ONNX export)
    set_device(key)          after MindSpore's device is set: the layer's own default device ('cpu' ...)
    DEFECTS                  its table: `Defect` rows, checked by tests/test_compat_layers.py

`DEFECTS` rows: the defect (a short name; the case of the repro in repros/ where there is one), what it
breaks here without the fix, the fix (the dotted name of the function that closes it) and the test that shows
it (tests/FILE.py::FUNCTION).
"""
import collections
import importlib

# the layers in the order they are tried where several are installed (an environment holds one)
ORDER = ("ms27",)

Defect = collections.namedtuple("Defect", "name breaks fix test")


def get(stack):
    """The layer package of `stack` (one of ORDER)."""
    return importlib.import_module("compat.layers." + stack)


def installed():
    """The stacks whose layer is installed here, in ORDER."""
    return [stack for stack in ORDER if get(stack).probe()]


def table(layer):
    """The layer's DEFECTS as Markdown (defect | what it breaks | the fix | the test)."""
    rows = ["| defect | what it breaks | the fix | the test |", "|---|---|---|---|"]
    rows += ["| %s | %s | `%s` | `%s` |" % d for d in layer.DEFECTS]
    return "\n".join(rows)
