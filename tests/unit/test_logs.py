"""Log events: small whatever a claim carries, and the JSON format's fields."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from dra_driver import logs as logs_module
from dra_driver.kubeletplugin.node_service import MAX_ERROR, error_text
from dra_driver.logs import MAX_VALUE, JsonLine, UtcStamper, truncate_values

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


def _reference_line(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """What structlog's own processors make of an event (the chain ``JsonLine`` replaces)."""
    chain = [
        structlog.contextvars.merge_contextvars,
        truncate_values,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    for step in chain:
        event = step(logger, method, event)
    return json.loads(structlog.processors.JSONRenderer()(logger, method, event))


@pytest.mark.parametrize("method", ["info", "warning", "error", "exception", "debug"])
def test_json_line_has_the_fields_of_structlogs_processors(method: str) -> None:
    logger = SimpleNamespace(name="dra_driver.gpu.state")
    with structlog.contextvars.bound_contextvars(node="node-1"):
        try:
            raise ValueError("boom")
        except ValueError:
            event = {"claim": "ns/c", "devices": ["gpu-1"], "odd": object(), "event": "done"}
            if method == "exception":
                event["exc_info"] = True
            ours = json.loads(JsonLine()(logger, method, dict(event)))
            reference = _reference_line(logger, method, dict(event))
    assert list(ours) == list(reference)
    stamps = [ours.pop("timestamp"), reference.pop("timestamp")]
    assert ours == reference
    assert ours["node"] == "node-1" and ours["level"] == ("error" if method == "exception" else method)
    assert ours["odd"].startswith("<object object")
    parsed = [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", s) for s in stamps)
    assert abs((parsed[0] - parsed[1]).total_seconds()) < 1


def test_time_stamps_follow_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    stamper = UtcStamper()
    stamps = []
    for now in (1_800_000_000.25, 1_800_000_000.999999, 1_800_000_001.0, 1_800_000_061.5):
        monkeypatch.setattr(logs_module.time, "time", lambda now=now: now)
        stamps.append(stamper(None, "info", {})["timestamp"])
    assert stamps == [
        "2027-01-15T08:00:00.250000Z",
        "2027-01-15T08:00:00.999999Z",
        "2027-01-15T08:00:01.000000Z",
        "2027-01-15T08:01:01.500000Z",
    ]
