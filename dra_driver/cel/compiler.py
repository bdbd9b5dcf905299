"""Compile a parsed CEL expression into a tree of Python closures.

cel-python supplies the grammar and parser (a lark tree). Its own interpreter walks that tree on
every evaluation and resolves every name through layered activations, which costs about 0.7 ms
per selector and device; it also has no way to call member functions of custom types or
namespaced functions (``sets.contains``). So each tree node is turned once into a closure that
takes the variable scope (a dict) and returns the value; member calls ``x.f(a)`` become
``MEMBER["f"](x, a)`` and dotted names are resolved while compiling.

Runtime errors are raised as :class:`EvalError`; ``&&``, ``||`` and ``?:`` catch them where CEL
says an error is absorbed (``false && error`` is ``false``). Compile errors carry line and column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from lark import Token, Tree

from dra_driver.cel import (
    checker,
    cost,
    functions,
    lib_lists,
    lib_strings,
    lib_time,
    messages,
    optional,
    regex,
)
from dra_driver.cel.errors import Abort, CompileError, EvalError, NoSuchKey, NoSuchOverload
from dra_driver.cel.lib_core import QUALIFIED_TYPE_NAMES, TYPE_NAMES
from dra_driver.cel.signatures import SIGNATURES
from dra_driver.cel.types import GO_TYPE_NAMES, CelType, Duration, Timestamp, Uint, type_name
from dra_driver.cel.values import (
    INT64_MAX,
    INT64_MIN,
    cel_compare,
    cel_eq,
    check_int,
    check_uint,
    equal,
    format_value,
    is_missing,
    map_lookup,
)
from dra_driver.errors import DriverError

Scope = dict[str, Any]
QUANTITY = "kubernetes.Quantity"
SEMVER = "kubernetes.Semver"
Ast = Tree[Token]
Eval = Callable[[Scope], Any]


@dataclass(frozen=True)
class Node:
    """A compiled sub-expression: its closure and its static type."""

    fn: Eval
    type: str = "dyn"
    #: True when the value does not depend on variables (literals, calls on literals).
    const: bool = False
    #: True for a list literal whose elements are all literals of a primitive type.
    primitive_list: bool = False
    #: True when the scheduler's planner knows the value too: literals, and conversions of
    #: such values (which it evaluates while planning, so their errors are compile errors).
    planned: bool = False
    #: The scheduler's cost of evaluating this node, as far as it is known while compiling:
    #: without what depends on the values (charged when evaluated, see cost.py) and without
    #: the parts evaluated only sometimes (branches, later terms of && and ||, loop bodies).
    cost: int = 0
    #: True for an attribute in the scheduler's planner (a variable, a field or index
    #: selection, a conditional), which further selections extend at 1 each.
    attr: bool = False
    #: What this attribute pays for its variable (1; 0 for a conditional), which it does not
    #: pay as the branch of a conditional.
    base: int = 0


def _const(value: Any, kind: str, planned: bool = False, cost: int = 0) -> Node:
    return Node(lambda _scope: value, kind, const=True, planned=planned, cost=cost)


#: Conversions of a constant are evaluated when the scheduler builds the program, so their
#: failure is a compile error there ("program instantiation failed").
_REGEX_FUNCTIONS = frozenset(("matches", "find", "findAll"))
_CONVERSIONS = frozenset(
    ("int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "duration", "timestamp")
)


def _folded(fn: Eval, kind: str, args: list[Node], name: str, counting: bool, sized: bool) -> Node:
    # Calls whose arguments are all constant (quantity("40Gi"), semver("8.0.0")) are evaluated
    # once here instead of per device; one that fails stays a runtime error, as CEL requires,
    # except for the conversions the scheduler folds while planning (which cost nothing
    # there; the other calls still cost what they cost, now known).
    fixed = sum(a.cost for a in args)
    if args and all(a.const for a in args):
        conversion = name in _CONVERSIONS and len(args) == 1 and args[0].planned
        try:
            value = fn({})
        except EvalError as exc:
            if conversion:
                raise _PlanError(str(exc)) from None
        else:
            if conversion:
                return _const(value, kind, planned=True)
            price = cost.price(name, [a.fn({}) for a in args], value) if sized else 1
            return _const(value, kind, cost=fixed + price)
    if sized:
        return Node(_priced(fn, name) if counting else fn, kind, cost=fixed)
    return Node(fn, kind, cost=fixed + 1)


class _PlanError(DriverError):
    # Raised while compiling, turned into a CompileError at the call's position.
    pass


class Compiler:
    """Turns one expression's lark tree into closures; knows the declared variables."""

    def __init__(
        self,
        expression: str,
        variables: Mapping[str, str],
        objects: Mapping[str, Mapping[str, str]] | None = None,
        counting: bool = False,
    ) -> None:
        """``variables`` maps names to static types; ``objects`` gives object types' fields;
        ``counting``: closures charge the evaluation's cost (see cost.py)."""
        self.expression = expression
        self.variables = dict(variables)
        self.objects = dict(objects or {})
        self.bound: list[tuple[str, str]] = []  # macro variables (name, type) in scope
        # Inside the argument list of string.format, literals may mix types, as there.
        self.mixed_literals = 0
        #: Whether evaluation counts its cost (see cost.py): closures whose cost depends on
        #: values charge it, and parts evaluated only sometimes charge theirs when they are.
        self.counting = counting

    # -- helpers ---------------------------------------------------------------------------

    def fail(self, where: Ast | Token, message: str) -> NoReturn:
        """Raise a :class:`CompileError` at ``where``."""
        if isinstance(where, Token):
            line, column = where.line or 1, where.column or 1
        else:
            meta = where.meta
            found_line: int | None = getattr(meta, "line", None)
            found_column: int | None = getattr(meta, "column", None)
            if found_line is None or found_column is None:
                # Operator nodes carry no position: use their first token's.
                first = next(where.scan_values(lambda v: isinstance(v, Token)), None)
                found_line, found_column = (first.line, first.column) if first else (1, 1)
            line, column = found_line or 1, found_column or 1
        raise CompileError(self.expression, message, line, column)

    def fail_unplaced(self, message: str) -> NoReturn:
        """Raise a :class:`CompileError` the scheduler reports without a position (those it
        finds while building the program rather than while checking)."""
        raise CompileError(self.expression, message, 0, 0)

    def check(self, where: Ast | Token, name: str, receiver: str | None, args: list[str]) -> str:
        """The result type of calling ``name``; a compile error when no overload matches."""
        signatures = SIGNATURES.get(name)
        if signatures is None:
            return "dyn"
        result = checker.resolve(signatures, receiver, args)
        if result is None:
            self.fail(
                where,
                f"found no matching overload for '{name}' applied to "
                f"'{checker.describe_call(receiver, args)}'",
            )
        return result

    def sized(self, name: str, receiver: str | None, args: list[str]) -> bool:
        """Whether a call of ``name`` costs by the size of its values (cost.DYNAMIC), which
        for some the scheduler knows only when it knows the overload (cost.BY_OVERLOAD)."""
        if name not in cost.DYNAMIC:
            return False
        if name not in cost.BY_OVERLOAD:
            return True
        return checker.overloads(SIGNATURES.get(name, []), receiver, args) == 1

    def check_pattern(self, where: Token, name: str, pattern: Node) -> None:
        """A constant regular expression that does not compile is a compile error."""
        if not pattern.const:
            return
        try:
            regex.compiled(pattern.fn({}))
        except EvalError as exc:
            if name == "matches":
                self.fail(where, f"invalid matches argument ({exc})")
            self.fail_unplaced(f"program instantiation failed: {exc}")

    def check_format(self, where: Token, text: Any, arg_tree: Ast, arg: Node) -> None:
        """A literal format string's clauses against its arguments' static types, as the
        scheduler checks them while compiling (a list literal's elements one by one)."""
        if type(text) is not str:
            return
        literal = arg_tree
        while literal.data != "list_lit" and len(literal.children) == 1:
            child = literal.children[0]
            if not isinstance(child, Tree):
                return
            literal = child
        if literal.data == "list_lit":
            items = literal.children[0] if literal.children else None
            trees = (
                [c for c in items.children if isinstance(c, Tree)]
                if isinstance(items, Tree)
                else []
            )
            if any(t.data == "opt_item" for t in trees):
                return
            self.mixed_literals += 1
            try:
                kinds = [self.compile(t).type for t in trees]
            finally:
                self.mixed_literals -= 1
        else:
            return
        error = lib_strings.format_static_error(text, kinds)
        if error is not None:
            self.fail(where, error)

    def expect_bool(self, where: Ast | Token, node: Node) -> None:
        """Operands of ``&&``, ``||`` and macro predicates must be bool (or dyn)."""
        if node.type not in ("bool", "dyn", "wrapper(bool)", checker.ANY):
            self.fail(where, f"expected type 'bool' but found '{node.type}'")

    def source(self, tree: Ast) -> str:
        """The source text of a subtree."""
        meta = tree.meta
        return self.expression[meta.start_pos : meta.end_pos]

    def compile(self, tree: Ast) -> Node:
        """Compile any subtree."""
        handler = getattr(self, "_" + str(tree.data), None)
        if handler is None:
            self.fail(tree, f"unsupported syntax: {tree.data}")
        node: Node = handler(tree)
        return node

    def _single(self, tree: Ast) -> Node:
        child = tree.children[0]
        assert isinstance(child, Tree)
        return self.compile(child)

    # -- logic -----------------------------------------------------------------------------

    def _expr(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        cond, left, right = (self.compile(c) for c in tree.children if isinstance(c, Tree))
        kind = self.check(tree, "_?_:_", None, [cond.type, left.type, right.type])
        c, a, b = cond.fn, self.branch(left), self.branch(right)

        def ternary(scope: Scope) -> Any:
            test = c(scope)
            if test is True:
                return a(scope)
            if test is False:
                return b(scope)
            raise NoSuchOverload("_?_:_", test)

        # A conditional is an attribute there; its branches are charged when taken.
        return Node(ternary, kind, cost=cond.cost, attr=True)

    def branch(self, node: Node) -> Eval:
        """A conditional's branch: charged when taken, without its variable's read (the
        scheduler resolves a branch that is an attribute without observing the variable)."""
        return self.lazy(node, node.cost - node.base)

    def lazy(self, node: Node, amount: int | None = None) -> Eval:
        """``node``'s closure, charging its cost when it runs (for parts run only sometimes)."""
        amount = node.cost if amount is None else amount
        return _charged(node.fn, amount) if self.counting and amount else node.fn

    def _conditionalor(self, tree: Ast) -> Node:
        return self._logical_chain(tree, True)

    def _conditionaland(self, tree: Ast) -> Node:
        return self._logical_chain(tree, False)

    def _logical_chain(self, tree: Ast, is_or: bool) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        # a && b && c is left-recursive in the grammar: flatten it, so that a chain of
        # thousands of terms (the scheduler balances them) compiles and runs without deep
        # recursion.
        trees: list[Ast] = []
        current = tree
        while current.data == tree.data and len(current.children) == 2:
            left, right = current.children
            assert isinstance(left, Tree) and isinstance(right, Tree)
            trees.append(right)
            current = left
        trees.append(current)
        trees.reverse()
        operands = [self.compile(t) for t in trees]
        for where, operand in zip(trees, operands, strict=True):
            self.expect_bool(where, operand)
        # The later terms run only when the earlier ones do not decide: charged then.
        fns = [operands[0].fn, *(self.lazy(o) for o in operands[1:])]
        first = operands[0].cost
        if len(fns) == 2:
            return Node(_logical(fns[0], fns[1], is_or), "bool", cost=first)
        return Node(_logical_chain(fns, is_or), "bool", cost=first)

    # -- operators -------------------------------------------------------------------------

    def _binary(self, tree: Ast) -> tuple[str, Node, Node]:
        op_tree, right_tree = tree.children
        assert isinstance(op_tree, Tree) and isinstance(right_tree, Tree)
        left_tree = op_tree.children[0]
        assert isinstance(left_tree, Tree)
        return str(op_tree.data), self.compile(left_tree), self.compile(right_tree)

    def _relation(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        op, left, right = self._binary(tree)
        a, b = left.fn, right.fn
        where = _operator(tree)
        if op in ("relation_lt", "relation_le", "relation_gt", "relation_ge") and any(
            side.type in (QUANTITY, SEMVER) for side in (left, right)
        ):
            self.fail(
                where,
                f"found no matching overload for '{_OPS[op]}' applied to "
                f"'{checker.describe_call(None, [left.type, right.type])}'"
                "; use compareTo, isGreaterThan or isLessThan",
            )
        self.check(where, _OPS[op], None, [left.type, right.type])
        operands = left.cost + right.cost
        if op == "relation_in":
            if b is _empty_list:
                # The scheduler folds membership in a constant empty list to false, without
                # evaluating the left side.
                return _const(False, "bool")
            if right.primitive_list:
                # A hash lookup there, of no cost.
                values = b({})
                return Node(lambda s: _in_constant(a(s), values), "bool", cost=left.cost)
        apply = _RELATIONS[op]
        sized = self.sized(_OPS[op], None, [left.type, right.type])
        if sized and self.counting:
            return Node(_priced2(apply, a, b, _OPS[op]), "bool", cost=operands)
        fn: Eval
        if op in _ORDER:
            test, symbol = _ORDER[op], _OPS[op]
            fn = lambda s: test(cel_compare(symbol, a(s), b(s)))  # noqa: E731 - compiled form
        else:
            fn = lambda s: apply(a(s), b(s))  # noqa: E731
        return Node(fn, "bool", cost=operands + (0 if sized else 1))

    def _arith(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        op, left, right = self._binary(tree)
        a, b, apply = left.fn, right.fn, _ARITH[op]
        name = _ARITH_NAMES[op]
        kind = self.check(_operator(tree), name, None, [left.type, right.type])
        operands = left.cost + right.cost
        if self.sized(name, None, [left.type, right.type]):
            # Concatenating strings costs their size.
            if self.counting:
                return Node(_priced2(apply, a, b, name), kind, cost=operands)
            return Node(lambda s: apply(a(s), b(s)), kind, cost=operands)
        return Node(lambda s: apply(a(s), b(s)), kind, cost=operands + 1)

    _addition = _arith
    _multiplication = _arith

    def _unary(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        op, operand_tree = tree.children
        assert isinstance(op, Tree) and isinstance(operand_tree, Tree)
        # A run of the same prefix operator (!!!x, --x) is one level, as in the scheduler's
        # parser: an even run cancels out, an odd one applies once.
        count = 1
        while len(operand_tree.children) == 2:
            inner_op, inner = operand_tree.children
            if not (isinstance(inner_op, Tree) and inner_op.data == op.data):
                break
            assert isinstance(inner, Tree)
            count, operand_tree = count + 1, inner
        if operand_tree.data == "unary" and len(operand_tree.children) == 2:
            self._mixed_prefix(tree, op.data == "unary_not", operand_tree)
        literal = operand_tree
        while literal.data in ("unary", "member", "primary") and len(literal.children) == 1:
            child = literal.children[0]
            assert isinstance(child, Tree)
            literal = child  # not through parentheses: -(-1) negates a signed literal
        token = literal.children[0] if literal.data == "literal" else None
        if op.data == "unary_neg" and isinstance(token, Token) and str(token).startswith("-"):
            # "--5": the scheduler's parser reads every "-" before a literal as an operator
            # once there is more than one, so the literal itself is unsigned (and range-checked
            # as such: --9223372036854775808 is an invalid int literal there).
            count += 1
            unsigned = Token(
                token.type, str(token)[1:], line=token.line, column=(token.column or 1) + 1
            )
            operand_tree = Tree("literal", [unsigned], literal.meta)
        operand = self.compile(operand_tree)
        if count % 2 == 0:
            return operand
        f = operand.fn
        if op.data == "unary_not":
            self.check(tree, "!_", None, [operand.type])
            return Node(lambda s: _not(f(s)), "bool", cost=operand.cost + 1)
        kind = self.check(tree, "-_", None, [operand.type])
        return Node(lambda s: _neg(f(s)), kind, cost=operand.cost + 1)

    def _mixed_prefix(self, tree: Ast, not_first: bool, inner: Ast) -> None:
        """``!`` and ``-`` do not mix in CEL's grammar (``!-x``, ``-!x``), except for a signed
        number literal after ``!`` (``!-1``): the scheduler's "no viable alternative"."""
        operand = inner.children[1]
        while isinstance(operand, Tree) and operand.data in ("unary", "member", "primary"):
            if len(operand.children) != 1:
                break
            operand = operand.children[0]
        if not_first and isinstance(operand, Tree) and operand.data == "literal":
            token = operand.children[0]
            if isinstance(token, Token) and token.type in ("INT_LIT", "FLOAT_LIT"):
                return  # the literal's sign: !-1 is !(-1)
        text = self.source(tree)
        start = getattr(tree.meta, "start_pos", 0)
        ops = "!" if not_first else "-"
        i = 0
        while i < len(text) and (text[i] == ops or text[i].isspace()):
            i += 1
        # From the sign a literal could start with to the token that cannot follow it.
        if not_first:
            begin = i
            j = i + 1
            while j < len(text) and text[j].isspace():
                j += 1
            found = re.match(r"[A-Za-z_][A-Za-z0-9_]*|\d[\w.]*|\S", text[j:])
            end = j + (found.end() if found else 0)
        else:
            begin = text.rindex("-", 0, i)
            j, end = i, i + 1
        before = self.expression[: start + j]
        line = before.count("\n") + 1
        column = start + j - (before.rfind("\n") + 1) + 1
        message = f"Syntax error: no viable alternative at input '{text[begin:end]}'"
        raise CompileError(self.expression, message, line, column)

    # -- members ---------------------------------------------------------------------------

    def _member(self, tree: Ast) -> Node:
        return self._single(tree)

    def _member_dot(self, tree: Ast) -> Node:
        target_tree, name_token = tree.children
        assert isinstance(target_tree, Tree) and isinstance(name_token, Token)
        name = _field_name(name_token)
        qualified = self.qualified_name(target_tree)
        if qualified is not None and not self.in_scope(qualified):
            full = f"{qualified}.{name}".removeprefix(".")
            if full in QUALIFIED_TYPE_NAMES:
                return _const(CelType(full), "type", planned=True)
            if full in messages.CONSTANTS:
                return _const(messages.CONSTANTS[full], "int", planned=True)
            self.fail(tree, f"undeclared reference to '{qualified}.{name}'")
        target = self.compile(target_tree)
        kind = self.field_type(name_token, target.type, name)
        where = self.source(target_tree)
        get = target.fn
        return Node(lambda s: _select(get(s), name, where), kind, **_qualified(target, 0))

    def _member_opt_dot(self, tree: Ast) -> Node:
        # a.?b: optional.of(a.b) when a has b, else optional.none().
        target_tree, name_token = tree.children
        assert isinstance(target_tree, Tree) and isinstance(name_token, Token)
        name = _field_name(name_token)
        target = self.compile(target_tree)
        inner = checker.element(target.type) if _is_optional(target.type) else target.type
        kind = _optional_of(self.field_type(name_token, inner, name))
        get = target.fn
        return Node(lambda s: _opt_select(get(s), name), kind, **_qualified(target, 0))

    def _member_opt_index(self, tree: Ast) -> Node:
        # m[?k] / l[?i]: optional.of(m[k]) when present, else optional.none().
        target_tree, key_tree = tree.children
        assert isinstance(target_tree, Tree) and isinstance(key_tree, Tree)
        target, key = self.compile(target_tree), self.compile(key_tree)
        inner = checker.element(target.type) if _is_optional(target.type) else target.type
        kind = _optional_of(self.check(tree, "_[?_]", None, [inner, key.type]))
        get, k = target.fn, key.fn
        return Node(lambda s: _opt_index(get(s), k(s)), kind, **_qualified(target, _key_cost(key)))

    def field_type(self, where: Ast | Token, target: str, name: str) -> str:
        """The type of ``target.name``: a declared field, a map value, or dyn."""
        if _is_optional(target):
            return _optional_of(self.field_type(where, checker.element(target), name))
        fields = self.objects.get(target)
        if fields is not None:
            if name not in fields:
                self.fail(_dot(where), f"undefined field '{name}'")
            return fields[name]
        if target == "dyn" or checker.split(target)[0] == "map":
            return checker.element(target)
        self.fail(where, f"type '{target}' does not support field selection")

    def _member_index(self, tree: Ast) -> Node:
        target_tree, key_tree = tree.children
        assert isinstance(target_tree, Tree) and isinstance(key_tree, Tree)
        target, key = self.compile(target_tree), self.compile(key_tree)
        # Reported at the "[", which follows the target.
        bracket = Token(
            "LSQB", "[", line=target_tree.meta.end_line, column=target_tree.meta.end_column
        )
        kind = self.check(bracket, "_[_]", None, [target.type, key.type])
        if key.const and isinstance(constant := key.fn({}), Duration | Timestamp):
            # The scheduler's planner takes only primitive constants as index qualifiers.
            kind_name = type(constant).__name__
            self.fail_unplaced(
                f"program instantiation failed: invalid qualifier type: types.{kind_name}"
            )
        where = self.source(target_tree)
        get, k = target.fn, key.fn
        qualified = _qualified(target, _key_cost(key))
        return Node(lambda s: _index(get(s), k(s), where), kind, **qualified)

    def _member_object(self, tree: Ast) -> Node:
        type_tree = tree.children[0]
        assert isinstance(type_tree, Tree)
        name = self.qualified_name(type_tree) or ""
        message = messages.MESSAGES.get(name.lstrip("."))
        if message is None:
            self.fail(type_tree, f"undeclared reference to '{name}' (in container '')")
        inits = tree.children[1] if len(tree.children) > 1 else None
        items = inits.children if isinstance(inits, Tree) else []
        fields: list[tuple[str, str, Eval]] = []
        cost_of_fields = 0
        for field_token, value_tree in zip(items[::2], items[1::2], strict=True):
            assert isinstance(field_token, Token) and isinstance(value_tree, Tree)
            field = str(field_token)
            expected = message.fields.get(field)
            if expected is None:
                self.fail(field_token, f"undefined field '{field}'")
            value = self.compile(value_tree)
            if not checker.unify(expected, value.type, {}):
                self.fail(
                    value_tree,
                    f"expected type of field '{field}' is '{expected}' but provided type is "
                    f"'{checker.describe_call(None, [value.type])[1:-1]}'",
                )
            fields.append((field, expected, value.fn))
            cost_of_fields += value.cost
        build, full = message.build, name.lstrip(".")
        return Node(
            lambda s: build({f: messages.field_value(full, f, t, fn(s)) for f, t, fn in fields}),
            message.result,
            cost=cost.MESSAGE_LITERAL + cost_of_fields,
        )

    def _member_dot_arg(self, tree: Ast) -> Node:
        target_tree, name_token = tree.children[:2]
        assert isinstance(target_tree, Tree) and isinstance(name_token, Token)
        args = self._args(tree.children[2] if len(tree.children) > 2 else None)
        name = str(name_token)
        qualified = self.qualified_name(target_tree)
        if qualified is not None and not self.in_scope(qualified):
            if qualified.startswith(".") and f"{qualified[1:]}.{name}" not in functions.GLOBAL:
                # An absolute name that is neither a variable nor a namespaced function
                # (".cel.bind" is no macro): the scheduler reports its first part.
                head = qualified.split(".")[1]
                self.fail(target_tree, f"undeclared reference to '.{head}' (in container '')")
            return self._global_call(f"{qualified}.{name}", name_token, args)
        if name in _MACROS and not (name == "existsOne" and len(args) != 3):
            # existsOne exists only in the two-variable form.
            return self._macro(tree, name, target_tree, args)
        function = functions.MEMBER.get(name)
        if function is None:
            if name in SIGNATURES:
                # A global function called as a member (q.sign()): no such overload.
                target = self.compile(target_tree)
                types = [self.compile(a).type for a in args]
                self.check(_call_position(name_token), name, target.type, types)
            self.fail(name_token, f"undeclared reference to '{name}'")
        target = self.compile(target_tree)
        self.mixed_literals += name == "format"
        try:
            compiled = [self.compile(a) for a in args]
        finally:
            self.mixed_literals -= name == "format"
        kind = self.check(_call_position(name_token), name, target.type, [c.type for c in compiled])
        fixed = target.cost + sum(c.cost for c in compiled)
        sized = self.sized(name, target.type, [c.type for c in compiled])
        if name == "format" and target.const and len(args) == 1:
            self.check_format(name_token, target.fn({}), args[0], compiled[0])
        if name == "format" and target.const and all(c.const for c in compiled):
            try:
                text, values = target.fn({}), compiled[0].fn({})
                value = _call(function, [target.fn, compiled[0].fn], name)({})
            except EvalError:
                pass  # a value only evaluation rejects ("%f" of "x"): a runtime error
            else:
                price = cost.price(name, [text, values], value) if sized else 1
                return _const(value, kind, cost=fixed + price)
        if name in _REGEX_FUNCTIONS and compiled:
            self.check_pattern(name_token, name, compiled[0])
        if name in ("or", "orValue") and len(compiled) == 1:
            # Short-circuiting, as in the scheduler: the alternative is evaluated only
            # when the optional is empty (and costs nothing itself there; orValue's
            # alternative, when an attribute, is resolved as a conditional's branch is).
            other = compiled[0]
            alternative = self.branch(other) if name == "orValue" else self.lazy(other)
            return Node(_or_else(target.fn, alternative, name), kind, cost=target.cost)
        call = _call(function, [target.fn, *(c.fn for c in compiled)], name)
        if sized:
            return Node(_priced(call, name) if self.counting else call, kind, cost=fixed)
        return Node(call, kind, cost=fixed + 1)

    def _args(self, exprlist: Ast | Token | None) -> list[Ast]:
        if exprlist is None:
            return []
        assert isinstance(exprlist, Tree)
        return [c for c in exprlist.children if isinstance(c, Tree)]

    def qualified_name(self, tree: Ast) -> str | None:
        """``a.b.c`` when ``tree`` is a chain of plain identifiers, else None."""
        while tree.data in ("member", "primary") and len(tree.children) == 1:
            child = tree.children[0]
            if not isinstance(child, Tree):
                return None
            tree = child
        if tree.data == "ident":
            return str(tree.children[0])
        if tree.data == "dot_ident":
            return "." + str(tree.children[0])
        if tree.data == "member_dot":
            inner, name = tree.children
            if isinstance(name, Token) and name.type == "QUOTED_IDENT":
                return None
            assert isinstance(inner, Tree)
            prefix = self.qualified_name(inner)
            return None if prefix is None else f"{prefix}.{name}"
        return None

    def _names(self) -> set[str]:
        return set(self.variables) | {name for name, _ in self.bound}

    def in_scope(self, qualified: str) -> bool:
        """Whether the dotted name ``qualified`` starts with a variable: a declared one or a
        macro's, or with a leading dot (an absolute name) only a declared one."""
        if qualified.startswith("."):
            return qualified[1:].split(".")[0] in self.variables
        return qualified.split(".")[0] in self._names()

    # -- primaries -------------------------------------------------------------------------

    def _primary(self, tree: Ast) -> Node:
        return self._single(tree)

    def _paren_expr(self, tree: Ast) -> Node:
        return self._single(tree)

    def _ident(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        name = str(token)
        found = next((kind for bound, kind in reversed(self.bound) if bound == name), None)
        if found is not None:
            key = bound_key(name)
            return Node(lambda s: s[key], found, cost=1, attr=True, base=1)
        if name in self.variables:
            return Node(lambda s: s[name], self.variables[name], cost=1, attr=True, base=1)
        if name in TYPE_NAMES:
            return _const(CelType(name), "type", planned=True)
        self.fail(token, f"undeclared reference to '{name}'")

    def _dot_ident(self, tree: Ast) -> Node:
        # ".name": resolved in the root scope only, past any macro variable of that name.
        token = tree.children[0]
        assert isinstance(token, Token)
        name = str(token)
        if name in self.variables:
            return Node(lambda s: s[name], self.variables[name], cost=1, attr=True, base=1)
        if name in TYPE_NAMES:
            return _const(CelType(name), "type", planned=True)
        self.fail(token, f"undeclared reference to '.{name}' (in container '')")

    def _ident_arg(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        name = str(token)
        args = self._args(tree.children[1] if len(tree.children) > 1 else None)
        if name == "has" and tree.data == "ident_arg":
            return self._has(tree, args)
        if tree.data == "dot_ident_arg":
            name = "." + name
        return self._global_call(name, token, args)

    _dot_ident_arg = _ident_arg

    def _global_call(self, name: str, token: Token, args: list[Ast]) -> Node:
        absolute = name.startswith(".")
        name = name.removeprefix(".")
        if name == "cel.bind" and not absolute:
            # A macro only by its plain name.
            return self._bind(token, args)
        function = functions.GLOBAL.get(name)
        if function is None:
            if absolute:
                self.fail(
                    _call_position(token), f"undeclared reference to '.{name}' (in container '')"
                )
            self.fail(token, f"undeclared reference to '{name}'")
        compiled = [self.compile(a) for a in args]
        kind = self.check(_call_position(token), name, None, [c.type for c in compiled])
        if name in ("duration", "timestamp") and len(args) == 1 and _is_literal(args[0]):
            # The scheduler validates literal arguments while compiling.
            invalid = lib_time.literal_error(name, compiled[0].fn({}))
            if invalid is not None:
                self.fail(args[0], invalid)
        if name == "matches" and len(compiled) == 2:
            self.check_pattern(token, name, compiled[1])
        call = _call(function, [c.fn for c in compiled], name)
        if name == "lists.range":
            # Not folded: its cost is charged on every evaluation, as in the scheduler.
            return Node(_priced(call, name), kind, cost=sum(c.cost for c in compiled))
        try:
            sized = self.sized(name, None, [c.type for c in compiled])
            return _folded(call, kind, compiled, name, self.counting, sized)
        except _PlanError as exc:
            self.fail_unplaced(f"program instantiation failed: {exc}")

    def _list_lit(self, tree: Ast) -> Node:
        trees = self._args(tree.children[0] if tree.children else None)
        if not trees:
            return Node(_empty_list, checker.list_of(checker.FREE), const=True, planned=True)
        items = [self.element(c) for c in trees]
        kind = checker.list_of(self.homogeneous(trees, items))
        built = cost.LIST_LITERAL + sum(i.cost for i in items)
        if any(c.data == "opt_item" for c in trees):
            # [?x]: an element only when the optional x has a value.
            optional = [(c.data == "opt_item", i.fn) for c, i in zip(trees, items, strict=True)]
            return Node(lambda s: _optional_items(optional, s), kind, cost=built)
        fns = [i.fn for i in items]
        const = all(i.const for i in items)
        # A literal of constants is a constant there, of no cost; "in" one of primitive
        # values is a hash lookup.
        planned = all(i.planned for i in items)
        primitive = planned and all(isinstance(f({}), bool | int | float | str) for f in fns)
        return Node(
            lambda s: [f(s) for f in fns],
            kind,
            const=const,
            primitive_list=primitive,
            planned=planned,
            cost=0 if planned else built,
        )

    def element(self, tree: Ast) -> Node:
        """A list element or map key/value; for ``?x`` the node of x typed as its value."""
        if tree.data != "opt_item":
            return self.compile(tree)
        inner_tree = tree.children[0]
        assert isinstance(inner_tree, Tree)
        inner = self.compile(inner_tree)
        if inner.type != "dyn" and not _is_optional(inner.type):
            self.fail(tree, f"expected type 'optional_type(dyn)' but found '{inner.type}'")
        # Keep optional.none()'s unknown element type unknown, so it joins any literal.
        params = checker.split(inner.type)[1]
        return Node(inner.fn, params[0] if params else "dyn", cost=inner.cost)

    def homogeneous(self, trees: list[Ast], items: list[Node]) -> str:
        """The one type of a literal's elements; a compile error when they differ."""
        kind = checker.common([i.type for i in items])
        if self.mixed_literals and any(not checker.same(kind, i.type) for i in items):
            return "dyn"
        for where, item in zip(trees, items, strict=True):
            if not checker.same(kind, item.type):
                self.fail(where, f"expected type '{kind}' but found '{item.type}'")
        return kind

    def _map_lit(self, tree: Ast) -> Node:
        parts = self._args(tree.children[0] if tree.children else None)
        optional = [k.data == "opt_item" for k in parts[::2]]
        # {?k: v}: the entry only when the optional v has a value.
        keys = [self.compile(_unopt(k)) for k in parts[::2]]
        values = [
            self.element(_opt_item(v)) if opt else self.compile(v)
            for v, opt in zip(parts[1::2], optional, strict=True)
        ]
        kind = checker.map_of(
            self.homogeneous(parts[::2], keys), self.homogeneous(parts[1::2], values)
        )
        pairs = [(k.fn, v.fn, o) for k, v, o in zip(keys, values, optional, strict=True)]

        def build(scope: Scope) -> Mapping[Any, Any]:
            out = LiteralMap()
            for key_fn, value_fn, opt in pairs:
                key = key_fn(scope)
                _unhashable(key)
                if isinstance(key, list):
                    # The scheduler accepts any key in a literal; a list key is kept hashable.
                    key = tuple(key)
                elif isinstance(key, Mapping):
                    raise EvalError(f"unsupported map key type: {type_name(key)}")
                value = value_fn(scope)
                if opt:
                    found = _optional_value(value)
                    if found is _NOTHING:
                        continue
                    value = found
                out[key] = value
            return out if out else {}  # an empty literal is no hash map there

        planned = not any(optional) and all(n.planned for n in keys + values)
        built = cost.MAP_LITERAL + sum(n.cost for n in keys + values)
        return Node(build, kind, cost=0 if planned else built)

    def _literal(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        text = str(token)
        kind = token.type
        if kind == "BOOL_LIT":
            return _const(text == "true", "bool", planned=True)
        if kind == "NULL_LIT":
            return _const(None, "null", planned=True)
        if kind in ("STRING_LIT", "MLSTRING_LIT", "BYTES_LIT"):
            try:
                literal = unescape(text, kind == "BYTES_LIT")
            except ValueError as exc:
                self.fail(token, str(exc))
            return _const(literal, "bytes" if kind == "BYTES_LIT" else "string", planned=True)
        if kind == "FLOAT_LIT":
            return _const(float(text), "double", planned=True)
        if kind == "UINT_LIT":
            value = _int_literal(text[:-1])
            if not 0 <= value < 2**64:
                self.fail(token, "invalid uint literal")
            return _const(Uint(value), "uint", planned=True)
        value = _int_literal(text)
        if not INT64_MIN <= value <= INT64_MAX:
            self.fail(token, "invalid int literal")
        return _const(value, "int", planned=True)

    # -- macros ----------------------------------------------------------------------------

    def _has(self, tree: Ast, args: list[Ast]) -> Node:
        select = _unwrap(args[0]) if len(args) == 1 else args[0] if args else None
        if select is None or len(args) != 1 or select.data != "member_dot":
            self.fail(tree, "invalid argument to has() macro")
        target_tree, name_token = select.children
        assert isinstance(target_tree, Tree)
        target = self.compile(target_tree)
        name = str(name_token)
        self.field_type(select, target.type, name)
        get = target.fn

        def has(scope: Scope) -> bool:
            value = get(scope)
            if isinstance(value, Mapping):
                return not is_missing(map_lookup(value, name))
            if isinstance(value, list | tuple):
                raise EvalError("unsupported index type 'string' in list")
            return False  # a scalar has no fields: the scheduler's presence test is false

        # The presence test itself costs nothing there (only reaching its operand).
        return Node(has, "bool", cost=target.cost + (0 if target.attr else 1))

    def _bind(self, token: Token, args: list[Ast]) -> Node:
        if len(args) != 3:
            self.fail(token, "cel.bind() takes a variable, an initial value and an expression")
        var = self._macro_var(args[0])
        init_node = self.compile(args[1])
        init = init_node.fn
        body = self._with_bound([(var, init_node.type)], args[2])
        body_fn = body.fn
        key = bound_key(var)

        def bind(scope: Scope) -> Any:
            inner = dict(scope)
            inner[key] = init(scope)
            return body_fn(inner)

        return Node(bind, body.type, cost=init_node.cost + body.cost)

    def _macro_var(self, tree: Ast) -> str:
        name = self.qualified_name(_unwrap(tree))
        if name is None or "." in name:
            self.fail(tree, "argument is not an identifier")
        return name

    def _with_bound(self, names: list[tuple[str, str]], tree: Ast) -> Node:
        self.bound.extend(names)
        try:
            return self.compile(tree)
        finally:
            del self.bound[-len(names) :]

    def _macro(self, tree: Ast, name: str, target_tree: Ast, args: list[Ast]) -> Node:
        two_var = name in ("transformList", "transformMap", "transformMapEntry") or (
            name in ("all", "exists", "exists_one", "existsOne") and len(args) == 3
        )
        nvars = 2 if two_var else 1
        if (
            len(args) < nvars + 1
            or len(args) > nvars + 2
            or (len(args) == nvars + 2 and name not in _FILTERED_MACROS)
        ):
            self.fail(tree, f"wrong number of arguments to the {name}() macro")
        names = [self._macro_var(a) for a in args[:nvars]]
        if nvars == 2 and names[0] == names[1]:
            self.fail(args[1], f"duplicate variable name: {names[0]}")
        target_node = self.compile(target_tree)
        variables = self._range_types(target_tree, target_node.type, nvars)
        compiled = [
            self._with_bound(list(zip(names, variables, strict=True)), a) for a in args[nvars:]
        ]
        if name not in _VALUE_MACROS or len(compiled) == 2:
            self.expect_bool(args[nvars], compiled[0])
        build = _MACROS[name]
        body = compiled[-1].type
        kind = {
            "map": checker.list_of(body),
            "transformList": checker.list_of(body),
            "transformMap": checker.map_of(variables[0], body),
            "transformMapEntry": body,
            "filter": checker.list_of(variables[0]),
            "optMap": _optional_of(body),
            "optFlatMap": body,
            "sortBy": target_node.type,
        }.get(name, "bool")
        if name == "sortBy":
            self.check(tree, "@sortByAssociatedKeys", target_node.type, [checker.list_of(body)])
        if name == "transformMapEntry" and checker.split(body)[0] not in ("map", "dyn"):
            self.fail(
                args[-1],
                f"found no matching overload for 'cel.@mapInsert' applied to "
                f"'(map(dyn, dyn), {body})'",
            )
        loop, result = _loop_costs(name, target_node, [c.cost for c in compiled])
        if name == "sortBy":
            # Sorting by the keys costs the square of their number, when typed.
            keys = [checker.list_of(body)]
            sized = self.sized("@sortByAssociatedKeys", target_node.type, keys)
            loop = Loop(loop.step, sized=sized)
        parts = [c.fn for c in compiled]
        fn = build(target_node.fn, [bound_key(n) for n in names], parts, loop)
        return Node(fn, kind, cost=target_node.cost + result)

    def _range_types(self, where: Ast, target: str, nvars: int) -> list[str]:
        # One variable: list elements or map keys; two: (index, element) or (key, value).
        kind = checker.split(target)[0]
        if target == "dyn":
            return ["dyn"] * nvars
        if kind == "optional_type" and nvars == 1:
            return [checker.element(target)]
        if kind == "list":
            elem = checker.element(target)
            return [elem] if nvars == 1 else ["int", elem]
        if kind == "map":
            keys = checker.key(target)
            return [keys] if nvars == 1 else [keys, checker.element(target)]
        self.fail(
            where,
            f"expression of type '{target}' cannot be range of a comprehension "
            "(must be list, map, or dynamic)",
        )


# -- runtime helpers -----------------------------------------------------------------------


def bound_key(name: str) -> str:
    """Where a macro or cel.bind variable lives in the scope: apart from the declared
    variables, which ``.name`` still reaches when a macro variable has the same name."""
    return "%" + name


_SIMPLE_ESCAPES = dict(zip("abfnrtv\\'\"`?", "\a\b\f\n\r\t\v\\'\"`?", strict=True))
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def unescape(text: str, is_bytes: bool) -> str | bytes:
    """A string or bytes literal's value as the scheduler's lexer and ``unescape`` read it:
    only CEL's escapes (``\\q`` is a syntax error), ``\\u``/``\\U`` never in bytes nor naming a
    surrogate or a code point past U+10FFFF, ``\\x``/octal a byte in bytes and a code point in
    strings, newlines normalised, a raw literal taken as written; ValueError with the
    scheduler's message otherwise."""
    body = text[1:] if is_bytes else text
    raw = body[:1] in ("r", "R")
    if raw:
        body = body[1:]
    quote = 3 if body[:3] in ('"""', "'''") else 1
    head = len(text) - len(body) + quote  # prefix and opening quote
    content = body[quote:-quote].replace("\r\n", "\n").replace("\r", "\n")
    if raw or "\\" not in content:
        return content.encode() if is_bytes else content
    out = bytearray()

    def recognition_error(at: int) -> ValueError:
        return ValueError(f"Syntax error: token recognition error at: '{text[: head + at + 1]}'")

    i = 0
    while i < len(content):
        c = content[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        e = content[i + 1] if i + 1 < len(content) else ""
        if e in _SIMPLE_ESCAPES and e:
            out += _SIMPLE_ESCAPES[e].encode()
            i += 2
            continue
        if e and e in "xXuU":
            size = 2 if e in "xX" else 4 if e == "u" else 8
            digits = content[i + 2 : i + 2 + size]
            for j, d in enumerate(digits.ljust(size, "\0")):
                if d not in _HEX_DIGITS:
                    raise recognition_error(min(i + 2 + j, len(content)))
            value = int(digits, 16)
            if is_bytes and e in "uU":
                raise ValueError("unable to unescape string")
            i += 2 + size
        elif e and e in "0123":
            digits = content[i + 1 : i + 4]
            for j, d in enumerate(digits.ljust(3, "\0")):
                if d not in "01234567":
                    raise recognition_error(min(i + 1 + j, len(content)))
            value = int(digits, 8)
            e = "x"  # a byte in bytes, a code point in strings, as \\x
            i += 4
        else:
            raise recognition_error(min(i + 1, len(content)))
        if is_bytes:
            out.append(value)
        elif value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise ValueError("invalid unicode code point")
        else:
            out += chr(value).encode()
    return bytes(out) if is_bytes else out.decode()


def _int_literal(text: str) -> int:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    value = int(body, 16) if body[:2].lower() == "0x" else int(body)
    return -value if negative else value


def _is_literal(tree: Ast) -> bool:
    return _unwrap(tree).data == "literal"


def _unwrap(tree: Ast) -> Ast:
    # Descend single-child wrappers (expr -> ... -> member) to the node that does the work.
    while len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        tree = tree.children[0]
    return tree


def _logical(left: Eval, right: Eval, is_or: bool) -> Eval:
    # CEL's && and || are commutative over errors: an error on one side is absorbed when the
    # other side alone decides the result (false for &&, true for ||).
    decisive = is_or
    name = "_||_" if is_or else "_&&_"

    def logical(scope: Scope) -> bool:
        error: EvalError | None = None
        try:
            value = left(scope)
        except Abort:
            raise
        except EvalError as exc:
            error = exc
        else:
            if value is decisive:
                return is_or
            if value is not (not decisive):
                error = NoSuchOverload(name, value)
        try:
            other = right(scope)
        except Abort:
            raise
        except EvalError:
            if error is not None:
                raise error from None
            raise
        if other is decisive:
            return is_or
        if error is not None:
            raise error
        if other is not (not decisive):
            raise NoSuchOverload(name, other)
        return not decisive

    return logical


def _logical_chain(operands: list[Eval], is_or: bool) -> Eval:
    # a && b && c ...: the first decisive operand decides; otherwise the first error.
    decisive = is_or
    name = "_||_" if is_or else "_&&_"

    def logical(scope: Scope) -> bool:
        error: EvalError | None = None
        for operand in operands:
            try:
                value = operand(scope)
            except Abort:
                raise
            except EvalError as exc:
                error = error or exc
                continue
            if value is decisive:
                return is_or
            if value is not (not decisive):
                error = error or NoSuchOverload(name, value)
        if error is not None:
            raise error
        return not decisive

    return logical


def _empty_list(_scope: Scope) -> list[Any]:
    return []


def _ne(a: Any, b: Any) -> bool:
    # The scheduler's != is "== is not true": where == has no overload, != is true.
    try:
        return not cel_eq(a, b)
    except NoSuchOverload:
        return True


def _not(value: Any) -> bool:
    if value is True or value is False:
        return not value
    raise NoSuchOverload("!_", value)


def _neg(value: Any) -> Any:
    if isinstance(value, float):
        return -value
    if type(value) is int:
        return check_int(-value)
    raise NoSuchOverload("-_", value)


def _in(item: Any, container: Any) -> bool:
    if isinstance(container, list | tuple):
        # The item is compared with each element; an element of another kind (no == overload)
        # is simply not it, as in the scheduler.
        return any(equal(item, x) for x in container)
    if isinstance(container, LiteralMap):
        _unhashable(item)
    if isinstance(container, Mapping):
        # Membership looks at the keys really present: a map with a default value (the
        # device's attribute domains) still answers "in" truthfully.
        if type(item) is str:
            return item in container
        return not is_missing(map_lookup(container, item))
    raise NoSuchOverload("@in", item, container)


def _field_name(token: Token) -> str:
    # `cuda-version` (backticks) names a field that is not an identifier.
    text = str(token)
    return text[1:-1] if token.type == "QUOTED_IDENT" else text


def _is_optional(kind: str) -> bool:
    return checker.split(kind)[0] == "optional_type"


def _optional_of(kind: str) -> str:
    # Optional chaining: selecting from an optional stays one optional, not nested ones.
    return kind if _is_optional(kind) else checker.join("optional_type", kind)


def _unopt(tree: Ast) -> Ast:
    # The key expression of a map entry, with or without its "?".
    child = tree.children[0] if tree.data == "opt_item" else tree
    assert isinstance(child, Tree)
    return child


def _opt_item(value: Ast) -> Ast:
    # Treat the value of {?k: v} like a list's ?v element.
    return Tree("opt_item", [value], value.meta)


def _optional_value(value: Any, name: str = "optional") -> Any:
    """The value held by an optional, or _NOTHING for an empty one."""
    if not isinstance(value, optional.Optional):
        raise NoSuchOverload(name, value)
    return value.value if value.has_value() else _NOTHING


def _optional_items(items: list[tuple[bool, Eval]], scope: Scope) -> list[Any]:
    out = []
    for is_optional, fn in items:
        value = fn(scope)
        if is_optional:
            value = _optional_value(value)
            if value is _NOTHING:
                continue
        out.append(value)
    return out


_OPERATOR_TEXT = {
    "relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=",
    "relation_eq": "==", "relation_ne": "!=", "relation_in": "in", "addition_add": "+",
    "addition_sub": "-", "multiplication_mul": "*", "multiplication_div": "/",
    "multiplication_mod": "%",
}  # fmt: skip


def _operator(tree: Ast) -> Token:
    # Where the scheduler reports an operator's errors: at the operator, which ends its node.
    op_tree = tree.children[0]
    assert isinstance(op_tree, Tree)
    meta = op_tree.meta
    text = _OPERATOR_TEXT[str(op_tree.data)]
    return Token("OP", text, line=meta.end_line, column=meta.end_column - len(text))


def _dot(where: Ast | Token) -> Ast | Token:
    # The scheduler reports a field selection at its ".", just before the field name.
    if isinstance(where, Token) and where.line is not None and where.column is not None:
        return Token("DOT", ".", line=where.line, column=where.column - 1)
    return where


def _call_position(name: Token) -> Token:
    # The scheduler reports a call's errors at its opening parenthesis, after the name.
    return Token("LPAR", "(", line=name.end_line, column=name.end_column)


def _charged(fn: Eval, amount: int) -> Eval:
    def run(scope: Scope) -> Any:
        cost.charge(scope, amount)
        return fn(scope)

    return run


def _priced(call: Eval, name: str) -> Eval:
    # A call whose cost depends on its arguments and result: charged after it returns.
    inner = getattr(call, "priced", None)
    if inner is None:
        raise AssertionError(f"{name}: not a call closure")
    function, args = inner

    def run(scope: Scope) -> Any:
        values = [a(scope) for a in args]
        try:
            result = function(*values)
        except TypeError:
            raise NoSuchOverload(name, *values) from None
        cost.charge(scope, cost.price(name, values, result))
        return result

    return run


def _priced2(apply: Callable[[Any, Any], Any], a: Eval, b: Eval, name: str) -> Eval:
    # An operator whose cost depends on its operands (strings by their size).
    price = cost.DYNAMIC[name]

    def run(scope: Scope) -> Any:
        x, y = a(scope), b(scope)
        result = apply(x, y)
        cost.charge(scope, price((x, y), result))
        return result

    return run


def _key_cost(key: Node) -> int:
    # An index that is itself an attribute (m[k]) is resolved without observing its variable.
    return key.cost - key.base


def _qualified(target: Node, key_cost: int) -> dict[str, Any]:
    # A field or index selection: 1 for the qualifier (and its key), on an attribute; on any
    # other value, 1 more for the attribute the scheduler makes of it.
    if target.attr:
        return {"cost": target.cost + key_cost + 1, "attr": True, "base": target.base}
    return {"cost": target.cost + key_cost + 2, "attr": True, "base": 1}


def _or_else(target: Eval, alternative: Eval, name: str) -> Eval:
    def run(scope: Scope) -> Any:
        found = target(scope)
        if not isinstance(found, optional.Optional):
            raise NoSuchOverload(name, found)
        if found.has_value():
            return found.value if name == "orValue" else found
        other = alternative(scope)
        if name == "or" and not isinstance(other, optional.Optional):
            raise NoSuchOverload(name, found, other)
        return other

    return run


def _opt_select(value: Any, name: str) -> Any:
    if isinstance(value, optional.Optional):
        if not value.has_value():
            return value
        value = value.value
    if isinstance(value, Mapping):
        found = value.get(name, _NOTHING)
        return optional.NONE if found is _NOTHING else optional.of(found)
    if isinstance(value, list | tuple):
        raise EvalError("unsupported index type 'string' in list")
    return optional.NONE  # a scalar has no fields: a presence test there, so no value


#: Values the scheduler's evaluator cannot index with, by their Go type's name there.
_NOT_QUALIFIERS = {
    **{kind: f"cel.{go}" for kind, go in GO_TYPE_NAMES.items()},
    "optional_type": "*types.Optional",
    "list": "*types.baseList",
}


def _check_qualifier(key: Any) -> None:
    bad = _NOT_QUALIFIERS.get(type_name(key))
    if bad is not None:
        raise EvalError(f"invalid qualifier type: {bad}")


class LiteralMap(Mapping[Any, Any]):
    """A map made by a map literal: a Go hash map in the scheduler, keyed by type and value
    (``{dyn(1): 'a', dyn(1u): 'b', dyn(1.0): 'c', dyn(true): 'd'}`` has four entries, where a
    Python dict would merge them), which a Semver (holding Go slices) cannot be hashed into,
    as a key or when looked for with ``in``."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, Any], tuple[Any, Any]] = {}

    def __setitem__(self, key: Any, value: Any) -> None:
        self._entries[(type_name(key), key)] = (key, value)

    def __getitem__(self, key: Any) -> Any:
        return self._entries[(type_name(key), key)][1]

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _ in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def exact(self, key: Any, missing: Any) -> Any:
        """The value under exactly this key (same type and value), else ``missing``."""
        entry = self._entries.get((type_name(key), key))
        return missing if entry is None else entry[1]


def _unhashable(value: Any) -> None:
    if type_name(value) == "kubernetes.Semver":
        raise Abort("internal error: runtime error: hash of unhashable type cel.Semver")


def _opt_index(value: Any, key: Any) -> Any:
    _check_qualifier(key)
    if isinstance(value, optional.Optional):
        if not value.has_value():
            return value
        value = value.value
    if isinstance(value, Mapping):
        found = map_lookup(value, key)
        return optional.NONE if is_missing(found) else optional.of(found)
    if isinstance(value, list | tuple):
        if type(key) is float and key.is_integer():
            key = int(key)  # a whole double indexes a list, as with []
        if type(key) in (int, Uint):
            return optional.of(value[key]) if 0 <= key < len(value) else optional.NONE
        raise NoSuchOverload("_[?_]", value, key)
    return optional.NONE  # a scalar has no entries: a presence test there, so no value


def _in_constant(item: Any, values: list[Any]) -> bool:
    # The scheduler turns "x in [constants]" into a hash lookup, which a Semver (holding Go
    # slices) cannot take part in; a Quantity can, and is simply not found.
    _unhashable(item)
    return _in(item, values)


def _select(value: Any, name: str, where: str) -> Any:
    if isinstance(value, optional.Optional):
        return _opt_select(value, name)  # a.?b.c: c is optional too
    if isinstance(value, Mapping):
        found = value.get(name, _NOTHING)
        if found is _NOTHING:
            raise NoSuchKey(name, where)
        return found
    raise EvalError(f"type '{type_name(value)}' does not support field selection")


_NOTHING = object()


def _index(value: Any, key: Any, where: str) -> Any:
    _check_qualifier(key)
    if isinstance(value, optional.Optional):
        return _opt_index(value, key)
    if isinstance(value, Mapping):
        found = map_lookup(value, key)
        if is_missing(found):
            raise NoSuchKey(key, where)
        return found
    if isinstance(value, list | tuple):
        if type(key) is float and key.is_integer():
            key = int(key)
        if type(key) not in (int, Uint):
            raise NoSuchOverload("_[_]", value, key)
        if not 0 <= key < len(value):
            raise EvalError(f"index out of bounds: {key}")
        return value[key]
    raise NoSuchOverload("_[_]", value, key)


def _call(function: Callable[..., Any], args: list[Eval], name: str) -> Eval:
    call = _make_call(function, args, name)
    call.priced = (function, args)  # type: ignore[attr-defined]  # for _priced
    return call


def _make_call(function: Callable[..., Any], args: list[Eval], name: str) -> Eval:
    def call(scope: Scope) -> Any:
        values = [a(scope) for a in args]
        try:
            return function(*values)
        except TypeError:
            # Wrong arity for every overload of this name.
            raise NoSuchOverload(name, *values) from None

    if len(args) == 1:
        (only,) = args

        def call1(scope: Scope) -> Any:
            value = only(scope)
            try:
                return function(value)
            except TypeError:
                raise NoSuchOverload(name, value) from None

        return call1
    if len(args) == 2:
        first, second = args

        def call2(scope: Scope) -> Any:
            a, b = first(scope), second(scope)
            try:
                return function(a, b)
            except TypeError:
                raise NoSuchOverload(name, a, b) from None

        return call2
    return call


def _same_kind(name: str, a: Any, b: Any) -> str:
    kind = type_name(a)
    if kind != type_name(b) or isinstance(a, bool):
        raise NoSuchOverload(name, a, b)
    return kind


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, Duration | Timestamp):
        return lib_time.add(a, b)
    kind = _same_kind("_+_", a, b)
    if kind == "int":
        return check_int(a + b)
    if kind == "uint":
        return check_uint(a + b)
    if kind in ("double", "string", "bytes"):
        return a + b
    if kind == "list":
        return [*a, *b]
    raise NoSuchOverload("_+_", a, b)


def _sub(a: Any, b: Any) -> Any:
    if isinstance(a, Duration | Timestamp):
        return lib_time.subtract(a, b)
    kind = _same_kind("_-_", a, b)
    if kind == "int":
        return check_int(a - b)
    if kind == "uint":
        return check_uint(a - b)
    if kind == "double":
        return a - b
    raise NoSuchOverload("_-_", a, b)


def _mul(a: Any, b: Any) -> Any:
    kind = _same_kind("_*_", a, b)
    if kind == "int":
        return check_int(a * b)
    if kind == "uint":
        return check_uint(a * b)
    if kind == "double":
        return a * b
    raise NoSuchOverload("_*_", a, b)


def _div(a: Any, b: Any) -> Any:
    kind = _same_kind("_/_", a, b)
    if kind in ("int", "uint"):
        if b == 0:
            raise EvalError("division by zero")
        quotient = abs(a) // abs(b)  # CEL truncates toward zero
        result = -quotient if (a < 0) != (b < 0) else quotient
        return check_int(result) if kind == "int" else Uint(result)
    if kind == "double":
        if b == 0.0:
            if a == 0.0 or a != a:
                return float("nan")
            # IEEE division: the sign of the zero counts (1 / -0.0 is -Inf).
            return math.copysign(float("inf"), a) * math.copysign(1.0, b)
        return a / b
    raise NoSuchOverload("_/_", a, b)


def _mod(a: Any, b: Any) -> Any:
    kind = _same_kind("_%_", a, b)
    if kind in ("int", "uint"):
        if b == 0:
            raise EvalError("modulus by zero")
        if kind == "int" and a == INT64_MIN and b == -1:
            raise EvalError("integer overflow")
        rest = abs(a) % abs(b)  # the sign follows the dividend, as in Go
        return (-rest if a < 0 else rest) if kind == "int" else Uint(rest)
    raise NoSuchOverload("_%_", a, b)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "addition_add": _add,
    "addition_sub": _sub,
    "multiplication_mul": _mul,
    "multiplication_div": _div,
    "multiplication_mod": _mod,
}
_ARITH_NAMES = {
    "addition_add": "_+_",
    "addition_sub": "_-_",
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
}
_ORDER: dict[str, Callable[[int], bool]] = {
    "relation_lt": lambda c: c < 0,
    "relation_le": lambda c: c <= 0,
    "relation_gt": lambda c: c > 0,
    "relation_ge": lambda c: c >= 0,
}


_OPS = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "@in",
}


def _ordering(op: str) -> Callable[[Any, Any], bool]:
    test, symbol = _ORDER[op], _OPS[op]
    return lambda a, b: test(cel_compare(symbol, a, b))


_RELATIONS: dict[str, Callable[[Any, Any], bool]] = {
    "relation_eq": cel_eq,
    "relation_ne": _ne,
    "relation_in": _in,
    **{op: _ordering(op) for op in _ORDER},
}


# -- comprehension macros ------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    """What a macro's iterations cost there (see cost.py): ``step`` at each iteration,
    ``taken`` more when its filter (or exists_one's predicate) is true, ``early`` when a
    quantifier stops with elements left (one more loop test); for sortBy, whether sorting
    by the keys costs by their number (when the scheduler knows the keys' type)."""

    step: int = 0
    taken: int = 0
    early: int = 0
    sized: bool = True


def _loop_costs(name: str, target: Node, parts: list[int]) -> tuple[Loop, int]:
    """A macro's iteration costs and the fixed cost of its result, from the expansion the
    scheduler's parser makes of it: a loop test (all: 2, exists: 3, others: none), the
    accumulator read (1), appending to a list (12) or a map (3), counting (2)."""
    first = parts[0]
    if name == "all":
        return Loop(3 + first, early=2), 1
    if name == "exists":
        return Loop(4 + first, early=3), 1
    if name in ("exists_one", "existsOne"):
        return Loop(first, taken=2), 2
    if name in ("map", "transformList", "transformMap", "transformMapEntry"):
        append = {"transformMap": 3, "transformMapEntry": 2}.get(name, 12)
        if len(parts) == 1:
            return Loop(append + first), 1
        return Loop(first, taken=append + parts[1]), 1
    if name == "filter":
        return Loop(first, taken=13), 1
    if name == "sortBy":
        # cel.bind of the list, read twice; the keys mapped as by map().
        return Loop(12 + first), 3
    # optMap / optFlatMap: hasValue() (1); then value() and the body, of(), or none().
    return Loop(target.cost + 1 + first + (name == "optMap"), taken=1), 1


MacroBuilder = Callable[[Eval, list[str], list[Eval], Loop], Eval]


def _iterate(value: Any, name: str) -> list[tuple[Any, Any]]:
    # One-variable macros see list elements or map keys; two-variable ones (index, value) or
    # (key, value).
    if isinstance(value, list | tuple):
        return list(enumerate(value))
    if isinstance(value, Mapping):
        return list(value.items())
    raise NoSuchOverload(name, value)


def _binder(names: list[str]) -> Callable[[Scope, Any, Any], Scope]:
    if len(names) == 1:
        (only,) = names

        def bind_one(scope: Scope, first: Any, second: Any) -> Scope:
            inner = dict(scope)
            inner[only] = first if isinstance(second, _KeyOnly) else second
            return inner

        return bind_one
    a, b = names

    def bind_two(scope: Scope, first: Any, second: Any) -> Scope:
        inner = dict(scope)
        inner[a] = first
        inner[b] = second.value if isinstance(second, _KeyOnly) else second
        return inner

    return bind_two


class _KeyOnly:
    # Marks map entries for one-variable macros, which bind the key rather than the value.
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _entries(value: Any, name: str, nvars: int) -> list[tuple[Any, Any]]:
    entries = _iterate(value, name)
    if isinstance(value, Mapping) and nvars == 1:
        return [(k, _KeyOnly(v)) for k, v in entries]
    return entries


def _quantifier(name: str, want: bool) -> MacroBuilder:
    # all: any false -> false, else any error -> error; exists: any true -> true, else error.
    def build(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
        (predicate,) = parts
        bind = _binder(names)

        def run(scope: Scope) -> bool:
            error: EvalError | None = None
            entries = _entries(target(scope), name, len(names))
            for i, (first, second) in enumerate(entries):
                cost.charge(scope, loop.step)
                try:
                    value = predicate(bind(scope, first, second))
                except Abort:
                    raise
                except EvalError as exc:
                    error = error or exc
                    continue
                if value is want:
                    if i + 1 < len(entries):
                        cost.charge(scope, loop.early)
                    return bool(value)
                if value is not (not want):
                    error = error or NoSuchOverload(name, value)
            if error is not None:
                raise error
            return not want

        return run

    return build


def _exists_one(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
    (predicate,) = parts
    bind = _binder(names)

    def run(scope: Scope) -> bool:
        count = 0
        for first, second in _entries(target(scope), "exists_one", len(names)):
            cost.charge(scope, loop.step)
            value = predicate(bind(scope, first, second))
            if value is True:
                cost.charge(scope, loop.taken)
                count += 1
            elif value is not False:
                raise NoSuchOverload("exists_one", value)
        return count == 1

    return run


def _filter_of(parts: list[Eval], name: str) -> Callable[[Scope], bool]:
    # map(x, [filter,] transform): with one part there is no filter.
    if len(parts) == 1:
        return lambda _scope: True
    return _predicate(parts[0], name)


def _predicate(keep: Eval, name: str) -> Callable[[Scope], bool]:
    def test(scope: Scope) -> bool:
        value = keep(scope)
        if value is True or value is False:
            return value
        raise NoSuchOverload(name, value)

    return test


def _map_macro(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
    bind, keep, transform = _binder(names), _filter_of(parts, "map"), parts[-1]

    def run(scope: Scope) -> list[Any]:
        out = []
        for first, second in _entries(target(scope), "map", len(names)):
            cost.charge(scope, loop.step)
            inner = bind(scope, first, second)
            if keep(inner):
                cost.charge(scope, loop.taken)
                out.append(transform(inner))
        return out

    return run


def _filter_macro(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
    bind, keep = _binder(names), _predicate(parts[0], "filter")

    def run(scope: Scope) -> list[Any]:
        out = []
        for first, second in _entries(target(scope), "filter", len(names)):
            cost.charge(scope, loop.step)
            if keep(bind(scope, first, second)):
                cost.charge(scope, loop.taken)
                out.append(first if isinstance(second, _KeyOnly) else second)
        return out

    return run


def _map_builder(name: str) -> MacroBuilder:
    # transformMap(k, v, value) sets out[k] = value; transformMapEntry(k, v, {key: value})
    # merges the maps its body makes. Either way a key made twice is the scheduler's
    # "insert failed".
    def build(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
        bind, keep, transform = _binder(names), _filter_of(parts, name), parts[-1]

        def run(scope: Scope) -> Mapping[Any, Any]:
            out = LiteralMap()
            for first, second in _iterate(target(scope), name):
                cost.charge(scope, loop.step)
                inner = bind(scope, first, second)
                if not keep(inner):
                    continue
                cost.charge(scope, loop.taken)
                made = transform(inner)
                if name == "transformMap":
                    _map_insert(out, first, made)
                    continue
                if not isinstance(made, Mapping):
                    raise NoSuchOverload("cel.@mapInsert", out, made)
                for key, value in made.items():
                    _map_insert(out, key, value)
            return out if out else {}

        return run

    return build


def _map_insert(out: LiteralMap, key: Any, value: Any) -> None:
    # cel.@mapInsert: a key the map already has (by CEL's lookup: 1 finds 1u) fails.
    if not is_missing(map_lookup(out, key)):
        shown = key if type(key) is str else format_value(key)
        raise EvalError(f"insert failed: key {shown} already exists")
    out[key] = value


def _opt_mapper(name: str, flat: bool) -> MacroBuilder:
    # optMap wraps the body's value in an optional; optFlatMap's body is an optional already.
    def build(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
        (transform,) = parts
        (var,) = names

        def run(scope: Scope) -> Any:
            found = _optional_value(target(scope), name)
            if found is _NOTHING:
                cost.charge(scope, loop.taken)
                return optional.NONE
            cost.charge(scope, loop.step)
            result = transform({**scope, var: found})
            if not flat:
                return optional.of(result)
            if not isinstance(result, optional.Optional):
                raise NoSuchOverload(name, result)
            return result

        return run

    return build


def _sort_by(target: Eval, names: list[str], parts: list[Eval], loop: Loop) -> Eval:
    (key,) = parts
    bind = _binder(names)

    def run(scope: Scope) -> list[Any]:
        items = target(scope)
        entries = _entries(items, "sortBy", 1)
        keys = []
        for first, second in entries:
            cost.charge(scope, loop.step)
            keys.append(key(bind(scope, first, second)))
        cost.charge(scope, cost.self_compare(keys) if loop.sized else 1)
        return lib_lists.sort_by_keys(items, keys)

    return run


_VALUE_MACROS = frozenset(
    ("map", "transformList", "transformMap", "transformMapEntry", "optMap", "optFlatMap", "sortBy")
)
_FILTERED_MACROS = frozenset(("map", "transformList", "transformMap", "transformMapEntry"))
_MACROS: dict[str, MacroBuilder] = {
    "all": _quantifier("all", False),
    "exists": _quantifier("exists", True),
    "exists_one": _exists_one,
    "existsOne": _exists_one,
    "optMap": _opt_mapper("optMap", flat=False),
    "sortBy": _sort_by,
    "optFlatMap": _opt_mapper("optFlatMap", flat=True),
    "map": _map_macro,
    "filter": _filter_macro,
    "transformList": _map_macro,
    "transformMap": _map_builder("transformMap"),
    "transformMapEntry": _map_builder("transformMapEntry"),
}
