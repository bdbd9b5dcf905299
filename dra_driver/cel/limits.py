"""The scheduler's nesting limits, checked on the parse tree before compiling.

The scheduler's parser stops at 250 levels, in two ways: sub-expressions nested inside one
another (parentheses, list elements, call arguments) give "expression recursion limit exceeded:
250"; chains of operators, field selections, member calls and indexes nested deeper than 250
give "max recursion depth exceeded". Anything within the limits must compile and evaluate here
without a RecursionError, so compiling runs with a recursion limit sized for them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from lark import Tree

from dra_driver.cel.compiler import Ast
from dra_driver.recursion import recursion_limit_at_least

MAX_DEPTH = 250
#: Python frames compiling one level may take (about a dozen tree levels per nested expression).
_FRAMES_PER_LEVEL = 40

# Tree nodes that count as one level of the parser's visitor when they do more than wrap.
_OPERATORS = frozenset(("relation", "addition", "multiplication"))
_MEMBERS = frozenset(("member_dot", "member_dot_arg", "member_index"))


def nesting_error(tree: Ast) -> str | None:
    """The scheduler's error for a too deeply nested expression, or None."""
    # Iterative: the point is to measure trees too deep to walk recursively.
    stack: list[tuple[Ast, int, int]] = [(tree, 0, 0)]
    deepest_expr = deepest_visit = 0
    while stack:
        node, exprs, visits = stack.pop()
        data = node.data
        if data == "expr":
            exprs += 1
            if len(node.children) == 3:  # a ternary
                visits += 1
        elif (data in _OPERATORS and len(node.children) == 2) or data in _MEMBERS:
            visits += 1
        deepest_expr = max(deepest_expr, exprs)
        deepest_visit = max(deepest_visit, visits)
        stack.extend((c, exprs, visits) for c in node.children if isinstance(c, Tree))
    if deepest_expr > MAX_DEPTH:
        return f"expression recursion limit exceeded: {MAX_DEPTH}"
    if deepest_visit > MAX_DEPTH:
        return "max recursion depth exceeded"
    return None


def deep_recursion() -> AbstractContextManager[None]:
    """Allow the recursion that compiling an expression within the limits needs."""
    return recursion_limit_at_least(MAX_DEPTH * _FRAMES_PER_LEVEL)
