"""Fault points are inert unless armed, and exit the process when reached."""

from __future__ import annotations

import os
import subprocess
import sys

from dra_driver import faults


def test_inert_by_default() -> None:
    faults.arm("")
    faults.point("prepare.started-recorded")  # returns


def test_armed_point_exits_on_its_count() -> None:
    code = "from dra_driver import faults\nfor i in range(5):\n    print(i, flush=True)\n    faults.point('p')\n"
    env = {**os.environ, faults.ENV: "other,p@3"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == faults.EXIT_CODE
    assert proc.stdout.split() == ["0", "1", "2"]
    assert "exiting at p" in proc.stderr
