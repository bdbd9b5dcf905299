"""The test run itself: a stopped run still tears its fixtures down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_TEST = """
import asyncio
import signal
import time
from pathlib import Path
import pytest

@pytest.fixture(scope="session")
def started():
    yield
    Path({torn!r}).write_text("stopped")

def test_handles_sigterm_on_its_own_loop():
    # A loop that handles SIGTERM itself resets it to the default when it closes.
    loop = asyncio.new_event_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    loop.close()

def test_runs_long(started):
    Path({ready!r}).write_text("running")
    time.sleep(60)
"""


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    """A CI timeout sends SIGTERM: the session's fixtures (the e2e control plane) must still
    be stopped, as on Ctrl-C, not left running when pytest dies; also after an earlier test
    handled SIGTERM on an event loop of its own."""
    ready, torn = tmp_path / "ready", tmp_path / "torn"
    test = tmp_path / "test_long.py"
    test.write_text(_TEST.format(ready=str(ready), torn=str(torn)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(test),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the inner test did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert torn.read_text() == "stopped", out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
