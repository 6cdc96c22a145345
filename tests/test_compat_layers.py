"""compat/layers/: every layer package has the same interface, and its table (`DEFECTS`, and the same table in
its docstring for a reader) names fixes, tests and repro cases that exist. Read from the source with `ast`:
no stack needs to be installed, and none is imported."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = os.path.join(ROOT, "compat", "layers")
INTERFACE = ("STACK", "MODULE", "probe", "version", "before_import", "after_import", "functional", "graph_forms",
             "set_device", "BUILDS_THROUGH_FORMS", "LP_NORM_IN_GRAPHS", "EXPORT_CLAMP_AS_MAXIMUM", "DEFECTS")
SAME_MODULES = ("__init__.py", "defects.py", "graph.py")
# repro cases that are no row: alternatives compat does not take (trace mode, bytecode capture) and a
# MindSpore defect the ms27 stack no longer has (docs/ms27.md)
NOT_ROWS = {"side-effects", "trace-tuples", "trace-grad", "bytecode-module"}


def _stacks():
    tree = _parse(os.path.join(LAYERS, "__init__.py"))
    order = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "ORDER")
    return ast.literal_eval(order)


def _parse(path):
    with open(path, encoding="utf-8") as fh:
        return ast.parse(fh.read(), path)


def _top_names(tree):
    """Names a module binds at its top level (also inside top-level `if` / `try` blocks)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names.add(t.id)
    return names


def _defects(tree):
    """The DEFECTS rows: (name, breaks, fix, test) as literals (string concatenations evaluated)."""
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    rows = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "DEFECTS")

    def value(expr):
        if isinstance(expr, ast.BinOp):
            return value(expr.left) + value(expr.right)
        if isinstance(expr, ast.Name):
            return consts[expr.id]
        return ast.literal_eval(expr)
    return [tuple(value(arg) for arg in call.args) for call in rows.elts]


def _module_file(dotted):
    """The file of the module part of `dotted` (package.module.name) and the name in it."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        base = os.path.join(ROOT, *parts[:cut])
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.exists(path):
                return path, parts[cut]
    raise AssertionError("no module for %s" % dotted)


def _cases(stack):
    """The case names of the repros of `stack` (repros/<stack>_*.py), from their CASES dicts."""
    found = set()
    folder = os.path.join(ROOT, "repros")
    for name in sorted(os.listdir(folder)):
        if name.startswith(stack + "_") and name.endswith(".py"):
            tree = _parse(os.path.join(folder, name))
            for node in tree.body:
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CASES":
                    found |= {k.value for k in node.value.keys}
    return found


def test_the_layers_are_the_supported_stacks():
    """ORDER names the default stack, and every layer package under compat/layers/ is in it (a package left out
    of ORDER would never be tried; a name in ORDER without a package fails at import)."""
    stacks = _stacks()
    assert stacks[0] == "ms27"
    packages = sorted(d for d in os.listdir(LAYERS) if os.path.isfile(os.path.join(LAYERS, d, "__init__.py")))
    assert sorted(stacks) == packages, (stacks, packages)


def test_the_interface_is_documented_and_is_all_layer_neutral_code_asks_of_a_layer():
    """compat/layers/__init__.py documents every name of INTERFACE, and compat outside compat/layers/ asks the
    active layer (`compat.layer`, the layer package the backend loaded) for those names only: a second layer
    that defines INTERFACE is all compat needs."""
    doc = ast.get_docstring(_parse(os.path.join(LAYERS, "__init__.py")))
    documented = {line.split()[0].split("(")[0] for line in doc.splitlines() if line.startswith("    ")
                  and line.split()}
    assert set(INTERFACE) <= documented, set(INTERFACE) - documented
    asked = set()
    pattern = re.compile(r"\b(?:_c|compat)\.layer\.([A-Za-z_]+)|\blayer\.([A-Za-z_]+)\(")
    for folder, dirs, files in os.walk(os.path.join(ROOT, "compat")):
        dirs[:] = [d for d in dirs if d not in ("layers", "__pycache__")]
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    asked |= {a or b for a, b in pattern.findall(fh.read())}
    assert {"graph_forms", "set_device", "after_import", "version"} <= asked, asked
    assert asked <= set(INTERFACE), asked - set(INTERFACE)


@pytest.mark.parametrize("stack", _stacks())
def test_each_layer_has_the_same_modules_and_names(stack):
    folder = os.path.join(LAYERS, stack)
    assert set(SAME_MODULES) <= set(os.listdir(folder))
    names = _top_names(_parse(os.path.join(folder, "__init__.py")))
    assert not set(INTERFACE) - names, set(INTERFACE) - names


@pytest.mark.parametrize("stack", _stacks())
def test_each_row_of_a_layers_table_names_a_fix_a_test_and_its_repro(stack):
    tree = _parse(os.path.join(LAYERS, stack, "__init__.py"))
    rows = _defects(tree)
    assert rows
    doc = ast.get_docstring(tree)
    table = [line for line in doc.splitlines() if line.startswith("| ")]
    assert len(table) == len(rows) + 1          # the header, then one line per row, in the same order
    cases = _cases(stack)
    named = set()
    for (name, breaks, fix, test), line in zip(rows, table[1:]):
        assert line.startswith("| %s | %s |" % (name, breaks)), (line, name)
        assert fix.split(".")[-1] in line and test.split("/")[-1] in line, line
        path, attr = _module_file(fix)
        assert attr in _top_names(_parse(path)), fix
        test_file, test_name = test.split("::")
        assert test_name in _top_names(_parse(os.path.join(ROOT, test_file))), test
        named |= set(name.split(", "))
    # every repro case of this stack is a row (or one of the named exceptions)
    assert cases - NOT_ROWS <= named, cases - NOT_ROWS - named


def test_layer_neutral_code_never_asks_which_layer_it_is():
    """compat/ and reid/ outside compat/layers/ take a layer's behaviour from its package (`compat.layer`), not
    from comparing names."""
    bad = []
    for package in ("compat", "reid"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if d not in ("layers", "__pycache__")]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as fh:
                        text = fh.read()
                    for needle in ('LAYER == "', "LAYER != \"", 'STACK == "', 'STACK != "', "IS_MINDTORCH"):
                        if needle in text:
                            bad.append("%s: %s" % (os.path.relpath(path, ROOT), needle))
    assert not bad, bad
