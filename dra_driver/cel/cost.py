"""The scheduler's runtime cost limit: 1,000,000 units per selector and device.

The scheduler (cel-go's cost tracker, with Kubernetes' cost estimator) charges each step of
evaluation and stops a selector at 1,000,000 with "operation cancelled: actual cost limit
exceeded", which ``||``, ``&&`` and macros do not absorb. The engine charges the same units:

- fixed costs, known while compiling (:attr:`compiler.Node.cost`): 1 per variable read and
  per field or index qualifier, 1 per call or operator, 10 per list literal, 30 per map
  literal, 40 per message; literals, and literals of lists and maps and conversions of
  constants (which the scheduler folds while planning), cost nothing; so do ``&&``, ``||``,
  ``?:`` and ``cel.bind`` themselves. A conditional's branch that is a variable or field
  read does not pay for the variable, only for its qualifiers.
- costs that depend on the values (:data:`DYNAMIC`), charged after the call: strings and
  bytes cost by their size (``+`` 0.1 per character of the result, ``replace`` and ``split``
  0.2 per character of the input, ``join`` 0.2 per character of the result, comparisons
  0.1 per character of the shorter side, ``contains`` and the regular expressions the
  product of both sizes, ...), ``x in list`` the list's size, ``sort`` and ``distinct`` the
  square of it, ``lists.range(n)`` n + 11.
- each macro iteration its own steps (``all``: 3, ``exists``: 4, ``map``: 12 for appending
  to the result, ...) plus its body, and a quantifier that stops early one more loop test.

A selector whose cost is bounded well below the limit, whatever the device (no loops, no
``cel.bind``, no function that multiplies a string's size, and no huge literals), carries no
counter: :func:`needs_counting` decides that from the syntax, with the API's limits on
device values (strings of at most 64 characters).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lark import Token, Tree

from dra_driver.cel.errors import Abort

LIMIT = 1_000_000
#: Where an evaluation's running cost lives in its scope (not a valid CEL identifier).
KEY = "@cost"
#: cel-go's common.StringTraversalCostFactor and RegexStringLengthCostFactor.
TRAVERSAL = 0.1
REGEX = 0.25
LIST_LITERAL = 10
MAP_LITERAL = 30
MESSAGE_LITERAL = 40
#: A function that builds a list (lists.range, slice, reverse, ...): its call and the list.
LIST_CALL = 1 + LIST_LITERAL

#: Macros: their variables are not reads, and their bodies are charged per iteration.
MACROS = frozenset(
    ("all", "exists", "exists_one", "existsOne", "map", "filter", "transformList",
     "transformMap", "transformMapEntry", "optMap", "optFlatMap", "sortBy")
)  # fmt: skip


def charge(scope: dict[str, Any], amount: int) -> None:
    """Add ``amount`` to the evaluation's cost; the scheduler's error past the limit."""
    counter = scope.get(KEY)
    if counter is None:
        return
    counter[0] += amount
    if counter[0] > LIMIT:
        raise Abort("operation cancelled: actual cost limit exceeded")


# -- sizes ---------------------------------------------------------------------------------


def size(value: Any) -> int:
    """cel-go's actualSize: code points of a string, bytes, elements of a list or map, the
    address bytes of an IP, the prefix bytes of a CIDR; 1 for anything else."""
    if isinstance(value, str | bytes | list | tuple | Mapping):
        return len(value)
    kind = _type(value)
    if kind == "net.IP":
        return 4 if int(value.address.version) == 4 else 16
    if kind == "net.CIDR":
        return math.ceil(int(value.bits) / 8)
    return 1


def traversal(value: Any) -> int:
    """Kubernetes' traversalCost: 0.1 per UTF-8 byte of a string (rounded down), summed over
    a list's elements or a map's keys and values, 1 for anything else."""
    if isinstance(value, str):
        return int(float(len(value.encode())) * TRAVERSAL)
    if isinstance(value, bytes):
        return int(float(len(value)) * TRAVERSAL)
    if isinstance(value, list | tuple):
        return sum(traversal(v) for v in value)
    if isinstance(value, Mapping):
        return sum(traversal(k) + traversal(v) for k, v in value.items())
    return 1


def _scan(value: Any) -> int:
    return _per_character(size(value))


def _per_character(n: int) -> int:
    return math.ceil(float(n) * TRAVERSAL)


# -- calls whose cost depends on their values --------------------------------------------

Price = Callable[[Sequence[Any], Any], int]

#: The Kubernetes types whose == costs 1 whatever their size (Kubernetes' estimator).
_KUBERNETES_EQUALITY = frozenset(
    ("kubernetes.Quantity", "net.IP", "net.CIDR", "kubernetes.NamedFormat", "kubernetes.URL",
     "kubernetes.Semver")
)  # fmt: skip
#: A named format's regular expression size, as Kubernetes estimates it for validate().
FORMAT_REGEX_SIZE = {
    "DNS1123Label": 30, "DNS1123Subdomain": 60, "DNS1035Label": 30, "QualifiedName": 60,
    "DNS1123LabelPrefix": 30, "DNS1123SubdomainPrefix": 60, "DNS1035LabelPrefix": 30,
    "LabelValue": 40, "URI": 1103, "uuid": 70, "byte": 84, "date": 71, "datetime": 71,
}  # fmt: skip


def _type(value: Any) -> str:
    name = getattr(type(value), "cel_type_name", None)
    return name if isinstance(name, str) else ""


def _equals(args: Sequence[Any], _result: Any) -> int:
    if _type(args[0]) in _KUBERNETES_EQUALITY:
        return 1
    return _per_character(min(size(args[0]), size(args[1])))


def _compare(args: Sequence[Any], _result: Any) -> int:
    # Ordering is O(min(m, n)) for strings and bytes, constant for the rest.
    a, b = args
    if (type(a) is str and type(b) is str) or (type(a) is bytes and type(b) is bytes):
        return _per_character(min(len(a), len(b)))
    return 1


def _add(args: Sequence[Any], _result: Any) -> int:
    a, b = args
    if isinstance(a, str | bytes) and type(a) is type(b):
        return math.ceil(float(len(a) + len(b)) * TRAVERSAL)
    return 1


def _in(args: Sequence[Any], _result: Any) -> int:
    container = args[1]
    return len(container) if isinstance(container, list | tuple) else 1


def _regex(args: Sequence[Any], _result: Any) -> int:
    text, pattern = args[0], args[1]
    scan = math.ceil((1.0 + float(size(text))) * TRAVERSAL)
    return scan * math.ceil(float(size(pattern)) * REGEX)


def _contains(args: Sequence[Any], _result: Any) -> int:
    return _scan(args[0]) * _scan(args[1])


def _receiver(args: Sequence[Any], _result: Any) -> int:
    return _scan(args[0])


def _receiver_twice(args: Sequence[Any], _result: Any) -> int:
    return math.ceil(float(size(args[0])) * 2 * TRAVERSAL)


def _argument(args: Sequence[Any], _result: Any) -> int:
    return _scan(args[1])


def _join(_args: Sequence[Any], result: Any) -> int:
    return math.ceil(float(size(result)) * 2 * TRAVERSAL)


def _traverse(args: Sequence[Any], _result: Any) -> int:
    return traversal(args[0])


def _conversion(source: type) -> Price:
    # string(bytes) and bytes(string) copy; the other conversions cost 1.
    def price(args: Sequence[Any], _result: Any) -> int:
        return _scan(args[0]) if type(args[0]) is source else 1

    return price


def _ip(args: Sequence[Any], _result: Any) -> int:
    return 1 if _type(args[0]) == "net.CIDR" else _scan(args[0])


def _contains_ip(args: Sequence[Any], _result: Any) -> int:
    prefix = size(args[0])
    total = math.ceil(float(prefix + prefix) * TRAVERSAL)
    return total + (_scan(args[1]) if type(args[1]) is str else 0)


def _contains_cidr(args: Sequence[Any], _result: Any) -> int:
    prefix = size(args[0])
    total = math.ceil(float(prefix + prefix) * TRAVERSAL) + _scan(args[0]) + 1
    return total + (_scan(args[1]) if type(args[1]) is str else 0)


def _validate(args: Sequence[Any], _result: Any) -> int:
    regex = FORMAT_REGEX_SIZE.get(getattr(args[0], "name", ""))
    if regex is None:
        return 1
    scan = math.ceil((1.0 + float(size(args[1]))) * TRAVERSAL)
    return scan * math.ceil(float(regex) * REGEX)


def _sets(factor: float) -> Price:
    def price(args: Sequence[Any], _result: Any) -> int:
        return 1 + int(float(size(args[0]) * size(args[1])) * factor)

    return price


def self_compare(items: Any) -> int:
    """``sort``, ``distinct`` and sorting by keys: the square of the list's size."""
    n = size(items)
    factor = 2.0
    if n and isinstance(items[0], str | bytes):
        factor += TRAVERSAL
    return int(float(n * n) * factor) + LIST_CALL


