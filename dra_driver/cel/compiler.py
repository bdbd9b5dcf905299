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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from celpy.evaluation import celbytes, celstr
from lark import Token, Tree

from dra_driver.cel import functions
from dra_driver.cel.errors import CompileError, EvalError, NoSuchKey, NoSuchOverload
from dra_driver.cel.lib_core import TYPE_NAMES
from dra_driver.cel.types import CelType, Uint, type_name
from dra_driver.cel.values import (
    INT64_MAX,
    INT64_MIN,
    cel_compare,
    cel_eq,
    check_int,
    check_uint,
    is_missing,
    map_lookup,
)

Scope = dict[str, Any]
Ast = Tree[Token]
Eval = Callable[[Scope], Any]


@dataclass(frozen=True)
class Node:
    """A compiled sub-expression: its closure and its static type."""

    fn: Eval
    type: str = "dyn"
    #: True when the value does not depend on variables (literals, calls on literals).
    const: bool = False


def _const(value: Any, kind: str) -> Node:
    return Node(lambda _scope: value, kind, const=True)


def _folded(fn: Eval, kind: str, args: list[Node]) -> Node:
    # Calls whose arguments are all constant (quantity("40Gi"), semver("8.0.0")) are evaluated
    # once here instead of per device; one that fails stays a runtime error, as CEL requires.
    if args and all(a.const for a in args):
        try:
            return _const(fn({}), kind)
        except EvalError:
            pass
    return Node(fn, kind)


