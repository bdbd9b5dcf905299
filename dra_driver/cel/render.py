"""Human-readable text for ``match`` and ``explain-claim`` (JSON output needs no help)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.cel.claim_explain import ClaimReport, PoolReport, RequestReport
from dra_driver.cel.environment import API_MAX_EXPRESSION_LENGTH, exceeds_api_length
from dra_driver.cel.match import DeviceResult, SelectorSet


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def match_text(results: Sequence[tuple[SelectorSet, list[DeviceResult]]]) -> str:
    """One table per selector set: device, pool, verdict, reason."""
    out: list[str] = []
    for selector_set, devices in results:
        matched = sum(1 for d in devices if d.verdict.value == "match")
        out.append(f"{selector_set.label}: {matched} of {len(devices)} device(s) match")
        for selector in selector_set.selectors:
            out.append(f"  {selector.origin}: {selector.expression}")
            if exceeds_api_length(selector.expression):
                # The scheduler's CEL compiles it; the API server would not store it.
                out.append(
                    f"  note: {selector.origin}'s selector has {len(selector.expression):,} "
                    f"characters, more than the API allows ({API_MAX_EXPRESSION_LENGTH:,}): "
                    "the API server would refuse it"
                )
        if not selector_set.selectors:
            out.append("  (no selectors: every device of the driver matches)")
        rows = [("DEVICE", "POOL", "VERDICT", "REASON")]
        rows += [(d.device.name, d.device.pool, d.verdict.value, d.reason) for d in devices]
        out += ["  " + line for line in _table(rows)]
        out.append("")
    return "\n".join(out).rstrip()


def _pool_lines(pool: PoolReport) -> list[str]:
    where = f"pool {pool.pool}" + (f" (node {pool.node})" if pool.node else "")
    lines = [f"    {where}, driver {pool.driver}: {pool.devices} device(s)"]
    for origin, expression, left in pool.steps:
        lines.append(f"      {left:>4} left after {origin}: {expression}")
    if pool.errors:
        for name, error in pool.errors.items():
            lines.append(f"      error on {name}: {error}")
    if pool.busy:
        owners = ", ".join(f"{d} -> {c}" for d, c in pool.busy.items())
        lines.append(f"      allocated to other claims: {owners}")
    for label, why in (
        ("tainted, not tolerated by the request", pool.tainted),
        ("shared counters used up by other claims", pool.counters),
        ("without the requested capacity", pool.capacity),
    ):
        if why:
            lines.append(f"      {label}: {', '.join(f'{d} ({w})' for d, w in why.items())}")
    if pool.incomplete:
        lines.append(f"      ignored: {pool.incomplete}")
    lines.append(
        f"      available: {len(pool.available)}"
        + (f" ({', '.join(pool.available)})" if pool.available else "")
    )
    return lines


def _request_lines(report: RequestReport) -> list[str]:
    mode = "all devices" if report.all_devices else f"{report.count} device(s)"
    lines = [f"  request {report.name}: class {report.device_class or '?'}, {mode}"]
    for pool in report.pools:
        lines += _pool_lines(pool)
    for reason in report.blocking:
        lines.append(f"    BLOCKED: {reason}")
    if not report.blocking:
        pools = ", ".join(p.pool for p in report.satisfiable_pools)
        lines.append(f"    satisfiable on its own in: {pools}")
    return lines


def claim_text(report: ClaimReport) -> str:
    """The explanation of one claim."""
    state = "allocated: " + "; ".join(report.allocated) if report.allocated else "not allocated"
    lines = [f"claim {report.claim}: {state}"]
    for name, subs in report.alternatives.items():
        lines.append(
            f"  request {name} is a firstAvailable list: tries {', '.join(subs)} in "
            "order and uses the first that can be satisfied"
        )
    for request in report.requests:
        lines += _request_lines(request)
    if report.constraints:
        lines.append("  constraints:")
        lines += [f"    BLOCKED: {c}" for c in report.constraints]
    if not report.blocking:
        lines.append(
            "  nothing blocks each request on its own; if the claim stays pending, "
            "look at the pod's scheduling events (node affinity, other resources)"
        )
    return "\n".join(lines)