def _self_compare(args: Sequence[Any], _result: Any) -> int:
    return self_compare(args[0])


def _built_list(_args: Sequence[Any], result: Any) -> int:
    return size(result) + LIST_CALL


def _flatten(args: Sequence[Any], _result: Any) -> int:
    depth = float(args[1]) if len(args) > 1 else 1.0
    return int(float(size(args[0])) * (depth if depth >= 0 else 1.0)) + LIST_CALL


#: Engine function names (operators by their CEL names) whose cost depends on the values:
#: the price of one call, given its arguments (the receiver first) and its result.
DYNAMIC: dict[str, Price] = {
    "_==_": _equals,
    "_!=_": lambda args, _result: _per_character(min(size(args[0]), size(args[1]))),
    "_<_": _compare,
    "_<=_": _compare,
    "_>_": _compare,
    "_>=_": _compare,
    "_+_": _add,
    "@in": _in,
    "matches": _regex,
    "find": _regex,
    "findAll": _regex,
    "contains": _contains,
    "startsWith": _argument,
    "endsWith": _argument,
    "lowerAscii": _receiver,
    "upperAscii": _receiver,
    "substring": _receiver,
    "trim": _receiver,
    "url": _receiver,
    "format": _receiver,
    "strings.quote": _receiver,
    "quantity": _receiver,
    "isQuantity": _receiver,
    "semver": _receiver,
    "isSemver": _receiver,
    "cidr": _receiver,
    "isIP": _receiver,
    "isCIDR": _receiver,
    "ip": _ip,
    "ip.isCanonical": _receiver_twice,
    "replace": _receiver_twice,
    "split": _receiver_twice,
    "join": _join,
    "indexOf": _traverse,
    "lastIndexOf": _traverse,
    "isSorted": _traverse,
    "sum": _traverse,
    "max": _traverse,
    "min": _traverse,
    "includes": _traverse,
    "string": _conversion(bytes),
    "bytes": _conversion(str),
    "containsIP": _contains_ip,
    "containsCIDR": _contains_cidr,
    "validate": _validate,
    "sets.contains": _sets(1.0),
    "sets.intersects": _sets(1.0),
    "sets.equivalent": _sets(2.0),
    "sort": _self_compare,
    "distinct": _self_compare,
    "flatten": _flatten,
    "slice": _built_list,
    "reverse": _built_list,
    "lists.range": _built_list,
    "@sortByAssociatedKeys": lambda args, _result: self_compare(args[1]),
}


