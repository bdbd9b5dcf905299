"""The ``DT_SONAME`` of a shared library: the name the dynamic loader looks it up by.

``libcuda.so.580.95.05`` says ``libcuda.so.1`` in its dynamic section; programs link against
(and ``dlopen``) that name, so a container needs the library reachable under it. Read from
the section headers: no loader, no ``readelf`` binary, any architecture or byte order.
"""

from __future__ import annotations

import struct
from pathlib import Path

_SHT_DYNAMIC = 6
_DT_NULL = 0
_DT_SONAME = 14


def soname(path: Path) -> str | None:
    """The library's soname, or None when it is not an ELF file or declares none."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return None
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    try:
        return _soname(data, is64, endian)
    except (struct.error, IndexError, UnicodeDecodeError):
        return None  # truncated or malformed: treat as no soname


def _soname(data: bytes, is64: bool, endian: str) -> str | None:
    if is64:
        (shoff,) = struct.unpack_from(endian + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
        section = endian + "IIQQQQIIQQ"  # name type flags addr offset size link info align entsize
        dyn = endian + "qQ"
    else:
        (shoff,) = struct.unpack_from(endian + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x2E)
        section = endian + "IIIIIIIIII"
        dyn = endian + "iI"
    headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    for header in headers:
        if header[1] != _SHT_DYNAMIC:
            continue
        offset, size, link = header[4], header[5], header[6]
        strtab_offset = headers[link][4]
        step = struct.calcsize(dyn)
        for entry in range(offset, offset + size, step):
            tag, value = struct.unpack_from(dyn, data, entry)
            if tag == _DT_NULL:
                break
            if tag == _DT_SONAME:
                start = strtab_offset + value
                return data[start : data.index(b"\0", start)].decode()
    return None
