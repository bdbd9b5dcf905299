"""Log events stay small whatever a claim carries."""

from __future__ import annotations

import json
import subprocess
import sys

from dra_driver.kubeletplugin.node_service import MAX_ERROR, error_text
from dra_driver.logs import MAX_VALUE

BIG = 3_000_000

_EMIT = f"""
from dra_driver import logs
import structlog
logs.configure("json", "info")
huge = "x" * {BIG}
structlog.get_logger("t").error("prepare failed", error="config " + huge, claim="ns/c")
"""


def test_a_3mb_value_is_cut_in_the_log_line() -> None:
    proc = subprocess.run([sys.executable, "-c", _EMIT], capture_output=True, text=True, check=True)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 2 * MAX_VALUE
    event = json.loads(lines[0])
    assert event["claim"] == "ns/c" and event["event"] == "prepare failed"
    assert event["error"].startswith("config xxx")
    assert event["error"].endswith(f"... ({BIG + len('config ') - MAX_VALUE} more characters)")


def test_claim_error_message_is_bounded() -> None:
    text = error_text(ValueError("bad value " + "y" * BIG))
    assert len(text) < MAX_ERROR + 50 and text.startswith("bad value yyy")
    assert error_text(ValueError("")) == "ValueError"
    assert error_text(ValueError("short")) == "short"
