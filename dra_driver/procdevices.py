"""Reading the kernel's registry of device drivers (``/proc/devices``).

Drivers such as ``nvidia-uvm``, ``nvidia-caps`` and ``nvidia-caps-imex-channels`` get their
character device major when they load, so a CDI device node for one of them takes its major
from there.
"""

from __future__ import annotations


def char_major(proc_devices: str, name: str) -> int | None:
    """The major of the character device driver ``name`` in a ``/proc/devices`` text (the
    whole name, not a prefix of another; block devices do not count)."""
    in_chars = False
    for line in proc_devices.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_chars = stripped == "Character devices:"
            continue
        number, _, driver = stripped.partition(" ")
        if in_chars and driver.strip() == name and number.isdigit():
            return int(number)
    return None
