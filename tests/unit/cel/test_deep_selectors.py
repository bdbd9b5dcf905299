"""Selectors that used to crash the engine: deep nesting and long operator chains.

Through the ``dra-driver`` entry point (``match``) and the explain-claim functions: no traceback,
and the scheduler's verdict (from tests/unit/cel/test_differential.py's reference runs):
100 nested parentheses evaluate; 300 of them, or 500 chained ``1 +``, are the scheduler's
compile errors; chains of thousands of ``&&`` or ``||`` terms evaluate and are explained.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.cel.claim_explain import explain_claim
from dra_driver.cli import main
from dra_driver.exitcodes import NO_MATCH
from tests.unit.cel.test_claim_explain import CLASSES, SLICES, claim, exactly

CASES = [
    ("(" * 100 + "true" + ")" * 100, 0, "match"),
    ("!" * 1000 + "true", 0, "match"),
    ("[" * 200 + "1" + "]" * 200 + " != []", 0, "match"),
    (" && ".join(["true"] * 600), 0, "match"),
    ("(" * 300 + "true" + ")" * 300, NO_MATCH, "expression recursion limit exceeded: 250"),
    ("1 + " * 500 + "1 > 0", NO_MATCH, "max recursion depth exceeded"),
    # Past the API's length limit, which the scheduler's CEL does not apply: a flat chain
    # of thousands of terms, the last one false (explained), and past the parser's limit.
    (" && ".join(["true"] * 2_600), 0, "match"),
    (" && ".join(["true"] * 2_600) + " && false", NO_MATCH, "no match"),
    (" || ".join(["false"] * 2_600), NO_MATCH, "no match"),
    ("true" + " " * 100_000, NO_MATCH, "expression code point size exceeds limit"),
]


def _class(tmp_path: Path, expression: str) -> Path:
    path = tmp_path / "class.json"
    selector = {"cel": {"expression": expression}}
    path.write_text(
        json.dumps(
            {"kind": "DeviceClass", "metadata": {"name": "deep"}, "spec": {"selectors": [selector]}}
        )
    )
    return path


@pytest.mark.parametrize(
    ("expression", "status", "text"), CASES, ids=[str(i) for i in range(len(CASES))]
)
def test_match_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], expression: str, status: int, text: str
) -> None:
    argv = [
        "match",
        "--class",
        str(_class(tmp_path, expression)),
        "--profile",
        "l4x4",
        "-o",
        "json",
    ]
    assert main(argv) == status
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    devices = json.loads(captured.out)["sets"][0]["devices"]
    found = {d["verdict"] if "match" in text else d.get("error", "") for d in devices}
    assert all(text in f for f in found), found


@pytest.mark.parametrize(
    ("expression", "status", "text"), CASES, ids=[str(i) for i in range(len(CASES))]
)
def test_explain_claim(expression: str, status: int, text: str) -> None:
    report = explain_claim(claim("c", [exactly("gpu", 1, expression)]), CLASSES, SLICES, [])
    assert bool(report.blocking) == bool(status)
