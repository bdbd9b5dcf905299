"""The GPU driver as the kubelet plugin sees it: an async face on the blocking node state."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dra_driver import metrics
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin import run_blocking
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PrepareResult,
    UnprepareResult,
)


class ClaimStatus(Protocol):
    """Where prepare outcomes go (the claim status writer, :mod:`dra_driver.claimreport`)."""

    def set_devices(self, ref: ClaimRef, devices: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """The claim's prepared devices, (device name, data) each; empty clears them."""
        ...

    def prepare_failed(self, ref: ClaimRef, message: str) -> None:
        """A claim could not be prepared; ``message`` says why."""
        ...


class GpuDriver:
    """Implements the kubelet plugin's ``Driver`` protocol over a :class:`DeviceState`.

    Prepare and unprepare fsync files, so they run in a worker thread, never on the loop; a
    cancelled call still waits for its thread, so the node lock is never released early.
    With a ``reporter``, prepared devices appear in the claims' status and failures as events.
    """

    def __init__(self, state: DeviceState, reporter: ClaimStatus | None = None) -> None:
        self.state = state
        self.reporter = reporter

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """Prepare a batch of claims."""
        started = time.perf_counter()
        results = await run_blocking(self.state.prepare, claims)
        metrics.observe_batch(metrics.PREPARE_SECONDS, started, dict(results))
        metrics.PREPARED_CLAIMS.set(self.state.prepared_count())
        if self.reporter is not None:
            for claim in claims:
                outcome = results.get(claim.ref.uid)
                if isinstance(outcome, Exception):
                    self.reporter.prepare_failed(claim.ref, str(outcome))
                elif outcome is not None:
                    record = self.state.record(claim.ref.uid)
                    devices = record.devices if record else []
                    self.reporter.set_devices(
                        claim.ref, [(d.device_name, {"uuid": d.uuid}) for d in devices]
                    )
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Unprepare a batch of claims."""
        started = time.perf_counter()
        results = await run_blocking(self.state.unprepare, claims)
        metrics.observe_batch(metrics.UNPREPARE_SECONDS, started, dict(results))
        metrics.PREPARED_CLAIMS.set(self.state.prepared_count())
        if self.reporter is not None:
            for ref in claims:
                if results.get(ref.uid) is None:
                    self.reporter.set_devices(ref, [])
        return results
