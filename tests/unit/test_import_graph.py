"""The import graph of dra_driver: no cycles, and no arrow from the framework to the driver.

Imports are read with ``ast`` (including those inside functions, which are imports all the
same), so the test needs no import side effects. An edge goes to the module named; the
parent package that Python also initialises is left out, as it is no design decision.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dra_driver"
GPU = "dra_driver.gpu"

#: Driver-agnostic modules and packages: none of them may import the GPU driver.
FRAMEWORK = (
    "dra_driver.kubeletplugin",
    "dra_driver.resourceslice",
    "dra_driver.cdi",
    "dra_driver.kube",
    "dra_driver.kubeconfig",
    "dra_driver.errors",
    "dra_driver.resourceapi",
    "dra_driver.procdevices",
)

Graph = dict[str, set[str]]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if "_proto" not in p.parts and "__pycache__" not in p.parts
    }


def _imported(tree: ast.AST, known: set[str]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    yield name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "dra_driver":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in known else node.module


def import_graph() -> Graph:
    """Module -> the project modules it imports."""
    modules = _modules()
    known = set(modules)
    return {
        name: {m for m in _imported(ast.parse(path.read_text()), known) if m != name}
        for name, path in modules.items()
    }


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _in_gpu(name: str) -> bool:
    return name == GPU or name.startswith(GPU + ".")


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "dra_driver.resourceslice.rawapi" in graph["dra_driver.resourceslice.controller"]
    assert "dra_driver.kube" in graph["dra_driver.agent"]


def test_cycle_detection_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count() -> None:
    tree = ast.parse("def f():\n    from dra_driver.gpu import inventory, x\n")
    known = {"dra_driver.gpu", "dra_driver.gpu.inventory"}
    assert set(_imported(tree, known)) == known


def test_no_cycles() -> None:
    assert cycles(import_graph()) == []


def test_framework_does_not_import_the_gpu_driver() -> None:
    graph = import_graph()
    framework = [
        name for name in graph if any(name == f or name.startswith(f + ".") for f in FRAMEWORK)
    ]
    assert len(framework) > 20
    arrows = sorted(
        f"{name} -> {target}" for name in framework for target in graph[name] if _in_gpu(target)
    )
    assert arrows == []


def _closure(graph: Graph, start: str) -> set[str]:
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
    loaded = _closure(import_graph(), "dra_driver.agent")
    assert "dra_driver.gpu.state.device_state" in loaded
    assert sorted(m for m in loaded if m.startswith("dra_driver.cel")) == []


def test_the_gpu_driver_reaches_outside_only_for_the_framework_and_small_helpers() -> None:
    # Not the API client, the claim status writer, the settings or CEL: the agent wires those.
    allowed = ("dra_driver.cdi", "dra_driver.kubeletplugin", "dra_driver.resourceslice.pool")
    allowed += ("dra_driver.errors", "dra_driver.faults", "dra_driver.metrics")
    allowed += ("dra_driver.quantity", "dra_driver.output", "dra_driver.procdevices")
    allowed += ("dra_driver.resourceapi",)  # the API's names and time format, no client
    graph = import_graph()
    outside = sorted(
        {t for m, ts in graph.items() if _in_gpu(m) for t in ts if not _in_gpu(t)}
        - {t for t in graph if any(t == a or t.startswith(a + ".") for a in allowed)}
    )
    assert outside == []
