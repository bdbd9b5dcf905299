"""The Kubernetes ``url`` CEL library, parsing as Go's ``net/url`` does.

``url(s)`` and ``isURL(s)`` accept what ``url.ParseRequestURI`` accepts (an absolute URL or
an absolute path, no fragment handling); the parts are then read as ``url.Parse`` reads them.
Python's ``urllib`` is more lenient than Go in several places (ports, escapes, hosts), so the
rules the scheduler applies are written out here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.values import string_arg
from dra_driver.errors import DriverError

Function = Callable[..., Any]


class URLError(DriverError, ValueError):
    """Why Go's ``net/url`` refuses a URL."""


@dataclass(frozen=True)
class URL:
    """A CEL ``kubernetes.URL``: the parts ``url.Parse`` finds.

    ``text`` is the URL as written with its scheme lower-cased, which is what Go's
    ``URL.String()`` gives back for the URLs ``url()`` accepts; equality compares it.
    """

    text: str
    scheme: str
    host: str
    path: str
    raw_path: str
    raw_query: str
    cel_type_name = "kubernetes.URL"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


_SCHEME_START = re.compile(r"[A-Za-z]")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
_HOST_EXTRA = frozenset("!$&'()*+,;=:[]<>\"")
_PATH_EXTRA = frozenset("$&+,/:;=@")
_PATH_VALID_EXTRA = frozenset("!$&'()*+,;=:@[]%")
_USERINFO = _UNRESERVED | frozenset("-._:~!$&'()*+,;=%@")
_HEX = frozenset("0123456789abcdefABCDEF")


def _scheme(text: str) -> tuple[str, str]:
    for i, c in enumerate(text):
        if _SCHEME_START.fullmatch(c):
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", text
            continue
        if c == ":":
            if i == 0:
                raise URLError("missing protocol scheme")
            return text[:i], text[i + 1 :]
        return "", text
    return "", text


def _unescape(text: str, mode: str) -> str:
    """Go's ``unescape``: ``%XX`` must be valid hex; a host allows only some characters."""
    out = bytearray()
    raw = text.encode("utf-8")
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # %
            escape = raw[i : i + 3].decode("utf-8", "replace")
            if len(escape) < 3 or escape[1] not in _HEX or escape[2] not in _HEX:
                raise URLError(f"invalid URL escape {escape!r}")
            if mode == "host" and int(escape[1], 16) < 8 and escape != "%25":
                raise URLError(f"invalid character {escape!r} in host name")
            out.append(int(escape[1:], 16))
            i += 3
            continue
        if c == 0x2B and mode == "query":  # +
            out.append(0x20)
        else:
            if mode == "host" and c < 0x80 and _escapes(chr(c), mode):
                raise URLError(f"invalid character {chr(c)!r} in host name")
            out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _escapes(c: str, mode: str) -> bool:
    """Go's ``shouldEscape`` for the host and path modes."""
    if c in _UNRESERVED:
        return False
    if mode == "host":
        return c not in _HOST_EXTRA
    if mode == "path":
        return c not in _PATH_EXTRA
    return True


def _valid_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all(c in "0123456789" for c in port[1:]))


def _host(authority: str) -> str:
    at = authority.rfind("@")
    host = authority[at + 1 :]
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise URLError("missing ']' in host")
        if not _valid_port(host[end + 1 :]):
            raise URLError(f"invalid port {host[end + 1 :]!r} after host")
        zone = host[:end].find("%25")
        literal = _unescape(host[1:zone] if zone >= 0 else host[1:end], "host")
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise URLError(f"invalid IP-literal {host[: end + 1]!r}") from None
        if zone >= 0:
            if zone + 3 == end:
                raise URLError("invalid IPv6 zone")
            return (
                _unescape(host[:zone], "host")
                + _unescape(host[zone:end], "zone")
                + _unescape(host[end:], "host")
            )
    elif "[" in host:
        raise URLError(f"unexpected '[' in host {host!r}")
    elif (colon := host.rfind(":")) >= 0 and not _valid_port(host[colon:]):
        raise URLError(f"invalid port {host[colon:]!r} after host")
    host = _unescape(host, "host")
    if at >= 0:
        userinfo = authority[:at]
        if any(c not in _USERINFO for c in userinfo):
            raise URLError("net/url: invalid userinfo")
        _unescape(userinfo, "userinfo")
    return host


