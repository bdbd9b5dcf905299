"""The Kubernetes ``ip`` and ``cidr`` CEL libraries, with Go's ``net/netip`` rules.

Addresses with a zone (``fe80::1%eth0``) and IPv4-mapped IPv6 addresses (``::ffff:1.2.3.4``)
are refused, as the scheduler's library does; IPv4 fields with a leading zero are invalid.
The predicates (``isGlobalUnicast`` and friends) follow Go's definitions, which differ from
Python's ``ipaddress`` (Go counts private addresses as global unicast).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import Printable
from dra_driver.cel.values import string_arg, succeeds
from dra_driver.errors import DriverError

Function = Callable[..., Any]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class IP(Printable):
    """A CEL ``net.IP``."""

    address: Address
    cel_type_name = "net.IP"

    def __str__(self) -> str:
        return str(self.address)


@dataclass(frozen=True)
class CIDR(Printable):
    """A CEL ``net.CIDR``: an address and a prefix length (host bits are kept)."""

    address: Address
    bits: int
    cel_type_name = "net.CIDR"

    def __str__(self) -> str:
        return f"{self.address}/{self.bits}"

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """The prefix with its host bits cleared."""
        return ipaddress.ip_network(f"{self.address}/{self.bits}", strict=False)


def _parse_address(text: str) -> Address:
    # netip.ParseAddr: IPv6 when there is a colon, IPv4 when there is a dot.
    if ":" in text:
        address, _, zone = text.partition("%")
        if "%" in text and not zone:
            raise ValueError("missing zone")
        try:
            parsed = ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError("unable to parse IP") from None
        if zone:
            raise _Refused(f"IP address {text!r} with zone value is not allowed")
        return parsed
    if "." in text:
        try:
            return ipaddress.IPv4Address(text)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
    raise ValueError("unable to parse IP")


class _Refused(DriverError, ValueError):
    # A well-formed address the library does not take; its message is the whole error.
    pass


def parse_ip(text: str) -> Address:
    """An address as the Kubernetes library accepts it; EvalError with its message if not."""
    try:
        address = _parse_address(text)
    except _Refused as exc:
        raise EvalError(str(exc).replace("'", '"')) from None
    except ValueError as exc:
        raise EvalError(
            f'IP Address "{text}" parse error during conversion from string: '
            f'ParseAddr("{text}"): {exc}'
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise EvalError(f'IPv4-mapped IPv6 address "{text}" is not allowed')
    return address


_BITS = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def parse_cidr(text: str) -> CIDR:
    """A prefix as ``netip.ParsePrefix`` reads it, refusing IPv4-mapped addresses."""
    prefix = "network address parse error during conversion from string: "
    where = f'netip.ParsePrefix("{text}")'
    address_text, slash, bits_text = text.rpartition("/")
    if not slash:
        raise EvalError(f"{prefix}{prefix}{where}: no '/'")
    if "%" in address_text:
        raise EvalError(f"{prefix}{prefix}{where}: IPv6 zones cannot be present in a prefix")
    try:
        address = _parse_address(address_text)
    except ValueError as exc:
        raise EvalError(f'{prefix}{prefix}{where}: ParseAddr("{address_text}"): {exc}') from None
    if not _BITS.fullmatch(bits_text):
        raise EvalError(f'{prefix}{prefix}{where}: bad bits after slash: "{bits_text}"')
    bits = int(bits_text)
    if bits > address.max_prefixlen:
        raise EvalError(f"{prefix}{prefix}{where}: prefix length out of range")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise EvalError(f'{prefix}IPv4-mapped IPv6 address "{text}" is not allowed')
    return CIDR(address, bits)


def ip(value: Any) -> IP:
    """``ip("10.0.0.1")``."""
    return IP(parse_ip(string_arg("ip", value)))


def is_ip(value: Any) -> bool:
    """``isIP(s)``: whether ``ip(s)`` would succeed."""
    return succeeds(parse_ip, string_arg("isIP", value))


def is_canonical(value: Any) -> bool:
    """``ip.isCanonical(s)``: whether ``s`` is written as ``string(ip(s))`` would write it."""
    text = string_arg("ip.isCanonical", value)
    return str(parse_ip(text)) == text


def cidr(value: Any) -> CIDR:
    """``cidr("10.0.0.0/8")``."""
    return parse_cidr(string_arg("cidr", value))


def is_cidr(value: Any) -> bool:
    """``isCIDR(s)``."""
    return succeeds(parse_cidr, string_arg("isCIDR", value))


def _ip(name: str, value: Any) -> Address:
    if not isinstance(value, IP):
        raise NoSuchOverload(name, value)
    return value.address


def _cidr(name: str, value: Any) -> CIDR:
    if not isinstance(value, CIDR):
        raise NoSuchOverload(name, value)
    return value


def family(value: Any) -> int:
    """4 or 6."""
    return _ip("family", value).version


def is_unspecified(value: Any) -> bool:
    """``0.0.0.0`` or ``::``."""
    return _ip("isUnspecified", value).is_unspecified


def is_loopback(value: Any) -> bool:
    """``127.0.0.0/8`` or ``::1``."""
    return _ip("isLoopback", value).is_loopback


def is_link_local_multicast(value: Any) -> bool:
    """``224.0.0.0/24``, or an IPv6 multicast address of link-local scope (``ff02::``)."""
    address = _ip("isLinkLocalMulticast", value)
    if address.version == 4:
        return address in _V4_LINK_LOCAL_MULTICAST
    return address.packed[0] == 0xFF and address.packed[1] & 0x0F == 0x02


def is_link_local_unicast(value: Any) -> bool:
    """``169.254.0.0/16`` or ``fe80::/10``."""
    address = _ip("isLinkLocalUnicast", value)
    return address in (_V4_LINK_LOCAL if address.version == 4 else _V6_LINK_LOCAL)


def is_global_unicast(value: Any) -> bool:
    """Go's definition: not unspecified, broadcast, loopback, multicast or link-local."""
    address = _ip("isGlobalUnicast", value)
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        return False
    if address.version == 4:
        return address != _V4_BROADCAST and address not in _V4_LINK_LOCAL
    return address not in _V6_LINK_LOCAL


