"""The torchdefer package imports one way, as tests/layering/ checks for the C++ layers: no import
cycle among its modules, no private module importing the package root, and every import of a
package module at module level, where a cycle would show (docs/design.md, "Python package
layout"). Read from the sources with ast: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "bindings" / "torchdefer"
ROOT = "torchdefer"
# Modules with no .py source: the extension, and the build information CMake writes.
GENERATED = {"_C", "_build_info"}


def package_modules() -> Dict[str, ast.Module]:
    """Each module of the package by its name ("__init__" for the root), parsed."""
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.glob("*.py"))}


def _imported(node: ast.AST, names: Set[str]) -> List[str]:
    """The package modules an import statement imports ("__init__": the root itself)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
        return [t.split(".")[1] if "." in t else "__init__" for t in targets if t.split(".")[0] == ROOT]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: the package itself
        module = node.module or ""
    elif node.module is not None and node.module.split(".")[0] == ROOT:
        module = node.module[len(ROOT) + 1:]
    else:
        return []
    if module:
        return [module.split(".")[0]]
    # `from torchdefer import x`: the submodule x, or a name of the root.
    return [alias.name if alias.name in names else "__init__" for alias in node.names]


def import_graph(modules: Dict[str, ast.Module]) -> Dict[str, Set[str]]:
    """module -> the package modules it imports, anywhere in it."""
    names = set(modules) | GENERATED
    return {
        name: {target for node in ast.walk(tree) for target in _imported(node, names) if target != name}
        for name, tree in modules.items()
    }


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module,
    sorted (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in graph:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def function_level_imports(modules: Dict[str, ast.Module]) -> List[str]:
    """``module: line`` of each import of a package module inside a function or class."""
    names = set(modules) | GENERATED
    found = []
    for name, tree in modules.items():
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(scope):
                if _imported(node, names):
                    found.append(f"{name}: line {node.lineno}")
    return sorted(set(found))


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b", "torch"}, "b": set()}) == []


def test_the_graph_reads_every_form_of_import():
    source = (
        "import torchdefer\nimport torchdefer._a\nfrom torchdefer import _b, Shard\n"
        "from torchdefer._c import x\nfrom . import _d\nfrom ._e import y\nimport torch\n"
    )
    modules = {name: ast.parse("") for name in ("__init__", "_a", "_b", "_c", "_d", "_e")}
    modules["m"] = ast.parse(source)
    assert import_graph(modules)["m"] == {"__init__", "_a", "_b", "_c", "_d", "_e"}
    modules["f"] = ast.parse("def f():\n    from torchdefer import _a\n")
    assert function_level_imports(modules) == ["f: line 2"]


def test_the_package_has_no_import_cycle():
    graph = import_graph(package_modules())
    assert {"__init__", "_recording", "_materialize", "compat", "distributed"} <= set(graph)
    assert cycles(graph) == []


def test_no_private_module_imports_the_package_root():
    graph = import_graph(package_modules())
    assert [name for name, imported in graph.items() if is_private(name) and "__init__" in imported] == []


def test_package_modules_are_imported_at_module_level():
    assert function_level_imports(package_modules()) == []
