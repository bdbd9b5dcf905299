"""Run the project's CEL engine and the scheduler's side by side and list where they differ."""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Any

from dra_driver.cel import CompileError, EvalError, Verdict, compile_selector, device_variables
from dra_driver.cel import evaluate as evaluate_program
from tests.unit.cel.reference import Reference, TestDevice
from tests.unit.cel.reference import Verdict as Result

_VERDICTS = {Verdict.MATCH: "true", Verdict.NO_MATCH: "false", Verdict.ERROR: "error"}


def _variables(device: TestDevice) -> dict[str, Any] | Result:
    try:
        return device_variables(device.device, device.driver)
    except EvalError as exc:
        return Result("error", str(exc))


def ours(selectors: Iterable[str], devices: list[TestDevice]) -> list[list[Result]]:
    """``[selector][device]`` verdicts of :mod:`dra_driver.cel`; an exception other than the
    engine's own errors is the verdict ``crash``, which never agrees."""
    variables = [_variables(d) for d in devices]
    out = []
    for selector in selectors:
        try:
            program = compile_selector(selector)
        except CompileError as exc:
            out.append([Result("compile", str(exc))] * len(devices))
            continue
        except Exception:
            out.append([Result("crash", traceback.format_exc(limit=3))] * len(devices))
            continue
        row = []
        for v in variables:
            if isinstance(v, Result):
                row.append(v)
                continue
            try:
                outcome = evaluate_program(program, v)
            except Exception:
                row.append(Result("crash", traceback.format_exc(limit=3)))
                continue
            row.append(Result(_VERDICTS[outcome.verdict], outcome.error))
        out.append(row)
    return out


def compare(
    reference: Reference, selectors: list[str], devices: list[TestDevice]
) -> list[tuple[str, int, Result, Result]]:
    """Every (selector, device index, ours, scheduler's) whose verdicts differ."""
    theirs = reference.run(selectors, devices)
    mine = ours(selectors, devices)
    return [
        (selector, j, a, b)
        for selector, row_a, row_b in zip(selectors, mine, theirs, strict=True)
        for j, (a, b) in enumerate(zip(row_a, row_b, strict=True))
        if a.verdict != b.verdict
    ]


def _abbreviated(selector: str) -> str:
    # Selectors past the API's length limit are tested too: show their ends and length.
    if len(selector) <= 600:
        return selector
    return f"{selector[:300]} ... {selector[-200:]} ({len(selector)} characters)"


def describe(found: list[tuple[str, int, Result, Result]], devices: list[TestDevice]) -> str:
    """A readable list of disagreements: selector, device, both verdicts and messages."""
    lines = []
    for selector, j, a, b in found:
        lines.append(
            f"selector: {_abbreviated(selector)}\n  device: {devices[j]}\n"
            f"  ours:      {a.verdict} {a.message.strip()[:300]}\n"
            f"  scheduler: {b.verdict} {b.message.strip()[:300]}"
        )
    return "\n".join(lines)
