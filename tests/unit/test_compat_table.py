"""The README's compatibility table: one cell per feature and release, from the test results."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compat_table", ROOT / "hack" / "compat_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compat = _module()
BINDING = "tests/e2e/test_binding.py::"


def test_cells_count_passes_and_say_why_not() -> None:
    passed = {"outcome": "passed", "reason": ""}
    skipped = {"outcome": "skipped", "reason": "feature gate X (alpha) is off"}
    failed = {"outcome": "failed", "reason": ""}
    prefixes = ("tests/e2e/test_binding.py",)
    assert compat.cell({BINDING + "a": passed, BINDING + "b": passed}, prefixes) == "✓ 2"
    assert (
        compat.cell({BINDING + "a": passed, BINDING + "b": skipped}, prefixes) == "✓ 1, 1 skipped"
    )
    assert (
        compat.cell({BINDING + "a": skipped}, prefixes) == "skipped (feature gate X (alpha) is off)"
    )
    assert compat.cell({BINDING + "a": passed, BINDING + "b": failed}, prefixes) == "**failed**: b"
    assert compat.cell({"tests/e2e/test_other.py::a": passed}, prefixes) == "not run"


def test_table_rows_newest_first_and_replaced_between_markers() -> None:
    reports = [
        {"version": "v1.34.4", "gates": "all", "tests": {}},
        {"version": "v1.37.1", "gates": "all", "tests": {}},
    ]
    ordered = sorted(reports, key=lambda r: compat._release_key(r["version"]), reverse=True)
    text = compat.table(ordered)
    rows = text.splitlines()
    assert rows[0].startswith("| release (gates) | ") and rows[2].startswith("| v1.37.1 (all) |")
    assert rows[3].startswith("| v1.34.4 (all) |")
    doc = f"before\n{compat.BEGIN}\nold\n{compat.END}\nafter\n"
    assert compat.replace(doc, "new") == f"before\n{compat.BEGIN}\nnew\n{compat.END}\nafter\n"


def test_every_feature_names_an_existing_test_file() -> None:
    for prefixes in compat.FEATURES.values():
        for prefix in prefixes:
            assert (ROOT / prefix.split("::")[0]).is_file(), prefix
