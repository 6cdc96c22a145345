"""No import circle among the modules of compat/ and reid/.

The graph is read from the source with `ast`, without importing anything: an edge A -> B for every import in
module A of a module B of these packages, at module level and inside functions alike (a function-local import
closes a circle as soon as it runs), and for `importlib.import_module("...")` with a literal name. `from P
import n` is an edge to the submodule P.n where that is a module, else to P. A module's own parent packages
are not edges, whether imported implicitly or by name (`import compat as _c` in compat/jit.py): Python has
begun initialising them before the module itself, so importing them never runs their `__init__` from it
(compat/__init__.py loads its submodules lazily, on first use of a name it exports).

Run as a script with a repository root to list the circles of another checkout:
`python tests/test_import_graph.py /path/to/checkout`.
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("compat", "reid")


def modules(root, packages=PACKAGES):
    """{dotted module name: path} of every .py file under the packages."""
    found = {}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _imported(node, module, is_package):
    """The dotted names a statement or call imports (not yet checked against the packages' modules)."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        return [(base, alias.name) for alias in node.names]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "importlib" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [(node.args[0].value, None)]
    return []


def import_graph(root=ROOT, packages=PACKAGES):
    """{module: {imported module: first line of that import}} over the packages' own modules."""
    found = modules(root, packages)
    graph = {}
    for module, path in found.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        edges = graph.setdefault(module, {})
        for node in ast.walk(tree):
            for base, name in _imported(node, module, path.endswith("__init__.py")):
                target = base + "." + name if name and base + "." + name in found else base
                if target in found and target != module and not module.startswith(target + "."):
                    edges.setdefault(target, node.lineno)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def describe(graph, component):
    """The edges inside one circle, one per line: 'a -> b (line n)'."""
    inside = set(component)
    return "\n".join("%s -> %s (line %d)" % (a, b, line) for a in component
                     for b, line in sorted(graph[a].items()) if b in inside)


def test_compat_and_reid_have_no_import_circle():
    graph = import_graph()
    assert graph["compat.norm"] and graph["reid.engine.trainer"]  # the packages and their imports were found
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n\n".join(describe(graph, c) for c in found)


def test_cycle_finder_sees_a_function_local_import_and_not_a_parent_package(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("def load():\n    from pkg import d\n    return d\n")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (tmp_path / "pkg" / "c.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg as _p\n")
    graph = import_graph(str(tmp_path), ("pkg",))
    assert graph["pkg.b"] == {"pkg.a": 2} and graph["pkg.c"] == {"pkg.a": 2}
    assert graph["pkg"] == {"pkg.d": 2} and graph["pkg.d"] == {}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


if __name__ == "__main__":
    root = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    graph = import_graph(root)
    found = cycles(graph)
    for component in found:
        print(describe(graph, component) + "\n")
    print("%d import circle(s) among %d modules under %s" % (len(found), len(graph), root))
    sys.exit(1 if found else 0)
