"""The node benchmark's call profile: components, and C functions counted for their caller."""

from __future__ import annotations

import cProfile
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _call_profile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("call_profile", BENCH / "call_profile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


call_profile = _call_profile()


def test_a_function_counts_for_the_first_component_its_file_matches() -> None:
    assert call_profile.component("/x/lib/python3.11/json/encoder.py") == "JSON"
    assert call_profile.component("/x/site-packages/structlog/_base.py") == "logs"
    assert call_profile.component("/work/dra_driver/gpu/state/journal.py") == (
        "checkpoint and journal"
    )
    assert call_profile.component("/work/dra_driver/gpu/state/planner.py").startswith(
        "driver transaction"
    )
    assert call_profile.component("/work/dra_driver/kubeletplugin/lock.py").startswith(
        "kubelet plugin"
    )
    assert call_profile.component("/work/something_else.py") == call_profile.OTHER


def test_calls_are_per_cycle_and_c_functions_count_for_their_caller(tmp_path: Path) -> None:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):
        json.dumps({"a": [1, 2]})  # Python code in json/, which calls C encoders
    profile.disable()
    stats = tmp_path / "out.prof"
    profile.dump_stats(str(stats))

    summary = call_profile.summarize(stats, cycles=4)

    calls, _ = summary["components"]["JSON"]
    # dumps and JSONEncoder.encode/iterencode, and the C encoder each calls: a few per cycle,
    # all of them counted for JSON, none for "other" but the profiler's own disable().
    assert calls >= 3
    assert summary["components"][call_profile.OTHER][0] <= 1
    assert summary["calls"] == pytest.approx(
        sum(c for c, _ in summary["components"].values()), abs=0.5
    )
    assert summary["cycles"] == 4