#: Calls whose cost above is the scheduler's only when it knows their overload while
#: compiling (cel-go keys it by overload): with ``dyn`` arguments that match several
#: overloads (``dyn + dyn``, ``x in dyn``, ``string(dyn)``), it dispatches when evaluating,
#: and the call costs 1 whatever the sizes.
BY_OVERLOAD = frozenset(
    ("_+_", "_<_", "_<=_", "_>_", "_>=_", "@in", "string", "bytes", "sort",
     "@sortByAssociatedKeys")
)  # fmt: skip


def price(name: str, args: Sequence[Any], result: Any) -> int:
    """The cost of one call of ``name`` (1 for functions of fixed cost)."""
    found = DYNAMIC.get(name)
    return 1 if found is None else found(args, result)


# -- whether a selector needs counting -------------------------------------------------------

#: Functions that can multiply a value's size (or whose cost is quadratic): with them, as with
#: loops and cel.bind, a short selector can reach the limit, so its cost is counted.
_UNBOUNDED = frozenset(
    ("replace", "split", "join", "format", "strings.quote", "sort", "distinct", "flatten",
     "sets.contains", "sets.intersects", "sets.equivalent", "lists.range", "cel.bind")
) | MACROS  # fmt: skip
_NAMESPACES = frozenset(("sets", "lists", "strings", "cel"))
#: Functions costing the product of two sizes.
_PRODUCTS = frozenset(("contains", "matches", "find", "findAll", "validate"))
#: The most a device value read by a selector holds (the API's 64 characters for strings,
#: 48 list values, 32 attributes): a bound, for deciding whether to count.
DEVICE_VALUE = 64


def needs_counting(tree: Tree[Token], expression: str) -> bool:
    """Whether ``tree`` can reach the limit: it has loops, cel.bind or size-multiplying
    functions, or an upper bound of its cost, from its syntax, exceeds the limit."""
    fixed = values = linear = products = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        data = node.data
        fixed += {"list_lit": 10, "map_lit": 30, "member_object": 40}.get(data, 1)
        if data in ("member_dot_arg", "ident_arg", "dot_ident_arg"):
            name = str(node.children[1] if data == "member_dot_arg" else node.children[0])
            if name in _UNBOUNDED or f"{_namespace(node)}.{name}" in _UNBOUNDED:
                return True
            values += 1
            if name in _PRODUCTS:
                products += 1
            else:
                linear += 1
        elif data in ("ident", "dot_ident"):
            values += 1
        elif data in ("relation", "addition", "multiplication", "unary") and len(node.children) > 1:
            linear += 1
        stack.extend(c for c in node.children if isinstance(c, Tree))
    # Without the above, a string is at most every literal and device value put together.
    most = float(len(expression) + DEVICE_VALUE * values)
    bound = (
        fixed
        + linear * (0.4 * most + 2)
        + products * (TRAVERSAL * most + 2) * (REGEX * max(most, 1103.0) + 2)
    )
    return bound > LIMIT


def _namespace(call: Tree[Token]) -> str:
    # "sets" for sets.contains(...) (a member call on the namespace's name), else "".
    if call.data != "member_dot_arg":
        return ""
    target = call.children[0]
    while isinstance(target, Tree) and len(target.children) == 1:
        target = target.children[0]
    name = str(target)
    return name if not isinstance(target, Tree) and name in _NAMESPACES else ""
