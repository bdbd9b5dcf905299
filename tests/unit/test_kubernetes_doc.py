"""docs/kubernetes.md stays true: its gate table is what hack/kubernetes_doc.py renders from the
releases' own feature registries, and every test it cites exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kubernetes.md"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "kubernetes_doc", ROOT / "hack" / "kubernetes_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


doc = _module()


def _gate_rows() -> dict[str, list[str]]:
    text = DOC.read_text()
    table = text.split(doc.BEGIN)[1].split(doc.END)[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_driver_column_is_the_one_the_script_writes() -> None:
    rows = _gate_rows()
    assert rows, "no gate table between the markers"
    for gate, cells in rows.items():
        assert cells[-1] == doc.DRIVER.get(gate, ""), gate


def test_every_cited_test_file_exists() -> None:
    cited = set(re.findall(r"tests/(?:e2e|unit)/[\w/]+\.py", DOC.read_text()))
    assert cited
    missing = sorted(p for p in cited if not (ROOT / p).is_file())
    assert not missing


def test_the_table_matches_the_releases_when_they_are_built() -> None:
    releases = doc.parse_versions(doc.versions_file(ROOT).read_text())
    absent = [v for v in releases if not (doc.release_cache(ROOT, v) / "bin" / "testenv").exists()]
    if absent:
        pytest.skip(f"control planes not built for {', '.join(absent)} (make testenvs)")
    assert DOC.read_text().split(doc.BEGIN)[1].split(doc.END)[0].strip() == doc.table()
