"""The scheduler's runtime cost limit: 1,000,000 units per selector and device.

The scheduler charges every step of evaluation (1 per variable or field read, per function
call, 10 per list literal, ...) and stops a selector at 1,000,000 with "operation cancelled:
actual cost limit exceeded". Only loops can get near that limit (a selector is at most 10 KiB
and device strings are short), so the engine counts where loops are: each iteration of a
comprehension is charged the static cost of its step and body, and ``lists.range(n)`` n + 11,
which is how the scheduler's cost grows (measured against it: an iteration of ``all`` costs
3 plus its body). Selectors without loops carry no counter at all.
"""

from __future__ import annotations

from typing import Any

from lark import Tree

from dra_driver.cel.errors import Abort

LIMIT = 1_000_000
#: Where an evaluation's running cost lives in its scope (not a valid CEL identifier).
KEY = "@cost"
#: The fixed part of one comprehension iteration: the loop condition and accumulator step.
ITERATION = 3
#: lists.range(n) costs n plus this, besides the 1 of the call itself.
RANGE_BASE = 10

_READS = frozenset(("ident", "dot_ident", "member_dot", "member_index", "member_opt_dot"))
_CALLS = frozenset(("ident_arg", "dot_ident_arg", "member_dot_arg", "unary_not", "unary_neg"))
_OPERATORS = frozenset(("relation", "addition", "multiplication"))


#: Macros: their variables are not reads, and their bodies are charged per iteration.
MACROS = frozenset(
    ("all", "exists", "exists_one", "existsOne", "map", "filter", "transformList",
     "transformMap", "optMap", "optFlatMap", "sortBy")
)  # fmt: skip


def static_cost(tree: Tree[Any]) -> int:
    """The cost of evaluating ``tree`` once, every branch taken, loop bodies not counted."""
    total = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        data = node.data
        if data == "member_dot_arg" and (
            str(node.children[1]) in MACROS or _is_namespace(node.children[0])
        ):
            # One call; a namespace (lists.range) is no read, a macro's body is not here.
            total += 1
            target = node.children[0]
            if isinstance(target, Tree) and str(node.children[1]) in MACROS:
                stack.append(target)
            continue
        if data in _READS or data in _CALLS or (data in _OPERATORS and len(node.children) == 2):
            total += 1
        elif data == "list_lit":
            total += 10
        elif data == "map_lit":
            total += 30
        stack.extend(c for c in node.children if isinstance(c, Tree))
    return total


_NAMESPACES = frozenset(("lists", "sets", "strings", "optional"))


def _is_namespace(tree: Any) -> bool:
    while isinstance(tree, Tree) and len(tree.children) == 1:
        tree = tree.children[0]
    return not isinstance(tree, Tree) and str(tree) in _NAMESPACES


def charge(scope: dict[str, Any], amount: int) -> None:
    """Add ``amount`` to the evaluation's cost; the scheduler's error past the limit."""
    counter = scope.get(KEY)
    if counter is None:
        return
    counter[0] += amount
    if counter[0] > LIMIT:
        raise Abort("operation cancelled: actual cost limit exceeded")
