"""The /proc/devices reader, by table."""

from __future__ import annotations

import pytest

from dra_driver.procdevices import char_major

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
508 nvidia-caps

Block devices:
234 nvidia-caps-imex-channels
"""


@pytest.mark.parametrize(
    ("text", "device", "major"),
    [
        (PROC_DEVICES, "nvidia-caps-imex-channels", 234),
        (PROC_DEVICES, "nvidia-caps", 508),  # the whole name, not a prefix of another
        ("Character devices:\n  1 mem\n", "nvidia-caps-imex-channels", None),
        # Not a character device.
        ("Block devices:\n 99 nvidia-caps-imex-channels\n", "nvidia-caps-imex-channels", None),
        ("", "nvidia-caps", None),
    ],
)
def test_char_major(text: str, device: str, major: int | None) -> None:
    assert char_major(text, device) == major