class Compiler:
    """Turns one expression's lark tree into closures; knows the declared variables."""

    def __init__(
        self,
        expression: str,
        variables: Mapping[str, str],
        objects: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """``variables`` maps names to static types; ``objects`` gives object types' fields."""
        self.expression = expression
        self.variables = dict(variables)
        self.objects = dict(objects or {})
        self.bound: list[str] = []  # macro variables in scope while compiling

    # -- helpers ---------------------------------------------------------------------------

    def fail(self, where: Ast | Token, message: str) -> NoReturn:
        """Raise a :class:`CompileError` at ``where``."""
        if isinstance(where, Token):
            line, column = where.line or 1, where.column or 1
        else:
            meta = where.meta
            line = getattr(meta, "line", 1)
            column = getattr(meta, "column", 1)
        raise CompileError(self.expression, message, line, column)

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
        c, a, b = cond.fn, left.fn, right.fn

        def ternary(scope: Scope) -> Any:
            test = c(scope)
            if test is True:
                return a(scope)
            if test is False:
                return b(scope)
            raise NoSuchOverload("_?_:_", test)

        return Node(ternary, left.type if left.type == right.type else "dyn")

    def _conditionalor(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        left, right = (self.compile(c) for c in tree.children if isinstance(c, Tree))
        return Node(_logical(left.fn, right.fn, True), "bool")

    def _conditionaland(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        left, right = (self.compile(c) for c in tree.children if isinstance(c, Tree))
        return Node(_logical(left.fn, right.fn, False), "bool")

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
        if op in ("relation_lt", "relation_le", "relation_gt", "relation_ge"):
            for side in (left, right):
                if side.type in ("quantity", "semver"):
                    self.fail(
                        tree,
                        f"found no matching overload for '{_OPS[op]}' applied to "
                        f"'({side.type}, ...)'; use compareTo, isGreaterThan or isLessThan",
                    )
        fn: Eval
        if op == "relation_eq":
            fn = lambda s: cel_eq(a(s), b(s))  # noqa: E731 - closures are the compiled form
        elif op == "relation_ne":
            fn = lambda s: not cel_eq(a(s), b(s))  # noqa: E731
        elif op == "relation_in":
            fn = lambda s: _in(a(s), b(s))  # noqa: E731
        else:
            test = _ORDER[op]
            symbol = _OPS[op]
            fn = lambda s: test(cel_compare(symbol, a(s), b(s)))  # noqa: E731
        return Node(fn, "bool")

    def _arith(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        op, left, right = self._binary(tree)
        a, b, apply = left.fn, right.fn, _ARITH[op]
        kind = left.type if left.type == right.type and left.type != "dyn" else "dyn"
        return Node(lambda s: apply(a(s), b(s)), kind)

    _addition = _arith
    _multiplication = _arith

    def _unary(self, tree: Ast) -> Node:
        if len(tree.children) == 1:
            return self._single(tree)
        op, operand_tree = tree.children
        assert isinstance(op, Tree) and isinstance(operand_tree, Tree)
        operand = self.compile(operand_tree)
        f = operand.fn
        if op.data == "unary_not":
            return Node(lambda s: _not(f(s)), "bool")
        return Node(lambda s: _neg(f(s)), operand.type)

    # -- members ---------------------------------------------------------------------------

    def _member(self, tree: Ast) -> Node:
        return self._single(tree)

    def _member_dot(self, tree: Ast) -> Node:
        target_tree, name_token = tree.children
        assert isinstance(target_tree, Tree) and isinstance(name_token, Token)
        name = str(name_token)
        qualified = self.qualified_name(target_tree)
        if qualified is not None and qualified.split(".")[0] not in self._names():
            self.fail(tree, f"undeclared reference to '{qualified}.{name}'")
        target = self.compile(target_tree)
        fields = self.objects.get(target.type)
        if fields is not None and name not in fields:
            self.fail(name_token, f"undefined field '{name}'")
        where = self.source(target_tree)
        get = target.fn
        kind = fields[name] if fields is not None else _element_type(target.type)
        return Node(lambda s: _select(get(s), name, where), kind)

    def _member_index(self, tree: Ast) -> Node:
        target_tree, key_tree = tree.children
        assert isinstance(target_tree, Tree) and isinstance(key_tree, Tree)
        target, key = self.compile(target_tree), self.compile(key_tree)
        where = self.source(target_tree)
        get, k = target.fn, key.fn
        return Node(lambda s: _index(get(s), k(s), where), _element_type(target.type))

    def _member_object(self, tree: Ast) -> Node:
        self.fail(tree, "message construction is not supported in DRA selectors")

    def _member_dot_arg(self, tree: Ast) -> Node:
        target_tree, name_token = tree.children[:2]
        assert isinstance(target_tree, Tree) and isinstance(name_token, Token)
        args = self._args(tree.children[2] if len(tree.children) > 2 else None)
        name = str(name_token)
        qualified = self.qualified_name(target_tree)
        if qualified is not None and qualified.split(".")[0] not in self._names():
            return self._global_call(f"{qualified}.{name}", name_token, args)
        if name in _MACROS:
            return self._macro(tree, name, target_tree, args)
        function = functions.MEMBER.get(name)
        if function is None:
            self.fail(name_token, f"undeclared reference to '{name}'")
        target = self.compile(target_tree)
        compiled = [self.compile(a) for a in args]
        return Node(
            _call(function, [target.fn, *(c.fn for c in compiled)], name),
            functions.RETURNS.get(name, "dyn"),
        )

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
        if tree.data == "member_dot":
            inner, name = tree.children
            assert isinstance(inner, Tree)
            prefix = self.qualified_name(inner)
            return None if prefix is None else f"{prefix}.{name}"
        return None

    def _names(self) -> set[str]:
        return set(self.variables) | set(self.bound)

    # -- primaries -------------------------------------------------------------------------

    def _primary(self, tree: Ast) -> Node:
        return self._single(tree)

    def _paren_expr(self, tree: Ast) -> Node:
        return self._single(tree)

    def _ident(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        name = str(token)
        if name in self.bound or name in self.variables:
            kind = self.variables.get(name, "dyn") if name not in self.bound else "dyn"
            return Node(lambda s: s[name], kind)
        if name in TYPE_NAMES:
            return _const(CelType(name), "type")
        self.fail(token, f"undeclared reference to '{name}'")

    def _dot_ident(self, tree: Ast) -> Node:
        return self._ident(tree)

    def _ident_arg(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        name = str(token)
        args = self._args(tree.children[1] if len(tree.children) > 1 else None)
        if name == "has":
            return self._has(tree, args)
        return self._global_call(name, token, args)

    _dot_ident_arg = _ident_arg

    def _global_call(self, name: str, token: Token, args: list[Ast]) -> Node:
        if name == "cel.bind":
            return self._bind(token, args)
        function = functions.GLOBAL.get(name)
        if function is None:
            self.fail(token, f"undeclared reference to '{name}'")
        compiled = [self.compile(a) for a in args]
        kind = "dyn" if name == "dyn" else functions.RETURNS.get(name, "dyn")
        return _folded(_call(function, [c.fn for c in compiled], name), kind, compiled)

    def _list_lit(self, tree: Ast) -> Node:
        items = [self.compile(c) for c in self._args(tree.children[0] if tree.children else None)]
        fns = [i.fn for i in items]
        return Node(lambda s: [f(s) for f in fns], "list")

    def _map_lit(self, tree: Ast) -> Node:
        parts = self._args(tree.children[0] if tree.children else None)
        pairs = [
            (self.compile(k).fn, self.compile(v).fn)
            for k, v in zip(parts[::2], parts[1::2], strict=True)
        ]

        def build(scope: Scope) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            for key_fn, value_fn in pairs:
                key = key_fn(scope)
                if type_name(key) not in ("string", "int", "uint", "bool"):
                    raise EvalError(f"unsupported map key type: {type_name(key)}")
                if not is_missing(map_lookup(out, key)):
                    raise EvalError(f"Failed with repeated key: {key}")
                out[key] = value_fn(scope)
            return out

        return Node(build, "map")

    def _literal(self, tree: Ast) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        text = str(token)
        kind = token.type
        if kind == "BOOL_LIT":
            return _const(text == "true", "bool")
        if kind == "NULL_LIT":
            return _const(None, "null")
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            return _const(str(celstr(token)), "string")
        if kind == "BYTES_LIT":
            return _const(bytes(celbytes(token)), "bytes")
        if kind == "FLOAT_LIT":
            return _const(float(text), "double")
        if kind == "UINT_LIT":
            value = _int_literal(text[:-1])
            if not 0 <= value < 2**64:
                self.fail(token, f"invalid uint literal: {text}")
            return _const(Uint(value), "uint")
        value = _int_literal(text)
        if not INT64_MIN <= value <= INT64_MAX:
            self.fail(token, f"invalid int literal: {text}")
        return _const(value, "int")

    # -- macros ----------------------------------------------------------------------------

    def _has(self, tree: Ast, args: list[Ast]) -> Node:
        select = _unwrap(args[0]) if len(args) == 1 else args[0] if args else None
        if select is None or len(args) != 1 or select.data != "member_dot":
            self.fail(tree, "invalid argument to has() macro")
        target_tree, name_token = select.children
        assert isinstance(target_tree, Tree)
        target = self.compile(target_tree)
        name = str(name_token)
        fields = self.objects.get(target.type)
        if fields is not None and name not in fields:
            self.fail(select, f"undefined field '{name}'")
        get = target.fn

        def has(scope: Scope) -> bool:
            value = get(scope)
            if isinstance(value, Mapping):
                return not is_missing(map_lookup(value, name))
            raise NoSuchOverload("has", value)

        return Node(has, "bool")

    def _bind(self, token: Token, args: list[Ast]) -> Node:
        if len(args) != 3:
            self.fail(token, "cel.bind() takes a variable, an initial value and an expression")
        var = self._macro_var(args[0])
        init = self.compile(args[1]).fn
        body = self._with_bound([var], args[2])
        body_fn = body.fn

        def bind(scope: Scope) -> Any:
            inner = dict(scope)
            inner[var] = init(scope)
            return body_fn(inner)

        return Node(bind, body.type)

    def _macro_var(self, tree: Ast) -> str:
        name = self.qualified_name(_unwrap(tree))
        if name is None or "." in name:
            self.fail(tree, "argument is not an identifier")
        return name

    def _with_bound(self, names: list[str], tree: Ast) -> Node:
        self.bound.extend(names)
        try:
            return self.compile(tree)
        finally:
            del self.bound[-len(names) :]

    def _macro(self, tree: Ast, name: str, target_tree: Ast, args: list[Ast]) -> Node:
        two_var = name in ("transformList", "transformMap") or (
            name in ("all", "exists", "exists_one", "existsOne") and len(args) == 3
        )
        nvars = 2 if two_var else 1
        if (
            len(args) < nvars + 1
            or len(args) > nvars + 2
            or (len(args) == nvars + 2 and name not in ("map", "transformList", "transformMap"))
        ):
            self.fail(tree, f"wrong number of arguments to the {name}() macro")
        names = [self._macro_var(a) for a in args[:nvars]]
        parts = [self._with_bound(names, a).fn for a in args[nvars:]]
        target = self.compile(target_tree).fn
        build = _MACROS[name]
        kind = "bool" if name in ("all", "exists", "exists_one", "existsOne") else "dyn"
        return Node(build(target, names, parts), kind)


# -- runtime helpers -----------------------------------------------------------------------


def _int_literal(text: str) -> int:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    value = int(body, 16) if body[:2].lower() == "0x" else int(body)
    return -value if negative else value


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
        except EvalError as exc:
            error = exc
        else:
            if value is decisive:
                return is_or
            if value is not (not decisive):
                error = NoSuchOverload(name, value)
        try:
            other = right(scope)
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
        return any(cel_eq(item, x) for x in container)
    if isinstance(container, Mapping):
        # Membership looks at the keys really present: a map with a default value (the
        # device's attribute domains) still answers "in" truthfully.
        if type(item) is str:
            return item in container
        return any(cel_eq(item, key) for key in container)
    raise NoSuchOverload("@in", item, container)


def _select(value: Any, name: str, where: str) -> Any:
    if isinstance(value, Mapping):
        found = value.get(name, _NOTHING)
        if found is _NOTHING:
            raise NoSuchKey(name, where)
        return found
    raise EvalError(f"type '{type_name(value)}' does not support field selection")


_NOTHING = object()


def _index(value: Any, key: Any, where: str) -> Any:
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
            return float("nan") if a == 0.0 or a != a else float("inf") * (1 if a > 0 else -1)
        return a / b
    raise NoSuchOverload("_/_", a, b)


def _mod(a: Any, b: Any) -> Any:
    kind = _same_kind("_%_", a, b)
    if kind in ("int", "uint"):
        if b == 0:
            raise EvalError("modulus by zero")
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


def _element_type(container: str) -> str:
    # Nested map types of the DRA device: attributes[domain][name], capacity[domain][name].
    return {
        "attributes": "attribute_domain",
        "capacity": "capacity_domain",
        "capacity_domain": "quantity",
    }.get(container, "dyn")


# -- comprehension macros ------------------------------------------------------------------

MacroBuilder = Callable[[Eval, list[str], list[Eval]], Eval]


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
    def build(target: Eval, names: list[str], parts: list[Eval]) -> Eval:
        (predicate,) = parts
        bind = _binder(names)

        def run(scope: Scope) -> bool:
            error: EvalError | None = None
            for first, second in _entries(target(scope), name, len(names)):
                try:
                    value = predicate(bind(scope, first, second))
                except EvalError as exc:
                    error = error or exc
                    continue
                if value is want:
                    return bool(value)
                if value is not (not want):
                    error = error or NoSuchOverload(name, value)
            if error is not None:
                raise error
            return not want

        return run

    return build


def _exists_one(target: Eval, names: list[str], parts: list[Eval]) -> Eval:
    (predicate,) = parts
    bind = _binder(names)

    def run(scope: Scope) -> bool:
        count = 0
        for first, second in _entries(target(scope), "exists_one", len(names)):
            value = predicate(bind(scope, first, second))
            if value is True:
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


def _map_macro(target: Eval, names: list[str], parts: list[Eval]) -> Eval:
    bind, keep, transform = _binder(names), _filter_of(parts, "map"), parts[-1]

    def run(scope: Scope) -> list[Any]:
        out = []
        for first, second in _entries(target(scope), "map", len(names)):
            inner = bind(scope, first, second)
            if keep(inner):
                out.append(transform(inner))
        return out

    return run


def _filter_macro(target: Eval, names: list[str], parts: list[Eval]) -> Eval:
    bind, keep = _binder(names), _predicate(parts[0], "filter")

    def run(scope: Scope) -> list[Any]:
        out = []
        for first, second in _entries(target(scope), "filter", len(names)):
            if keep(bind(scope, first, second)):
                out.append(first if isinstance(second, _KeyOnly) else second)
        return out

    return run


def _transform_map(target: Eval, names: list[str], parts: list[Eval]) -> Eval:
    bind, keep, transform = _binder(names), _filter_of(parts, "transformMap"), parts[-1]

    def run(scope: Scope) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for first, second in _iterate(target(scope), "transformMap"):
            inner = bind(scope, first, second)
            if keep(inner):
                out[first] = transform(inner)
        return out

    return run


_MACROS: dict[str, MacroBuilder] = {
    "all": _quantifier("all", False),
    "exists": _quantifier("exists", True),
    "exists_one": _exists_one,
    "existsOne": _exists_one,
    "map": _map_macro,
    "filter": _filter_macro,
    "transformList": _map_macro,
    "transformMap": _transform_map,
}
