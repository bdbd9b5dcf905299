"""The README's compatibility table, from the end-to-end results of each Kubernetes release.

``make test-versions`` runs the end-to-end suite against every release in testenv/versions,
each run writing its outcome per test to ``.cache/compat/<version>.json`` (the e2e conftest's
DRA_E2E_REPORT). This script groups the tests by feature and renders one row per release:

    .venv/bin/python hack/compat_table.py           # print the table
    .venv/bin/python hack/compat_table.py --write   # replace it in README.md
    .venv/bin/python hack/compat_table.py --check   # fail if README.md differs from the results
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / ".cache" / "compat"
README = ROOT / "README.md"
BEGIN, END = "<!-- compat:begin -->", "<!-- compat:end -->"

#: Feature (column) -> the test ids (prefixes) that show it.
FEATURES: dict[str, tuple[str, ...]] = {
    "prepare, CDI, restarts": ("tests/e2e/test_driver.py", "tests/e2e/test_controlplane.py"),
    "slice publishing": ("tests/e2e/test_publisher.py",),
    "examples": ("tests/e2e/test_examples.py", "tests/e2e/test_manifests_e2e.py"),
    "taints, re-check": ("tests/e2e/test_health.py::test_xid_taints_reports_and_recovers",),
    "kubelet health stream": (
        "tests/e2e/test_health.py::test_kubelet_health_stream_reports_and_recovers",
    ),
    "dynamic MIG": ("tests/e2e/test_dynamic_mig.py",),
    "binding conditions": ("tests/e2e/test_binding.py",),
    "shared GPUs (capacity)": ("tests/e2e/test_shared_gpus.py",),
    "time-slicing, MPS": ("tests/e2e/test_sharing.py",),
    "NUMA alignment": ("tests/e2e/test_alignment.py",),
    "node overhead": ("tests/e2e/test_node_overhead.py",),
    "list-type attributes": (
        "tests/e2e/test_list_attributes.py::test_a_claim_selects_a_gpu_by_a_mig_profile",
    ),
    "lists refused: published without": (
        "tests/e2e/test_list_attributes.py::test_without_the_gate",
    ),
    "crash and fault safety": ("tests/e2e/test_crash.py", "tests/e2e/test_state_faults.py"),
    "CEL tools": ("tests/e2e/test_cel_conformance.py", "tests/e2e/test_cel_tools_live.py"),
}


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split(".") if p.isdigit())


def load(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every release's report, newest first."""
    reports = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    return sorted(reports, key=lambda r: _release_key(str(r["version"])), reverse=True)


def cell(tests: dict[str, dict[str, str]], prefixes: tuple[str, ...]) -> str:
    """One feature on one release: how many of its tests passed, or why not."""
    mine = {k: v for k, v in tests.items() if k.startswith(prefixes)}
    if not mine:
        return "not run"
    failed = sorted(k.split("::")[-1] for k, v in mine.items() if v["outcome"] == "failed")
    if failed:
        return "**failed**: " + ", ".join(failed)
    passed = sum(v["outcome"] == "passed" for v in mine.values())
    skipped = [v["reason"] for v in mine.values() if v["outcome"] == "skipped"]
    if not passed:
        return f"skipped ({skipped[0]})" if skipped else "not run"
    return f"✓ {passed}" + (f", {len(skipped)} skipped" if skipped else "")


def table(reports: list[dict[str, Any]]) -> str:
    """The Markdown table: a row per release, a column per feature."""
    head = "| release (gates) | " + " | ".join(FEATURES) + " |"
    rule = "|---" * (len(FEATURES) + 1) + "|"
    rows = [
        f"| {r['version']} ({r['gates']}) | "
        + " | ".join(cell(r["tests"], prefixes) for prefixes in FEATURES.values())
        + " |"
        for r in reports
    ]
    return "\n".join([head, rule, *rows])


def replace(text: str, new_table: str) -> str:
    """``text`` with the part between the markers replaced by ``new_table``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + new_table + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    """Print, write or check the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the table in README.md")
    mode.add_argument("--check", action="store_true", help="README.md agrees with the results")
    args = parser.parse_args(argv)
    reports = load()
    if not reports:
        print(f"no results in {RESULTS}: run `make test-versions` first", file=sys.stderr)
        return 1
    new = table(reports)
    text = README.read_text()
    if args.write:
        README.write_text(replace(text, new))
    elif args.check:
        if replace(text, new) != text:
            print("README.md's compatibility table differs from the results", file=sys.stderr)
            return 1
    else:
        print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