_V4_LINK_LOCAL_MULTICAST = ipaddress.ip_network("224.0.0.0/24")
_V4_LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")
_V6_LINK_LOCAL = ipaddress.ip_network("fe80::/10")
_V4_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def contains_ip(value: Any, other: Any) -> bool:
    """``c.containsIP(ip)`` or ``c.containsIP("1.2.3.4")``; false across families."""
    prefix = _cidr("containsIP", value)
    if type(other) is str:
        other = ip(other)
    address = _ip("containsIP", other)
    return address.version == prefix.address.version and address in prefix.network


def contains_cidr(value: Any, other: Any) -> bool:
    """``c.containsCIDR(c2)``: ``c2`` lies within ``c``."""
    prefix = _cidr("containsCIDR", value)
    if type(other) is str:
        other = cidr(other)
    inner = _cidr("containsCIDR", other)
    if inner.address.version != prefix.address.version or inner.bits < prefix.bits:
        return False
    return inner.network.subnet_of(prefix.network)  # type: ignore[arg-type]


def cidr_ip(value: Any) -> IP:
    """``c.ip()``: the address as written, host bits included."""
    return IP(_cidr("ip", value).address)


def prefix_length(value: Any) -> int:
    """``c.prefixLength()``."""
    return _cidr("prefixLength", value).bits


def masked(value: Any) -> CIDR:
    """``c.masked()``: the prefix with its host bits cleared."""
    prefix = _cidr("masked", value)
    return CIDR(prefix.network.network_address, prefix.bits)


GLOBAL: dict[str, Function] = {
    "ip": ip,
    "isIP": is_ip,
    "ip.isCanonical": is_canonical,
    "cidr": cidr,
    "isCIDR": is_cidr,
}

MEMBER: dict[str, Function] = {
    "family": family,
    "isUnspecified": is_unspecified,
    "isLoopback": is_loopback,
    "isLinkLocalMulticast": is_link_local_multicast,
    "isLinkLocalUnicast": is_link_local_unicast,
    "isGlobalUnicast": is_global_unicast,
    "containsIP": contains_ip,
    "containsCIDR": contains_cidr,
    "ip": cidr_ip,
    "prefixLength": prefix_length,
    "masked": masked,
}