def _parse(text: str, via_request: bool) -> URL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise URLError("net/url: invalid control character in URL")
    if text == "" and via_request:
        raise URLError("empty url")
    if text == "*":
        return URL(text, "", "", "*", "", "")
    scheme, rest = _scheme(text)
    scheme = scheme.lower()
    if scheme:
        text = f"{scheme}:{rest}"
    if rest.endswith("?") and rest.count("?") == 1:
        rest, query = rest[:-1], ""
    else:
        rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return URL(text, scheme, "", "", "", query)  # opaque: mailto:x
        if via_request:
            raise URLError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise URLError("first path segment in URL cannot contain colon")
    host = ""
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        host, rest = _host(authority), slash + tail
    path = _unescape(rest, "path")
    return URL(text, scheme, host, path, rest if _escape_path(path) != rest else "", query)


def _escape_path(path: str) -> str:
    out = []
    for byte in path.encode("utf-8", "surrogateescape"):
        c = chr(byte)
        out.append(f"%{byte:02X}" if byte >= 0x80 or _escapes(c, "path") else c)
    return "".join(out)


def check_request_uri(text: str) -> None:
    """Whether Go's ``url.ParseRequestURI`` takes ``text``; :class:`URLError` if not."""
    _parse(text, via_request=True)


def parse_url(text: str) -> URL:
    """What ``url(text)`` holds; :class:`URLError` as Go refuses it."""
    check_request_uri(text)
    before, hash_sign, fragment = text.partition("#")
    _unescape(fragment, "fragment")
    parsed = _parse(before, via_request=False)
    return replace(parsed, text=parsed.text + hash_sign + fragment)


def _valid_encoded(raw: str) -> bool:
    return all(c in _PATH_VALID_EXTRA or not _escapes(c, "path") for c in raw)


def url(value: Any) -> URL:
    """``url("https://example.com/a")``."""
    try:
        return parse_url(string_arg("url", value))
    except URLError as exc:
        raise EvalError(f"URL parse error during conversion from string: {exc}") from None


def is_url(value: Any) -> bool:
    """``isURL(s)``: whether ``s`` is an absolute URL or an absolute path."""
    try:
        check_request_uri(string_arg("isURL", value))
    except URLError:
        return False
    return True


def _url(name: str, value: Any) -> URL:
    if not isinstance(value, URL):
        raise NoSuchOverload(name, value)
    return value


def _split_host_port(host: str) -> tuple[str, str]:
    port = ""
    colon = host.rfind(":")
    if colon >= 0 and _valid_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def get_scheme(value: Any) -> str:
    """The scheme, lower-cased."""
    return _url("getScheme", value).scheme


def get_host(value: Any) -> str:
    """The host with its port."""
    return _url("getHost", value).host


def get_hostname(value: Any) -> str:
    """The host without port or IPv6 brackets."""
    return _split_host_port(_url("getHostname", value).host)[0]


def get_port(value: Any) -> str:
    """The port, or ""."""
    return _split_host_port(_url("getPort", value).host)[1]


def get_escaped_path(value: Any) -> str:
    """The path as written when that is a valid encoding, else re-escaped."""
    u = _url("getEscapedPath", value)
    if u.raw_path and _valid_encoded(u.raw_path):
        try:
            if _unescape(u.raw_path, "path") == u.path:
                return u.raw_path
        except URLError:
            pass
    if u.path == "*":
        return "*"
    return _escape_path(u.path)


def get_query(value: Any) -> dict[str, list[str]]:
    """The query as a map of lists; pairs Go cannot decode are left out, as there."""
    query: dict[str, list[str]] = {}
    for pair in _url("getQuery", value).raw_query.split("&"):
        if ";" in pair or not pair:
            continue
        key, _, val = pair.partition("=")
        try:
            key, val = _unescape(key, "query"), _unescape(val, "query")
        except URLError:
            continue
        query.setdefault(key, []).append(val)
    return query


GLOBAL: dict[str, Function] = {"url": url, "isURL": is_url}

MEMBER: dict[str, Function] = {
    "getScheme": get_scheme,
    "getHost": get_host,
    "getHostname": get_hostname,
    "getPort": get_port,
    "getEscapedPath": get_escaped_path,
    "getQuery": get_query,
}
