"""Random DRA selectors and devices for the differential test (hypothesis strategies).

Selectors are built from a small typed grammar: an expression of a wanted type is a literal, a
device lookup, or an operator / function of that type applied to sub-expressions of the types it
takes. With a small probability a sub-expression of another type is put in instead, so that
ill-typed selectors (compile errors, runtime no-such-overload) are exercised as well as
well-typed ones. Devices have attributes of every type (or none), capacities, unicode, extremes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from hypothesis import strategies as st

from tests.unit.cel.reference import TestDevice

DRIVER = "gpu.dra.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
NAMES = ["numaNode", "index", "productName", "migEnabled", "cudaComputeCapability", "label", "x"]
CAPACITIES = ["memory", "cores", "x"]
TYPES = [
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "quantity",
    "semver",
    "dyn",
    "duration",
    "timestamp",
    "ip",
    "cidr",
    "url",
]
INT64 = 2**63
DURATIONS = ["0", "1s", "1h30m", "-1.5s", "300ms", "1us", "2562047h", "1.s", ".5h", "1d", "",
             "9223372036854775807ns", "1h1h", "-0", "90m"]  # fmt: skip
TIMESTAMPS = [
    "2024-01-01T00:00:00Z",
    "1970-01-01T00:00:00.5+01:00",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "2024-02-29T12:00:00-08:00",
    "2023-02-29T00:00:00Z",
    "2024-01-01t00:00:00z",
    "2024-01-01T00:00:00,123456789123Z",
    "2024-01-01T00:00:00+24:00",
]
IPS = ["10.0.0.1", "::1", "fe80::1", "192.168.0.256", "01.2.3.4", "::ffff:1.2.3.4", "2001:DB8::1",
       "224.0.0.1", "ff02::1", "0.0.0.0", "169.254.1.1", "fe80::1%eth0", "", "1.2.3",
       "255.255.255.255", "::"]  # fmt: skip
CIDRS = ["10.0.0.0/8", "10.1.2.3/8", "::/0", "2001:db8::/32", "1.2.3.4/33", "1.2.3.4/08",
         "1.2.3.4", "::ffff:1.2.3.0/120", "0.0.0.0/0", "fe80::%eth0/64", "10.1.0.0/16"]  # fmt: skip
URLS = ["https://example.com/a?b=c&b=d", "http://[::1]:8080/x", "/rel/path", "mailto:a@b",
        "example.com", "http://a b/", "http://a:80x/", "HTTP://Host/%41?q=%zz", "", "*",
        "http://u:p@h/p#f", "ftp://h/p%2Fq", "http://[zz]/", "http://h/a b?x=1;y=2"]  # fmt: skip
FORMATS = ["dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName",
           "dns1123LabelPrefix", "dns1123SubdomainPrefix", "dns1035LabelPrefix", "labelValue",
           "uri", "uuid", "byte", "date", "datetime"]  # fmt: skip
ZONES = ["UTC", "+05:30", "-02:00", "America/New_York", "Europe/Berlin", "x:y", "Nowhere/X", ""]
TEXTS = [*IPS, *CIDRS, *URLS, *TIMESTAMPS, "my-name", "My_Name", "a.b", "example.com/x",
         "6a1f3c2e-0000-1111-2222-333344445555", "aGVsbG8=", "2024-02-29", "abc-"]  # fmt: skip
QUANTITIES = [
    "0",
    "1",
    "500m",
    "1.5",
    "1.5Gi",
    "40Gi",
    "80Gi",
    "1k",
    "1Ki",
    "1e3",
    "1E3",
    "100Ei",
    "9223372036854775807",
    "-5Gi",
    "1n",
    "0.1",
    "999999999999",
    "12345678901234567890",
]
VERSIONS = [
    "0.0.0",
    "1.0.0",
    "8.0.0",
    "9.0.0",
    "10.2.3",
    "1.2.3-alpha.1",
    "1.2.3-rc.1+b5",
    "1.2.3+build",
    "1.10.0",
    "2.0.0-0",
]
PATTERNS = [
    "^NVIDIA",
    "H100",
    "[0-9]+",
    "^$",
    "(?i)hopper",
    "a|b",
    "^\\\\w+$",
    "\\\\d",
    "é",
    ".*",
    "^.{3,5}$",
    "[[:alpha:]]",
    "\\\\s",
    "x$",
    "^(a+)+$",
    "[^a-z]",
]

#: Go's unicode.IsSpace (what trim() strips) and characters next to it that it does not strip
#: (U+001C-U+001F are white space to Python's str.strip()).
SPACES = "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_SPACES = "\x1c\x1d\x1e\x1f\x00\u180e\u200b\u2060\ufeff"
#: Steps that build a longer string from the previous one (the runtime cost grows with it).
GROWTH = [
    "{v} + {v}",
    "[{v}, {v}].join('')",
    "[{v}, 'x', {v}].join('-')",
    "{v} + {v}.substring(1)",
    "{v}.upperAscii() + {v}.lowerAscii()",
    "{v}.split('-').join('xx')",
    "({v} + {v}).trim()",
    "strings.quote({v}) + {v}",
]
#: What reads the last value of a chain.
GROWTH_FINAL = [
    "{v}.size() > {n}",
    "{v}.contains('y')",
    "{v}.contains({v}.substring({n}))",
    "{v}.matches('^[^y]*$')",
    "{v} == {v} + ''",
    "{v} < {v}.substring(1)",
    "{v}.startsWith({v}.substring({n}))",
    "{v}.lowerAscii().indexOf('y') < 0",
    "{v}.replace('x', '').size() >= 0",
    "{v}.find('y+') == ''",
    "{v}.trim() != ''",
]

Draw = Callable[..., object]

texts = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8),
    # White space by Go's definition and its neighbours, around other text.
    st.text(alphabet=st.sampled_from([*SPACES, *NOT_SPACES, "x", "é"]), max_size=6),
)
ints = st.one_of(
    st.integers(-3, 10),
    st.sampled_from([INT64 - 1, -INT64, 2**31, 2**32, -(2**31)]),
    st.integers(-INT64, INT64 - 1),
)


def _string_literal(value: str) -> str:
    # JSON escapes are valid CEL escapes for the characters JSON escapes.
    return json.dumps(value, ensure_ascii=False)


def _literal(draw: Draw, kind: str) -> str:
    if kind == "bool":
        return str(draw(st.booleans())).lower()
    if kind == "int":
        return str(draw(ints))
    if kind == "uint":
        return f"{draw(st.one_of(st.integers(0, 10), st.integers(0, 2**64 - 1)))}u"
    if kind == "double":
        value = draw(
            st.one_of(
                st.sampled_from([0.0, 0.5, 1.0, -2.5, 1e10, 1e300, 3.14]),
                st.floats(allow_nan=False, allow_infinity=False),
            )
        )
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    if kind == "string":
        return _string_literal(
            draw(st.one_of(texts, st.sampled_from(["Hopper", "H100", "", "a", "NVIDIA"])))
        )
    if kind == "bytes":
        return "b" + _string_literal(draw(st.sampled_from(["", "a", "abc"])))
    if kind == "list":
        inner = draw(st.sampled_from(["int", "string", "bool"]))
        # Known gap: the scheduler infers an empty literal's element type from its use
        # ([].filter(x, x == b"a") is a list(bytes)); the engine does not, so no empty lists.
        return "[" + ", ".join(_literal(draw, inner) for _ in range(draw(st.integers(1, 3)))) + "]"
    if kind == "map":
        n = draw(st.integers(0, 2))
        return (
            "{"
            + ", ".join(f"{_literal(draw, 'string')}: {_literal(draw, 'int')}" for _ in range(n))
            + "}"
        )
    if kind == "quantity":
        return f'quantity("{draw(st.sampled_from(QUANTITIES))}")'
    if kind == "semver":
        return f'semver("{draw(st.sampled_from(VERSIONS))}")'
    if kind == "duration":
        return f"duration({_string_literal(draw(st.sampled_from(DURATIONS)))})"
    if kind == "timestamp":
        if draw(st.booleans()):
            return f"timestamp({draw(st.sampled_from([0, 1, -1, 1704067200, 253402300799]))})"
        return f"timestamp({_string_literal(draw(st.sampled_from(TIMESTAMPS)))})"
    if kind in ("ip", "cidr", "url"):
        values = {"ip": IPS, "cidr": CIDRS, "url": URLS}[kind]
        return f"{kind}({_string_literal(draw(st.sampled_from(values)))})"
    return (
        "null"
        if draw(st.booleans())
        else f"dyn({_literal(draw, draw(st.sampled_from(['int', 'string', 'bool'])))})"
    )


def _root(draw: Draw, text: str) -> str:
    # Sometimes the variable by its absolute name: ".device" (CEL's root scope).
    return "." + text if draw(st.integers(0, 7)) == 0 else text


def _attrs(draw: Draw) -> str:
    return _root(draw, A)


def _device_ref(draw: Draw, kind: str) -> str | None:
    name = draw(st.sampled_from(NAMES))
    if kind == "quantity":
        return f"{_root(draw, C)}.{draw(st.sampled_from(CAPACITIES))}"
    if kind == "string" and draw(st.booleans()):
        return _root(draw, "device.driver")
    if kind == "bool" and draw(st.integers(0, 3)) == 0:
        return _root(draw, "device.allowMultipleAllocations")
    if kind in ("dyn", "int", "string", "bool", "semver"):
        return f"{_attrs(draw)}.{name}"
    return None


def expr(draw: Draw, kind: str, depth: int) -> str:
    """An expression meant to have type ``kind`` (sometimes deliberately of another)."""
    if draw(st.integers(0, 19)) == 0:
        kind = draw(st.sampled_from(TYPES))  # ill-typed on purpose
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        ref = _device_ref(draw, kind) if draw(st.booleans()) else None
        return ref or _literal(draw, kind)
    options = _COMPOSITES.get(kind, [])
    if not options:
        return _literal(draw, kind)
    return draw(st.sampled_from(options))(draw, depth - 1)


def _e(kind: str) -> Callable[[Draw, int], str]:
    return lambda draw, depth: expr(draw, kind, depth)


def _bool_ops(draw: Draw, d: int) -> str:
    op = draw(st.sampled_from(["&&", "||"]))
    return f"({expr(draw, 'bool', d)} {op} {expr(draw, 'bool', d)})"


def _compare(draw: Draw, d: int) -> str:
    kind = draw(
        st.sampled_from(["int", "uint", "double", "string", "bool", "dyn", "bytes", "list"])
    )
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
    return f"{expr(draw, kind, d)} {op} {expr(draw, kind, d)}"


def _string_pred(draw: Draw, d: int) -> str:
    fn = draw(st.sampled_from(["contains", "startsWith", "endsWith"]))
    return f"{expr(draw, 'string', d)}.{fn}({expr(draw, 'string', d)})"


def _matches(draw: Draw, d: int) -> str:
    return f'{expr(draw, "string", d)}.matches("{draw(st.sampled_from(PATTERNS))}")'


def _quantity_pred(draw: Draw, d: int) -> str:
    fn = draw(st.sampled_from(["isGreaterThan", "isLessThan", "isInteger"]))
    arg = "" if fn == "isInteger" else expr(draw, "quantity", d)
    return f"{expr(draw, 'quantity', d)}.{fn}({arg})"


def _semver_pred(draw: Draw, d: int) -> str:
    fn = draw(st.sampled_from(["isGreaterThan", "isLessThan"]))
    return f"{expr(draw, 'semver', d)}.{fn}({expr(draw, 'semver', d)})"


def _has(draw: Draw, d: int) -> str:
    return f"has({_attrs(draw)}.{draw(st.sampled_from(NAMES))})"


def _in(draw: Draw, d: int) -> str:
    if draw(st.booleans()):
        return f"{_string_literal(draw(st.sampled_from(NAMES)))} in {_attrs(draw)}"
    return f"{expr(draw, 'int', d)} in {expr(draw, 'list', d)}"


def _attribute_list(draw: Draw, d: int) -> str:
    # Attributes that may be lists (DRAListTypeAttributes) or scalars, used as lists.
    attr = f"{_attrs(draw)}.{draw(st.sampled_from(NAMES))}"
    value = expr(draw, draw(st.sampled_from(["int", "string", "bool", "semver", "dyn"])), d)
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return f"{attr}.includes({value})"
    if choice == 1:
        return f"{value} in {attr}"
    if choice == 2:
        return f"{attr}.exists(x, x == {value})"
    if choice == 3:
        return f"size({attr}) > {draw(st.integers(0, 2))}"
    return f"{attr}[{draw(st.integers(-1, 3))}] == {value}"


def _macro_bool(draw: Draw, d: int) -> str:
    fn = draw(st.sampled_from(["all", "exists", "exists_one"]))
    # Rarely the loop variable with a leading dot: not in the root scope, a compile error.
    x = ".x" if draw(st.integers(0, 15)) == 0 else "x"
    if draw(st.booleans()):
        return f"{_attrs(draw)}.{fn}(k, {_attrs(draw)}[k] == {expr(draw, 'dyn', d)})"
    return f"{expr(draw, 'list', d)}.{fn}(x, {x} == {expr(draw, 'int', d)})"


def _optional(draw: Draw, d: int) -> str:
    name = _string_literal(draw(st.sampled_from(NAMES)))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return f"{A}.?{draw(st.sampled_from(NAMES))}.hasValue()"
    if choice == 1:
        return f"{A}[?{name}].orValue({expr(draw, 'dyn', d)}) == {expr(draw, 'dyn', d)}"
    if choice == 2:
        return f"[?{A}.?{draw(st.sampled_from(NAMES))}, ?optional.none()].size() == {expr(draw, 'int', d)}"
    return (
        f"{A}.?{draw(st.sampled_from(NAMES))}.optMap(x, x == {expr(draw, 'dyn', d)}).orValue(false)"
    )


def _is_fn(draw: Draw, d: int) -> str:
    fn = draw(st.sampled_from(["isQuantity", "isSemver"]))
    return f"{_root(draw, fn)}({expr(draw, 'string', d)})"


def _arith(kind: str) -> Callable[[Draw, int], str]:
    def build(draw: Draw, d: int) -> str:
        op = draw(st.sampled_from(["+", "-", "*", "/", "%"]))
        return f"({expr(draw, kind, d)} {op} {expr(draw, kind, d)})"

    return build


def _int_fns(draw: Draw, d: int) -> str:
    choice = draw(st.integers(0, 7))
    if choice == 0:
        return f"{_root(draw, 'size')}({expr(draw, 'string', d)})"
    if choice == 1:
        return f"{expr(draw, 'list', d)}.size()"
    if choice == 2:
        return f"{expr(draw, 'string', d)}.indexOf({expr(draw, 'string', d)})"
    if choice == 3:
        return f"{expr(draw, 'quantity', d)}.compareTo({expr(draw, 'quantity', d)})"
    if choice == 4:
        return f"{expr(draw, 'semver', d)}.{draw(st.sampled_from(['major', 'minor', 'patch']))}()"
    if choice == 5:
        return f"{expr(draw, 'quantity', d)}.asInteger()"
    if choice == 6:
        return f"int({expr(draw, draw(st.sampled_from(['double', 'string', 'uint'])), d)})"
    return f"-{expr(draw, 'int', d)}"


def _string_fns(draw: Draw, d: int) -> str:
    choice = draw(st.integers(0, 7))
    s = expr(draw, "string", d)
    if choice == 7:
        return f"{s}.trim()"
    if choice == 0:
        return f"{s}.lowerAscii()"
    if choice == 1:
        return f"{s}.substring({expr(draw, 'int', d)})"
    if choice == 2:
        return f"{s}.replace({expr(draw, 'string', d)}, {expr(draw, 'string', d)})"
    if choice == 3:
        return f"({s} + {expr(draw, 'string', d)})"
    if choice == 4:
        return f"string({expr(draw, draw(st.sampled_from(['int', 'uint', 'bool', 'string'])), d)})"
    if choice == 5:
        return f"{s}.charAt({expr(draw, 'int', d)})"
    return f"{s}.split({expr(draw, 'string', d)}).join({_string_literal('-')})"


def _list_fns(draw: Draw, d: int) -> str:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return f"{expr(draw, 'string', d)}.split({_string_literal(' ')})"
    if choice == 1:
        return f"{expr(draw, 'list', d)}.map(x, x)"
    if choice == 2:
        return f"{_root(draw, 'lists.range')}({draw(st.integers(0, 5))})"
    return f"{expr(draw, 'list', d)}.filter(x, x == {expr(draw, 'int', d)})"


def _text(draw: Draw, d: int) -> str:
    # Strings the network, URL and format functions have something to say about.
    if draw(st.booleans()):
        return _string_literal(draw(st.sampled_from(TEXTS)))
    return expr(draw, "string", d)


def _time_compare(draw: Draw, d: int) -> str:
    kind = draw(st.sampled_from(["duration", "timestamp"]))
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
    return f"{expr(draw, kind, d)} {op} {expr(draw, kind, d)}"


def _network_pred(draw: Draw, d: int) -> str:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        test = draw(
            st.sampled_from(
                ["isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast",
                 "isGlobalUnicast"]
            )
        )  # fmt: skip
        return f"{expr(draw, 'ip', d)}.{test}()"
    if choice == 1:
        other = expr(draw, "ip", d) if draw(st.booleans()) else _text(draw, d)
        return f"{expr(draw, 'cidr', d)}.containsIP({other})"
    if choice == 2:
        other = expr(draw, "cidr", d) if draw(st.booleans()) else _text(draw, d)
        return f"{expr(draw, 'cidr', d)}.containsCIDR({other})"
    fn = draw(st.sampled_from(["isIP", "isCIDR", "isURL", "ip.isCanonical"]))
    return f"{fn}({_text(draw, d)})"


def _format_pred(draw: Draw, d: int) -> str:
    if draw(st.integers(0, 3)) == 0:
        return f"format.named({_string_literal(draw(st.sampled_from([*FORMATS, 'x'])))}).hasValue()"
    return f"format.{draw(st.sampled_from(FORMATS))}().validate({_text(draw, d)}).hasValue()"


def _time_int(draw: Draw, d: int) -> str:
    if draw(st.booleans()):
        getter = draw(st.sampled_from(["getHours", "getMinutes", "getSeconds", "getMilliseconds"]))
        return f"{expr(draw, 'duration', d)}.{getter}()"
    getter = draw(
        st.sampled_from(
            ["getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek",
             "getDayOfYear", "getHours", "getMinutes", "getSeconds", "getMilliseconds"]
        )
    )  # fmt: skip
    zone = _string_literal(draw(st.sampled_from(ZONES))) if draw(st.booleans()) else ""
    return f"{expr(draw, 'timestamp', d)}.{getter}({zone})"


def _library_string(draw: Draw, d: int) -> str:
    choice = draw(st.integers(0, 2))
    if choice == 0:
        kind = draw(st.sampled_from(["duration", "timestamp", "ip", "cidr"]))
        return f"string({expr(draw, kind, d)})"
    if choice == 1:
        part = draw(
            st.sampled_from(["getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"])
        )
        return f"{expr(draw, 'url', d)}.{part}()"
    verb = draw(st.sampled_from(["%s", "%e", "%f", "%d", "%.2f"]))
    kind = draw(st.sampled_from(["double", "duration", "timestamp", "string", "list", "int"]))
    return f"{_string_literal(verb)}.format([{expr(draw, kind, d)}])"


_MESSAGES = {
    "Int64Value": "value",
    "Int32Value": "value",
    "UInt32Value": "value",
    "DoubleValue": "value",
    "FloatValue": "value",
    "StringValue": "value",
    "BoolValue": "value",
    "BytesValue": "value",
    "Duration": "seconds",
    "Timestamp": "nanos",
    "Struct": "fields",
    "ListValue": "values",
    "Value": "number_value",
    "Any": "type_url",
}


def _message(draw: Draw, d: int) -> str:
    # A well-known message whose field gets a value of any type (often the wrong one).
    name = draw(st.sampled_from(sorted(_MESSAGES)))
    value = expr(draw, draw(st.sampled_from(TYPES)), d)
    if draw(st.booleans()):
        value = f"dyn({value})"
    return f"google.protobuf.{name}{{{_MESSAGES[name]}: {value}}}"


def _growth(draw: Draw, d: int) -> str:
    """A string built step by step with cel.bind (each step about doubling it), then read:
    the cost of each step grows with the string, and the scheduler stops at its limit."""
    # Chance tests compare with a middle value: hypothesis draws the ends of a range more
    # often. One in three of these selectors (some 1.5% of all) is built; of those, one in
    # five long enough to reach the cost limit (a few million characters at most).
    if draw(st.integers(0, 2)) != 1:
        return _compare(draw, d)
    long = draw(st.integers(0, 4)) == 2
    depth = draw(st.integers(14, 22)) if long else draw(st.integers(1, 8))
    choice = draw(st.integers(0, 2))
    if choice == 0:
        init = _string_literal("x" * draw(st.integers(0, 80)))
    else:
        # Typed string: the scheduler charges "+" by size only when it knows the overload
        # while compiling (dyn + dyn costs 1, and a deep chain of those would not stop).
        value = expr(draw, "string", d) if choice == 1 else _device_ref(draw, "string")
        init = f"string({value or 'device.driver'})"
    step = draw(st.sampled_from(GROWTH))
    final = draw(st.sampled_from(GROWTH_FINAL)).replace("{n}", str(draw(st.integers(0, 3))))
    names = [f"v{i}" for i in range(depth + 1)]
    body = final.format(v=names[-1])
    for i in range(depth, 0, -1):
        body = f"cel.bind({names[i]}, {step.format(v=names[i - 1])}, {body})"
    return f"cel.bind(v0, {init}, {body})"


def _ternary(kind: str) -> Callable[[Draw, int], str]:
    return lambda draw, d: (
        f"({expr(draw, 'bool', d)} ? {expr(draw, kind, d)} : {expr(draw, kind, d)})"
    )


def _not(draw: Draw, d: int) -> str:
    return f"!{expr(draw, 'bool', d)}"


_COMPOSITES: dict[str, list[Callable[[Draw, int], str]]] = {
    "bool": [
        _bool_ops,
        _compare,
        _compare,
        _string_pred,
        _matches,
        _quantity_pred,
        _semver_pred,
        _has,
        _in,
        _attribute_list,
        _macro_bool,
        _is_fn,
        _not,
        _optional,
        _ternary("bool"),
        _time_compare,
        _network_pred,
        _format_pred,
        _growth,
    ],
    "int": [_arith("int"), _int_fns, _int_fns, _ternary("int"), _time_int],
    "uint": [_arith("uint")],
    "double": [_arith("double")],
    "string": [_string_fns, _string_fns, _ternary("string"), _library_string],
    "duration": [
        lambda draw, d: f"({expr(draw, 'duration', d)} + {expr(draw, 'duration', d)})",
        lambda draw, d: f"({expr(draw, 'timestamp', d)} - {expr(draw, 'timestamp', d)})",
        lambda draw, d: f"duration({_text(draw, d)})",
    ],
    "timestamp": [
        lambda draw, d: f"({expr(draw, 'timestamp', d)} + {expr(draw, 'duration', d)})",
        lambda draw, d: f"({expr(draw, 'timestamp', d)} - {expr(draw, 'duration', d)})",
        lambda draw, d: f"timestamp({expr(draw, 'int', d)})",
    ],
    "ip": [
        lambda draw, d: f"{expr(draw, 'cidr', d)}.ip()",
        lambda draw, d: f"ip({_text(draw, d)})",
    ],
    "cidr": [
        lambda draw, d: f"{expr(draw, 'cidr', d)}.masked()",
        lambda draw, d: f"cidr({_text(draw, d)})",
    ],
    "url": [lambda draw, d: f"url({_text(draw, d)})"],
    "list": [_list_fns],
    "quantity": [
        lambda draw, d: (
            f"{expr(draw, 'quantity', d)}.{draw(st.sampled_from(['add', 'sub']))}({expr(draw, draw(st.sampled_from(['quantity', 'int'])), d)})"
        )
    ],
    "semver": [lambda draw, d: f"semver({expr(draw, 'string', d)})"],
    "dyn": [lambda draw, d: f"{A}[{_string_literal(draw(st.sampled_from(NAMES)))}]", _message],
}


#: Past the API's 10,240 characters (API validation, not the scheduler's CEL) and, rarely,
#: past the parser's 100,000 code points.
LONG = [10_241, 12_000, 99_990, 100_001]


def _long(draw: Draw, selector: str) -> str:
    size = draw(st.sampled_from(LONG)) - len(selector)
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return selector + " " * size
    if choice == 1:
        return f"{selector} // " + "x" * size
    if choice == 2:
        return f"'{'é' * size}' != '' && ({selector})"
    return f"({selector})" + " && true" * (min(size, 12_000) // 8)


@st.composite
def selectors(draw: Draw) -> str:
    """One selector, usually of type bool; a few in a thousand longer than the API allows."""
    selector = expr(draw, "bool", draw(st.integers(1, 4)))
    if draw(st.integers(0, 299)) == 150:
        return _long(draw, selector)
    return selector


def _attribute(draw: Draw) -> dict[str, object]:
    # One in three is a list-type attribute (DRAListTypeAttributes): a non-empty list.
    kind = draw(st.sampled_from(["int", "bool", "string", "version"] * 2 + ["list"] * 4))
    if kind == "list":
        kind = draw(st.sampled_from(["int", "bool", "string", "version"]))
        values = draw(st.lists(_value(kind), min_size=1, max_size=3))
        return {kind + "s": values}
    return {kind: draw(_value(kind))}


def _value(kind: str) -> st.SearchStrategy[object]:
    if kind == "int":
        return ints
    if kind == "bool":
        return st.booleans()
    if kind == "string":
        return st.one_of(
            texts, st.sampled_from(["NVIDIA H100", "Hopper", "a\n", " x ", "\x1cx\u3000"])
        )
    return st.sampled_from(VERSIONS)


@st.composite
def devices(draw: Draw) -> TestDevice:
    """A device of ``gpu.dra.dev`` (or, rarely, another driver) with random attributes."""
    names = draw(st.lists(st.sampled_from([*NAMES, "example.com/rack"]), unique=True, max_size=6))
    capacity = draw(st.lists(st.sampled_from(CAPACITIES), unique=True, max_size=3))
    device: dict[str, object] = {
        "name": "dev",
        "attributes": {n: _attribute(draw) for n in names},
        "capacity": {n: {"value": draw(st.sampled_from(QUANTITIES))} for n in capacity},
    }
    if draw(st.booleans()):
        device["allowMultipleAllocations"] = draw(st.booleans())
    driver = draw(st.sampled_from([DRIVER, DRIVER, DRIVER, "other.dev"]))
    return TestDevice(driver, device)
