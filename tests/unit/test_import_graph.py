"""The package's import graph: no cycles, and the framework never reaches into the GPU driver.

Built from the source with ``ast`` (every import, also those inside functions), so a lazy
import that closes a loop counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

PACKAGE = "dra_driver"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
#: Driver-agnostic packages: the Python counterpart of k8s.io/dynamic-resource-allocation.
FRAMEWORK = ("kubeletplugin", "resourceslice", "cdi")
GENERATED = f"{PACKAGE}._proto"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(
    tree: ast.AST, module: str, is_package: bool, modules: Collection[str]
) -> Iterator[str]:
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # ``from pkg import mod`` imports the module ``pkg.mod``, ``from pkg import
                # name`` the package ``pkg``.
                target = f"{base}.{alias.name}"
                yield target if target in modules else base


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's ``__init__`` is the package)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        if module.startswith(GENERATED):
            continue
        tree = ast.parse(path.read_text(), str(path))
        targets = _imported(tree, module, path.name == "__init__.py", files)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, if it has any (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from dra_driver.gpu import inventory, x\n")
    modules = {"dra_driver.gpu", "dra_driver.gpu.inventory"}
    assert set(_imported(tree, "dra_driver.x", False, modules)) == {
        "dra_driver.gpu",
        "dra_driver.gpu.inventory",
    }


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles() -> None:
    assert _cycle(import_graph()) is None


@pytest.mark.parametrize("framework", FRAMEWORK)
def test_framework_never_imports_the_gpu_driver(framework: str) -> None:
    graph = import_graph()
    prefix = f"{PACKAGE}.{framework}"
    leaks = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == prefix or module.startswith(prefix + ".")
        for target in targets
        if target.startswith(f"{PACKAGE}.gpu")
    )
    assert leaks == []


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_the_agent_does_not_load_the_cel_stack() -> None:
    # The node agent parses quantities (shares of shared GPUs) but never evaluates CEL.
    loaded = _closure(import_graph(), f"{PACKAGE}.agent")
    assert f"{PACKAGE}.gpu.state.device_state" in loaded
    assert sorted(m for m in loaded if m.startswith(f"{PACKAGE}.cel")) == []
