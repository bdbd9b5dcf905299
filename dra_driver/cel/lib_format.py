"""The Kubernetes ``format`` CEL library: named string formats and their validation.

``format.dns1123Label().validate(s)`` is ``optional.none()`` when ``s`` is valid, else an
optional list of the reasons; ``format.named("uuid")`` finds a format by name (none when
there is no such format). The rules and messages are Kubernetes' own name validation and the
OpenAPI formats the API server accepts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import optional
from dra_driver.cel.errors import NoSuchOverload
from dra_driver.cel.lib_time import parse_date
from dra_driver.cel.lib_url import URLError, check_request_uri

Function = Callable[..., Any]
Validator = Callable[[str], list[str]]


@dataclass(frozen=True)
class NamedFormat:
    """A CEL ``kubernetes.NamedFormat``."""

    name: str
    validator: Validator = field(compare=False)
    cel_type_name = "kubernetes.NamedFormat"


_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = _LABEL + r"(\." + _LABEL + ")*"
_DNS1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_KEY = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(_SUBDOMAIN)
_DNS1035_RE = re.compile(_DNS1035)
_KEY_RE = re.compile(_KEY)
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
_BASE64 = re.compile(
    r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
)
_CLOCK = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _too_long(value: str, limit: int) -> list[str]:
    # Go measures strings in bytes.
    return [f"must be no more than {limit} bytes"] if len(value.encode()) > limit else []


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _dns(value: str, limit: int, regex: re.Pattern[str], message: str, *examples: str) -> list[str]:
    errors = _too_long(value, limit)
    if not regex.fullmatch(value):
        if regex is _LABEL_RE and _SUBDOMAIN_RE.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(message, regex.pattern, *examples))
    return errors


def dns1123_label(value: str) -> list[str]:
    """A lowercase RFC 1123 label, at most 63 bytes."""
    return _dns(
        value,
        63,
        _LABEL_RE,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
        "'-', and must start and end with an alphanumeric character",
        "my-name",
        "123-abc",
    )


def dns1123_subdomain(value: str) -> list[str]:
    """A lowercase RFC 1123 subdomain, at most 253 bytes."""
    return _dns(
        value,
        253,
        _SUBDOMAIN_RE,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
        "'-' or '.', and must start and end with an alphanumeric character",
        "example.com",
    )


def dns1035_label(value: str) -> list[str]:
    """A DNS-1035 label: starts with a letter, at most 63 bytes."""
    return _dns(
        value,
        63,
        _DNS1035_RE,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
        "with an alphabetic character, and end with an alphanumeric character",
        "my-name",
        "abc-123",
    )


_KEY_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character"
)


def qualified_name(value: str) -> list[str]:
    """A label key: an optional DNS subdomain prefix and '/', then a name of <= 63 bytes."""
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key "
            + _regex_error(_KEY_MESSAGE, _KEY, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    errors: list[str] = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + e for e in dns1123_subdomain(prefix)]
    name = parts[-1]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errors.append("name part must be no more than 63 bytes")
    if not _KEY_RE.fullmatch(name):
        errors.append(
            "name part " + _regex_error(_KEY_MESSAGE, _KEY, "MyName", "my.name", "123-abc")
        )
    return errors


def label_value(value: str) -> list[str]:
    """A label value: empty, or a name of <= 63 bytes."""
    errors = _too_long(value, 63)
    if value and not _KEY_RE.fullmatch(value):
        errors.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                f"({_KEY})?",
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errors


def _prefix(validate: Validator) -> Validator:
    # For generateName prefixes: a trailing dash is allowed. Kubernetes masks it by replacing
    # the last two characters with "a" (sic), and validates the result.
    def check(value: str) -> list[str]:
        if len(value.encode()) > 1 and value.endswith("-"):
            value = value.encode()[:-2].decode("utf-8", "replace") + "a"
        return validate(value)

    return check


def uri(value: str) -> list[str]:
    """An absolute URI or absolute path, as ``url()`` takes."""
    try:
        check_request_uri(value)
    except URLError as exc:
        return [f"parse {value!r}: {exc}".replace("'", '"')]
    return []


def _matches(pattern: re.Pattern[str], message: str) -> Validator:
    def check(value: str) -> list[str]:
        return [] if pattern.fullmatch(value) else [message]

    return check


def date(value: str) -> list[str]:
    """A full date, ``2006-01-02``."""
    return [] if parse_date(value) else ["invalid date"]


def datetime_(value: str) -> list[str]:
    """An RFC 3339 date-time, as the OpenAPI ``date-time`` format checks it."""
    parts = value.lower().split("t")
    if len(value) < 4 or len(parts) < 2 or not parse_date(parts[0]):
        return ["invalid datetime"]
    m = _CLOCK.fullmatch(parts[1])
    if m is None or not (m[1] <= "23" and m[2] <= "59" and m[3] <= "59"):
        return ["invalid datetime"]
    return []


FORMATS: dict[str, NamedFormat] = {
    name: NamedFormat(display, check)
    for name, display, check in (
        ("dns1123Label", "DNS1123Label", dns1123_label),
        ("dns1123Subdomain", "DNS1123Subdomain", dns1123_subdomain),
        ("dns1035Label", "DNS1035Label", dns1035_label),
        ("qualifiedName", "QualifiedName", qualified_name),
        ("dns1123LabelPrefix", "DNS1123LabelPrefix", _prefix(dns1123_label)),
        ("dns1123SubdomainPrefix", "DNS1123SubdomainPrefix", _prefix(dns1123_subdomain)),
        ("dns1035LabelPrefix", "DNS1035LabelPrefix", _prefix(dns1035_label)),
        ("labelValue", "LabelValue", label_value),
        ("uri", "URI", uri),
        ("uuid", "uuid", _matches(_UUID, "does not match the UUID format")),
        ("byte", "byte", _matches(_BASE64, "invalid base64")),
        ("date", "date", date),
        ("datetime", "datetime", datetime_),
    )
}


def named(name: Any) -> optional.Optional:
    """``format.named("dns1123Label")``: the format, or none."""
    if type(name) is not str:
        raise NoSuchOverload("format.named", name)
    found = FORMATS.get(name)
    return optional.none() if found is None else optional.of(found)


def validate(fmt: Any, value: Any) -> optional.Optional:
    """``f.validate(s)``: none when ``s`` is valid, else the list of reasons."""
    if not isinstance(fmt, NamedFormat) or type(value) is not str:
        raise NoSuchOverload("validate", fmt, value)
    errors = fmt.validator(value)
    return optional.of(errors) if errors else optional.none()


def _constant(found: NamedFormat) -> Function:
    def get() -> NamedFormat:
        return found

    get.__doc__ = f"``format.{found.name}()``"
    return get


GLOBAL: dict[str, Function] = {
    "format.named": named,
    **{f"format.{name}": _constant(found) for name, found in FORMATS.items()},
}

MEMBER: dict[str, Function] = {"validate": validate}
