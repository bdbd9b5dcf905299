"""Why a selector did not match a device: the false part and the device values it read.

Only the top level is taken apart: for ``a && b && c`` the first conjunct that is false, for
``a || b`` all alternatives (each was false). Inside that part, every
``device.attributes[domain].name`` / ``device.capacity[domain].name`` lookup is evaluated on its
own and reported with its value, so ``memory.compareTo(quantity("80Gi")) >= 0 is false`` comes
with ``memory = 40Gi``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lark import Token, Tree

from dra_driver.cel.compiler import Ast, Node
from dra_driver.cel.environment import Program
from dra_driver.cel.errors import EvalError, NoSuchKey
from dra_driver.cel.values import format_value
from dra_driver.quantity import Quantity


@dataclass(frozen=True)
class Read:
    """One device value a sub-expression looked at."""

    expression: str
    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"


@dataclass(frozen=True)
class Explanation:
    """The part of the selector that was false, and the device values it read."""

    failed: str
    reads: tuple[Read, ...] = field(default=())

    def __str__(self) -> str:
        text = f"{self.failed} is false"
        if self.reads:
            text += " (" + ", ".join(str(r) for r in self.reads) + ")"
        return text

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "failed": self.failed,
            "values": [
                {"name": r.name, "expression": r.expression, "value": r.value} for r in self.reads
            ],
        }


_subtrees: dict[tuple[str, int, int], Node] = {}


def _node(program: Program, tree: Ast) -> Node:
    # Explanations revisit the same parts for every non-matching device: compile each once.
    key = (program.expression, tree.meta.start_pos, tree.meta.end_pos)
    node = _subtrees.get(key)
    if node is None:
        node = _subtrees[key] = program.compile_subtree(tree)
    return node


def _source(program: Program, tree: Ast) -> str:
    return program.expression[tree.meta.start_pos : tree.meta.end_pos].strip()


def _strip(tree: Ast) -> Ast:
    """Descend single-child wrappers and parentheses to the node that does the work."""
    while True:
        children = [c for c in tree.children if isinstance(c, Tree)]
        if len(tree.children) == 1 and len(children) == 1:
            tree = children[0]
        else:
            return tree


def _chain(tree: Ast, kind: str) -> list[Ast]:
    # conditionaland/conditionalor are left-recursive: flatten a && b && c into [a, b, c].
    parts: list[Ast] = []
    while tree.data == kind and len(tree.children) == 2:
        left, right = tree.children
        assert isinstance(left, Tree) and isinstance(right, Tree)
        parts.insert(0, right)
        tree = left
    parts.insert(0, tree)
    return parts


def _top(tree: Ast) -> Ast:
    """The top-level && or || node (looking through parentheses), or the whole expression."""
    current = tree
    while True:
        inner = _strip(current)
        if inner.data in ("conditionaland", "conditionalor"):
            return inner
        if inner.data == "expr" and len(inner.children) == 3:
            return inner
        if inner is current:
            return inner
        current = inner


def explain(program: Program, variables: dict[str, Any], driver: str) -> Explanation:
    """Explain a selector that evaluated to false for the device in ``variables``."""
    top = _top(program.tree)
    if top.data == "conditionaland":
        for part in _chain(top, "conditionaland"):
            if _value(program, part, variables) is False:
                inner = _top(part)
                if inner.data == "conditionaland" and inner is not top:
                    return explain_part(program, inner, variables, driver)
                return Explanation(_source(program, part), _reads(program, part, variables, driver))
    parts = _chain(top, "conditionalor") if top.data == "conditionalor" else [top]
    reads: list[Read] = []
    for part in parts:
        reads.extend(r for r in _reads(program, part, variables, driver) if r not in reads)
    return Explanation(_source(program, program.tree), tuple(reads))


def explain_part(
    program: Program, tree: Ast, variables: dict[str, Any], driver: str
) -> Explanation:
    """Explain a nested && chain (a parenthesised conjunction inside the top-level one)."""
    for part in _chain(tree, "conditionaland"):
        if _value(program, part, variables) is False:
            return Explanation(_source(program, part), _reads(program, part, variables, driver))
    return Explanation(_source(program, tree), _reads(program, tree, variables, driver))


def _value(program: Program, tree: Ast, variables: dict[str, Any]) -> Any:
    try:
        return _node(program, tree).fn(variables)
    except EvalError as exc:
        return exc


def _device_access(tree: Ast) -> bool:
    """Whether ``tree`` is ``device.attributes[d].name`` / ``device.capacity[d][name]``."""
    if tree.data not in ("member_dot", "member_index"):
        return False
    domain = _strip(tree.children[0]) if isinstance(tree.children[0], Tree) else None
    if domain is None or domain.data != "member_index":
        return False
    field_tree = domain.children[0]
    field_node = _strip(field_tree) if isinstance(field_tree, Tree) else None
    if field_node is None or field_node.data != "member_dot":
        return False
    device, name = field_node.children
    device_node = _strip(device) if isinstance(device, Tree) else None
    return (
        isinstance(name, Token)
        and str(name) in ("attributes", "capacity")
        and device_node is not None
        and device_node.data in ("ident", "dot_ident")
        and str(device_node.children[0]) == "device"
    )


def _access_name(program: Program, tree: Ast, variables: dict[str, Any], driver: str) -> str:
    domain_tree = _strip(tree.children[0])  # type: ignore[arg-type]
    key_tree = domain_tree.children[1]
    domain = _value(program, key_tree, variables) if isinstance(key_tree, Tree) else ""
    last = tree.children[1]
    name = str(last) if isinstance(last, Token) else str(_value(program, last, variables))
    return name if domain == driver else f"{domain}/{name}"


def _format(value: Any) -> str:
    if isinstance(value, NoSuchKey):
        return "<not set>"
    if isinstance(value, EvalError):
        return f"<error: {value}>"
    if isinstance(value, Quantity):
        human = value.human()
        return value.text if human == value.text else f"{value.text} ({human})"
    return format_value(value)


_accesses: dict[tuple[str, int, int], list[Ast]] = {}


def _access_trees(program: Program, tree: Ast) -> list[Ast]:
    # The device lookups inside a part are found once per expression, not once per device.
    key = (program.expression, tree.meta.start_pos, tree.meta.end_pos)
    found = _accesses.get(key)
    if found is None:
        subtrees = tree.iter_subtrees_topdown()  # type: ignore[no-untyped-call]
        found = _accesses[key] = [sub for sub in subtrees if _device_access(sub)]
    return found


def _reads(program: Program, tree: Ast, variables: dict[str, Any], driver: str) -> tuple[Read, ...]:
    found: list[Read] = []
    for sub in _access_trees(program, tree):
        read = Read(
            _source(program, sub),
            _access_name(program, sub, variables, driver),
            _format(_value(program, sub, variables)),
        )
        if read not in found:
            found.append(read)
    return tuple(found)
