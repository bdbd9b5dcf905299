"""The overloads of every function and operator of the DRA environment, for type checking.

Written as ``receiver.(param, ...) -> result`` (member functions) or ``(param, ...) -> result``
(global ones), in the scheduler's type names; ``A`` and ``B`` are type parameters.
"""

from __future__ import annotations

from dra_driver.cel.checker import Signature, parse_signature
from dra_driver.cel.lib_format import FORMATS

Q = "kubernetes.Quantity"
S = "kubernetes.Semver"
_NUMBERS = ("int", "uint", "double")
_TS = "google.protobuf.Timestamp"
_DUR = "google.protobuf.Duration"
IP = "net.IP"
CIDR = "net.CIDR"
URL = "kubernetes.URL"
FORMAT = "kubernetes.NamedFormat"
_COMPARABLE = (*_NUMBERS, "string", "bytes", "bool", _TS, _DUR)

_TEXT: dict[str, list[str]] = {
    # operators
    "_==_": ["(A, A) -> bool"],
    "_!=_": ["(A, A) -> bool"],
    "@in": ["(A, list(A)) -> bool", "(A, map(A, B)) -> bool"],
    "_<_": [f"({a}, {b}) -> bool" for a in _NUMBERS for b in _NUMBERS]
    + ["(string, string) -> bool", "(bytes, bytes) -> bool", "(bool, bool) -> bool"]
    + [f"({t}, {t}) -> bool" for t in (_TS, _DUR)],
    "_+_": [f"({t}, {t}) -> {t}" for t in (*_NUMBERS, "string", "bytes")]
    + ["(list(A), list(A)) -> list(A)", f"({_TS}, {_DUR}) -> {_TS}", f"({_DUR}, {_TS}) -> {_TS}",
       f"({_DUR}, {_DUR}) -> {_DUR}"],
    "_-_": [f"({t}, {t}) -> {t}" for t in _NUMBERS]
    + [f"({_TS}, {_TS}) -> {_DUR}", f"({_TS}, {_DUR}) -> {_TS}", f"({_DUR}, {_DUR}) -> {_DUR}"],
    "_*_": [f"({t}, {t}) -> {t}" for t in _NUMBERS],
    "_/_": [f"({t}, {t}) -> {t}" for t in _NUMBERS],
    "_%_": ["(int, int) -> int", "(uint, uint) -> uint"],
    "-_": ["(int) -> int", "(double) -> double"],
    "!_": ["(bool) -> bool"],
    "_[_]": ["(list(A), int) -> A", "(map(A, B), A) -> B",
             "(optional_type(list(A)), int) -> optional_type(A)",
             "(optional_type(map(A, B)), A) -> optional_type(B)"],
    "_[?_]": ["(list(A), int) -> A", "(map(A, B), A) -> B"],
    "_?_:_": ["(bool, A, A) -> A"],
    # core
    "size": ["(string) -> int", "(bytes) -> int", "(list(A)) -> int", "(map(A, B)) -> int",
             "string.() -> int", "bytes.() -> int", "list(A).() -> int", "map(A, B).() -> int"],
    "contains": ["string.(string) -> bool"],
    "startsWith": ["string.(string) -> bool"],
    "endsWith": ["string.(string) -> bool"],
    "matches": ["(string, string) -> bool", "string.(string) -> bool"],
    "int": ["(int) -> int", "(uint) -> int", "(double) -> int", "(string) -> int",
            f"({_TS}) -> int", f"({_DUR}) -> int"],
    "uint": ["(uint) -> uint", "(int) -> uint", "(double) -> uint", "(string) -> uint"],
    "double": ["(double) -> double", "(int) -> double", "(uint) -> double", "(string) -> double"],
    "string": [f"({t}) -> string"
               for t in ("string", "int", "uint", "double", "bool", "bytes", _TS, _DUR, IP, CIDR)],
    "bytes": ["(bytes) -> bytes", "(string) -> bytes"],
    "bool": ["(bool) -> bool", "(string) -> bool"],
    "dyn": ["(A) -> dyn"],
    "type": ["(A) -> type"],
    # timestamps and durations
    "duration": ["(string) -> " + _DUR, f"({_DUR}) -> {_DUR}"],
    "timestamp": ["(string) -> " + _TS, "(int) -> " + _TS, f"({_TS}) -> {_TS}"],
    **{
        getter: [f"{_TS}.() -> int", f"{_TS}.(string) -> int"]
        for getter in ("getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek",
                       "getDayOfYear")
    },
    **{
        getter: [f"{_TS}.() -> int", f"{_TS}.(string) -> int", f"{_DUR}.() -> int"]
        for getter in ("getHours", "getMinutes", "getSeconds", "getMilliseconds")
    },
    # ip and cidr
    "ip": ["(string) -> " + IP, f"{CIDR}.() -> {IP}"],
    "isIP": ["(string) -> bool"],
    "ip.isCanonical": ["(string) -> bool"],
    "family": [f"{IP}.() -> int"],
    **{
        test: [f"{IP}.() -> bool"]
        for test in ("isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast",
                     "isGlobalUnicast")
    },
    "cidr": ["(string) -> " + CIDR],
    "isCIDR": ["(string) -> bool"],
    "containsIP": [f"{CIDR}.(string) -> bool", f"{CIDR}.({IP}) -> bool"],
    "containsCIDR": [f"{CIDR}.(string) -> bool", f"{CIDR}.({CIDR}) -> bool"],
    "prefixLength": [f"{CIDR}.() -> int"],
    "masked": [f"{CIDR}.() -> {CIDR}"],
    # url
    "url": ["(string) -> " + URL],
    "isURL": ["(string) -> bool"],
    **{part: [f"{URL}.() -> string"]
       for part in ("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath")},
    "getQuery": [f"{URL}.() -> map(string, list(string))"],
    # format
    "format.named": [f"(string) -> optional_type({FORMAT})"],
    **{f"format.{name}": [f"() -> {FORMAT}"] for name in FORMATS},
    "validate": [f"{FORMAT}.(string) -> optional_type(list(string))"],
    # strings extension
    "charAt": ["string.(int) -> string"],
    "indexOf": ["string.(string) -> int", "string.(string, int) -> int", "list(A).(A) -> int"],
    "lastIndexOf": ["string.(string) -> int", "string.(string, int) -> int", "list(A).(A) -> int"],
    "lowerAscii": ["string.() -> string"],
    "upperAscii": ["string.() -> string"],
    "replace": ["string.(string, string) -> string", "string.(string, string, int) -> string"],
    "split": ["string.(string) -> list(string)", "string.(string, int) -> list(string)"],
    "substring": ["string.(int) -> string", "string.(int, int) -> string"],
    "trim": ["string.() -> string"],
    "join": ["list(string).() -> string", "list(string).(string) -> string"],
    "strings.quote": ["(string) -> string"],
    "format": ["string.(list(dyn)) -> string"],
    # The strings extension reverses strings from version 3 on; the scheduler's is version 2.
    "reverse": ["list(A).() -> list(A)"],
    # regex
    "find": ["string.(string) -> string"],
    "findAll": ["string.(string) -> list(string)", "string.(string, int) -> list(string)"],
    # lists extension and the Kubernetes list library
    "distinct": ["list(A).() -> list(A)"],
    "flatten": ["list(list(A)).() -> list(A)", "list(list(A)).(int) -> list(dyn)"],
    "slice": ["list(A).(int, int) -> list(A)"],
    "sort": [f"list({t}).() -> list({t})" for t in _COMPARABLE],
    "lists.range": ["(int) -> list(int)"],
    "includes": ["dyn.(dyn) -> bool"],
    "@sortByAssociatedKeys": [f"list(A).(list({t})) -> list(A)" for t in _COMPARABLE],
    "isSorted": [f"list({t}).() -> bool" for t in _COMPARABLE],
    "sum": ["list(int).() -> int", "list(uint).() -> uint", "list(double).() -> double"],
    "min": [f"list({t}).() -> {t}" for t in _COMPARABLE],
    "max": [f"list({t}).() -> {t}" for t in _COMPARABLE],
    "sets.contains": ["(list(A), list(A)) -> bool"],
    "sets.equivalent": ["(list(A), list(A)) -> bool"],
    "sets.intersects": ["(list(A), list(A)) -> bool"],
    # quantity
    "quantity": ["(string) -> " + Q],
    "isQuantity": ["(string) -> bool"],
    "compareTo": [f"{Q}.({Q}) -> int", f"{S}.({S}) -> int"],
    "isGreaterThan": [f"{Q}.({Q}) -> bool", f"{S}.({S}) -> bool"],
    "isLessThan": [f"{Q}.({Q}) -> bool", f"{S}.({S}) -> bool"],
    "add": [f"{Q}.({Q}) -> {Q}", f"{Q}.(int) -> {Q}"],
    "sub": [f"{Q}.({Q}) -> {Q}", f"{Q}.(int) -> {Q}"],
    "sign": [f"({Q}) -> int"],
    "isInteger": [f"{Q}.() -> bool"],
    "asInteger": [f"{Q}.() -> int"],
    "asApproximateFloat": [f"{Q}.() -> double"],
    # optional types
    "optional.of": ["(A) -> optional_type(A)"],
    "optional.none": ["() -> optional_type(_)"],
    "optional.ofNonZeroValue": ["(A) -> optional_type(A)"],
    "hasValue": ["optional_type(A).() -> bool"],
    "value": ["optional_type(A).() -> A"],
    "orValue": ["optional_type(A).(A) -> A"],
    "or": ["optional_type(A).(optional_type(A)) -> optional_type(A)"],
    "first": ["list(A).() -> optional_type(A)"],
    "last": ["list(A).() -> optional_type(A)"],
    # semver
    "semver": ["(string) -> " + S, "(string, bool) -> " + S],
    "isSemver": ["(string) -> bool", "(string, bool) -> bool"],
    "major": [f"{S}.() -> int"],
    "minor": [f"{S}.() -> int"],
    "patch": [f"{S}.() -> int"],
}  # fmt: skip
for _op in ("_<=_", "_>_", "_>=_"):
    _TEXT[_op] = _TEXT["_<_"]

SIGNATURES: dict[str, list[Signature]] = {
    name: [parse_signature(t) for t in texts] for name, texts in _TEXT.items()
}
