"""Static types and overload resolution: the compile-time checks the scheduler's CEL makes.

Types are CEL type names as the scheduler prints them (``int``, ``list(string)``,
``map(string, dyn)``, ``kubernetes.Quantity``, ``optional_type(int)``). ``dyn`` matches
anything; ``_`` is the element type of an empty list or map literal, not yet known; single
capital letters in signatures are type parameters. A call whose argument types match no
overload is a compile error, as in the scheduler, instead of a runtime "no such overload".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

DYN = "dyn"
FREE = "_"
#: Unpacks to any value: checked like dyn, except that a selector may not evaluate to it.
ANY = "google.protobuf.Any"
#: Object types, which null is assignable to (the call then fails at runtime).
NULLABLE = frozenset(
    (
        "kubernetes.DRADevice",
        "kubernetes.Quantity",
        "kubernetes.Semver",
        "kubernetes.URL",
        "kubernetes.NamedFormat",
        "net.IP",
        "net.CIDR",
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
    )
)


@lru_cache(maxsize=4096)
def split(kind: str) -> tuple[str, tuple[str, ...]]:
    """``map(string, list(int))`` -> ``("map", ("string", "list(int)"))``."""
    start = kind.find("(")
    if start < 0 or not kind.endswith(")"):
        return kind, ()
    params: list[str] = []
    depth, begin = 0, start + 1
    for i in range(start + 1, len(kind) - 1):
        c = kind[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            params.append(kind[begin:i].strip())
            begin = i + 1
    params.append(kind[begin:-1].strip())
    return kind[:start], tuple(p for p in params if p)


def join(name: str, *params: str) -> str:
    """The inverse of :func:`split`."""
    return f"{name}({', '.join(params)})" if params else name


def list_of(element: str) -> str:
    """``list(element)``."""
    return join("list", element)


def map_of(key: str, value: str) -> str:
    """``map(key, value)``."""
    return join("map", key, value)


def element(kind: str) -> str:
    """The element type of a list, the value type of a map, the value of an optional; else dyn."""
    name, params = split(kind)
    if name in ("list", "optional_type") and params:
        return _known(params[0])
    if name == "map" and len(params) == 2:
        return _known(params[1])
    return DYN


def key(kind: str) -> str:
    """The key type of a map, else dyn."""
    name, params = split(kind)
    return _known(params[0]) if name == "map" and len(params) == 2 else DYN


def _known(kind: str) -> str:
    return DYN if kind == FREE else kind


def is_type_param(kind: str) -> bool:
    """Single capital letters are type parameters of signatures."""
    return len(kind) == 1 and kind.isupper()


def unify(param: str, arg: str, bound: dict[str, str]) -> bool:
    """Whether ``arg`` can be passed where ``param`` is expected, binding type parameters."""
    if is_type_param(param):
        if param in bound:
            previous = bound[param]
            if not unify(previous, arg, bound):
                return False
            # As cel-go: the parameter stands for the more general of the two, the later
            # one when both are (dyn and Any): (Any, bool) and (dyn, Any) give Any.
            bound[param] = most_general(arg, previous)
            return True
        bound[param] = arg
        return True
    if param in (DYN, FREE, ANY) or arg in (DYN, FREE, ANY):
        return True
    if arg.startswith("wrapper(") or param.startswith("wrapper("):
        # A protobuf wrapper is its value type, or null.
        if "null" in (param, arg):
            return True
        return unify(_unwrapped(param), _unwrapped(arg), bound)
    if "null" in (param, arg) and {param, arg} & NULLABLE:
        return True
    pname, pparams = split(param)
    aname, aparams = split(arg)
    if pname != aname or len(pparams) != len(aparams):
        return False
    return all(unify(p, a, bound) for p, a in zip(pparams, aparams, strict=True))


def _less_specific(a: str, b: str) -> bool:
    if a in (DYN, ANY, FREE) or is_type_param(a):
        return True
    if b in (DYN, ANY, FREE) or is_type_param(b):
        return False
    aname, aparams = split(a)
    bname, bparams = split(b)
    if aname != bname or len(aparams) != len(bparams):
        return False
    return all(_less_specific(x, y) for x, y in zip(aparams, bparams, strict=True))


def most_general(a: str, b: str) -> str:
    """``a`` when it is as general as ``b`` or more (dyn, Any, a parameter), else ``b``."""
    return a if _less_specific(a, b) else b


def _unwrapped(kind: str) -> str:
    name, params = split(kind)
    return params[0] if name == "wrapper" and params else kind


def substitute(kind: str, bound: Mapping[str, str]) -> str:
    """``kind`` with its type parameters replaced (unbound ones by dyn)."""
    if is_type_param(kind):
        return _known(bound.get(kind, DYN))
    name, params = split(kind)
    if not params:
        return kind
    return join(name, *(substitute(p, bound) for p in params))


def same(a: str, b: str) -> bool:
    """Equal types, where the unknown element type of an empty literal equals anything."""
    if a == FREE or b == FREE:
        return True
    a, b = _unwrapped(a), _unwrapped(b)
    aname, aparams = split(a)
    bname, bparams = split(b)
    if aname != bname or len(aparams) != len(bparams):
        return False
    return all(same(x, y) for x, y in zip(aparams, bparams, strict=True))


def common(types: Sequence[str]) -> str:
    """The type of a literal's elements (the first one that is known), ``_`` when empty."""
    for t in types:
        if t != FREE:
            return t
    return FREE


@dataclass(frozen=True)
class Signature:
    """One overload: ``receiver`` is None for a global function."""

    receiver: str | None
    params: tuple[str, ...]
    result: str


def parse_signature(text: str) -> Signature:
    """``"string.(string, int) -> int"`` or ``"(list(A)) -> int"``."""
    call, _, result = text.partition(" -> ")
    receiver, dot, args = call.partition(".(")
    if not dot:
        return Signature(None, split("f" + call)[1], result.strip())
    return Signature(receiver, split("f(" + args)[1], result.strip())


def resolve(
    signatures: Sequence[Signature], receiver: str | None, args: Sequence[str]
) -> str | None:
    """The result type of the call, or None when no overload accepts these argument types."""
    results = _matching(signatures, receiver, args)
    if not results:
        return None
    return results[0] if all(r == results[0] for r in results) else DYN


def overloads(signatures: Sequence[Signature], receiver: str | None, args: Sequence[str]) -> int:
    """How many overloads accept these argument types: with one, the scheduler knows the
    overload while compiling; with more (``dyn`` arguments) it dispatches when evaluating."""
    return len(_matching(signatures, receiver, args))


def _matching(
    signatures: Sequence[Signature], receiver: str | None, args: Sequence[str]
) -> list[str]:
    results = []
    for sig in signatures:
        if (sig.receiver is None) != (receiver is None) or len(sig.params) != len(args):
            continue
        bound: dict[str, str] = {}
        if (
            sig.receiver is not None
            and receiver is not None
            and not unify(sig.receiver, receiver, bound)
        ):
            continue
        if all(unify(p, a, bound) for p, a in zip(sig.params, args, strict=True)):
            results.append(substitute(sig.result, bound))
    return results


def describe_call(receiver: str | None, args: Sequence[str]) -> str:
    """How the scheduler names the argument types: ``'(int, string)'`` or ``'string.(int)'``."""
    shown = ", ".join(_shown(a) for a in args)
    return f"{_shown(receiver)}.({shown})" if receiver is not None else f"({shown})"


def _shown(kind: str) -> str:
    if kind == FREE:
        return DYN
    name, params = split(kind)
    return join(name, *(_shown(p) for p in params)) if params else kind
