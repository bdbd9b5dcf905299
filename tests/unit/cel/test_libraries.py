"""The scheduler's non-DRA CEL libraries, as plain tables (no reference binary needed).

The differential suite compares these against the scheduler itself; these tables pin the
parsing rules that decide the verdicts, so a regression names the rule it broke.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dra_driver.cel import CompileError, Verdict, compile_selector, evaluate
from dra_driver.cel.errors import EvalError
from dra_driver.cel.lib_format import FORMATS
from dra_driver.cel.lib_net import parse_cidr, parse_ip
from dra_driver.cel.lib_strings import GO_SPACES, format_string, go_quote, trim
from dra_driver.cel.lib_time import civil, parse_duration, parse_timestamp
from dra_driver.cel.lib_url import URLError, parse_url


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("0", 0),
        ("-0", 0),
        ("1h30m", 5_400_000_000_000),
        ("1.5s", 1_500_000_000),
        (".5s", 500_000_000),
        ("1.s", 1_000_000_000),
        ("-1ms", -1_000_000),
        ("1us", 1_000),
        ("1\u00b5s", 1_000),
        ("1\u03bcs", 1_000),
        ("1h1h", 7_200_000_000_000),
        ("+5m", 300_000_000_000),
        ("9223372036854775807ns", 2**63 - 1),
        ("-9223372036854775808ns", -(2**63)),
    ],
)
def test_go_durations(text: str, nanos: int) -> None:
    assert parse_duration(text) == nanos


@pytest.mark.parametrize(
    "text", ["", "1", "1H", " 1s", "1d", ".s", "9223372036854775808ns", "2562048h", "1s "]
)
def test_invalid_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
        ("2024-01-01T00:00:00.100Z", "2024-01-01T00:00:00.1Z"),
        ("2024-01-01T00:00:00.5+01:00", "2024-01-01T00:00:00.5+01:00"),
        ("2024-01-01T00:00:00,5Z", "2024-01-01T00:00:00.5Z"),
        ("2024-01-01T00:00:00.1234567891Z", "2024-01-01T00:00:00.123456789Z"),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
    ],
)
def test_timestamps_print_in_their_offset(text: str, printed: str) -> None:
    assert str(parse_timestamp(text)) == printed


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-01",
        "2024-01-01t00:00:00Z",
        "2024-01-01T00:00:00z",
        "2024-02-30T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T23:59:60Z",
        "2024-01-01T00:00:00+25:00",
        "2024-01-01T00:00:00+0100",
        "0001-01-01T00:00:00+01:00",
        "10000-01-01T00:00:00Z",
    ],
)
def test_invalid_timestamps(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("2001:DB8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
        ("::1.2.3.4", "::102:304"),
    ],
)
def test_addresses(text: str, canonical: str) -> None:
    assert str(parse_ip(text)) == canonical


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("01.2.3.4", "parse error"),
        ("fe80::1%eth0", "with zone value is not allowed"),
        ("::ffff:1.2.3.4", "IPv4-mapped IPv6 address"),
        ("1.2.3", "parse error"),
        ("bad", "unable to parse IP"),
    ],
)
def test_refused_addresses(text: str, reason: str) -> None:
    with pytest.raises(EvalError, match=reason):
        parse_ip(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("1.2.3.0/08", "bad bits"), ("1.2.3.0/33", "out of range"), ("1.2.3.0", "no '/'")],
)
def test_refused_prefixes(text: str, reason: str) -> None:
    with pytest.raises(EvalError, match=reason):
        parse_cidr(text)


def test_prefixes_keep_their_host_bits() -> None:
    assert str(parse_cidr("10.1.2.3/8")) == "10.1.2.3/8"


@pytest.mark.parametrize(
    ("selector", "verdict"),
    [
        ("ip('10.0.0.1').isGlobalUnicast()", True),  # Go counts private addresses
        ("ip('255.255.255.255').isGlobalUnicast()", False),
        ("ip('ff12::1').isLinkLocalMulticast()", True),
        ("cidr('::/0').containsIP('1.2.3.4')", False),
        ("cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')", True),
        ("cidr('10.0.0.0/16').containsCIDR('10.0.0.0/8')", False),
        ("duration('1h') == duration('60m')", True),
        ("timestamp('2024-01-01T00:00:00+01:00').getHours() == 23", True),
        ("timestamp('2024-03-05T10:20:30Z').getHours('-02:30') == 7", True),
        ("timestamp('2024-03-05T10:20:30Z').getHours('America/Los_Angeles') == 2", True),
        ("duration('-90m').getHours() == -1", True),
        ("url('HTTP://a/') == url('http://a/')", True),
        ("url('http://a/#x') == url('http://a/#y')", False),
        ("google.protobuf.Int64Value{value: 1} == 1", True),
        ("google.protobuf.FloatValue{value: 1.1} == 1.1", False),
        ("google.protobuf.Value{} == null", True),
    ],
)
def test_verdicts(selector: str, verdict: bool) -> None:
    assert evaluate(compile_selector(selector), {}).verdict == (
        Verdict.MATCH if verdict else Verdict.NO_MATCH
    )


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("duration('1d') > duration('1s')", "invalid duration argument"),
        ("timestamp('2024-02-30T00:00:00Z') > timestamp(1)", "invalid timestamp argument"),
        ("'%d'.format(['a']) == ''", "decimal clause can only be used on integers"),
        ("'%s'.format([[ip('1.2.3.4')]]) == ''", "was given net.IP"),
        ("google.protobuf.Int64Value{value: 'a'} == 1", "expected type of field 'value'"),
    ],
)
def test_compile_errors(selector: str, message: str) -> None:
    with pytest.raises(CompileError, match=message):
        compile_selector(selector)


@pytest.mark.parametrize(
    ("text", "host", "port", "query"),
    [
        ("https://example.com:8080/a?b=c&b=d", "example.com:8080", "8080", "b=c&b=d"),
        ("http://[::1]:80/x", "[::1]:80", "80", ""),
        ("/rel?x=1#z", "", "", "x=1"),
    ],
)
def test_urls(text: str, host: str, port: str, query: str) -> None:
    parsed = parse_url(text)
    assert (parsed.host, parsed.raw_query) == (host, query)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "example.com",
        "http://a b/",
        "http://a:80x/",
        "http://[zz]/",
        "http://x[::1]/",
        "http://a/%zz",
        ":foo",
    ],
)
def test_refused_urls(text: str) -> None:
    with pytest.raises(URLError):
        parse_url(text)


@pytest.mark.parametrize(
    ("name", "value", "valid"),
    [
        ("dns1123Label", "my-name", True),
        ("dns1123Label", "a.b", False),
        ("dns1123Label", "a" * 64, False),
        ("dns1123LabelPrefix", "abc-", True),
        ("dns1035Label", "1abc", False),
        ("qualifiedName", "example.com/My_Name", True),
        ("qualifiedName", "/x", False),
        ("labelValue", "", True),
        ("uuid", "6A1F3C2E000011112222333344445555", True),
        ("byte", "aGVsbG8", False),
        ("date", "2023-02-29", False),
        ("datetime", "2024-01-01t10:00:00.5+01:00", True),
        ("datetime", "2024-01-01T10:00:00", False),
        ("uri", "http://a/", True),
    ],
)
def test_named_formats(name: str, value: str, valid: bool) -> None:
    assert (FORMATS[name].validator(value) == []) == valid


@pytest.mark.parametrize(
    ("text", "args", "out"),
    [
        ("%e", [1234.5], "1.234500\u00d710\u2070\u00b3"),
        ("%e", [-0.000123], "-1.230000\u00d710\u207b\u2070\u2074"),
        ("%.2e", [1234.5], "1.234500\u00d710\u2070\u00b3"),  # the precision is ignored
        ("%e", ["NaN"], "   NaN"),
        ("%f", [float("inf")], "\u221e"),
        ("%s", [[1.0, "a", b"x", None]], '[1.000000, "a", b"x", null]'),
        ("%s", [{"b": 1, "a": 2}], '{"a":2, "b":1}'),
    ],
)
def test_string_format(text: str, args: list[Any], out: str) -> None:
    assert format_string(text, args) == out


def test_go_quote() -> None:
    assert go_quote('a"b\\c\n\x01\u200b') == '"a\\"b\\\\c\\n\\x01\\u200b"'


@settings(max_examples=2000, deadline=None)
@given(st.integers(-62_135_596_800, 253_402_300_799), st.integers(-14 * 3600, 14 * 3600))
def test_civil_fields_agree_with_datetime(seconds: int, offset: int) -> None:
    # datetime covers the years 1-9999 only; civil() also reads the years 0 and 10000.
    assume(-62_135_596_800 <= seconds + offset <= 253_402_300_799)
    local = datetime(1970, 1, 1) + timedelta(seconds=seconds + offset)
    fields = civil(seconds * 1_000_000_000, offset)
    assert (fields.year, fields.month, fields.day, fields.hour, fields.minute, fields.second) == (
        local.year,
        local.month,
        local.day,
        local.hour,
        local.minute,
        local.second,
    )
    assert fields.day_of_year == local.timetuple().tm_yday - 1
    assert fields.day_of_week == (local.weekday() + 1) % 7


@pytest.mark.parametrize("char", list(GO_SPACES))
def test_trim_strips_go_white_space(char: str) -> None:
    assert trim(f"{char}x{char}") == "x"


@pytest.mark.parametrize("char", ["\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\u200b", "\ufeff"])
def test_trim_keeps_what_go_does_not_call_white_space(char: str) -> None:
    # U+001C-U+001F are white space to Python's str.strip(), not to Go's unicode.IsSpace.
    assert trim(f" {char}x{char} ") == f"{char}x{char}"
