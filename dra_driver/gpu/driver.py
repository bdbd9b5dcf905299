"""The GPU driver as the kubelet plugin sees it: an async face on the blocking node state."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from dra_driver import metrics
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.gpu.state.planner import CarveError, ClaimError, NoPlacementError
from dra_driver.kubeletplugin import InlineRunner, run_blocking
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PrepareResult,
    UnprepareResult,
)

log = structlog.get_logger(__name__)


class ClaimStatus(Protocol):
    """Where prepare outcomes go (the claim status writer, :mod:`dra_driver.claimreport`)."""

    def set_devices(
        self,
        ref: ClaimRef,
        devices: Sequence[tuple[Any, ...]],
        resource_version: str | None = None,
    ) -> None:
        """The claim's prepared devices, (device name, data, binding conditions, failure,
        shareID) each; empty clears them. ``resource_version``: the claim's version as
        read for this prepare (the writer skips what the API server already holds)."""
        ...

    def binding_failed(
        self, ref: ClaimRef, devices: Sequence[tuple[Any, ...]], message: str
    ) -> None:
        """Preparing before binding failed: set these devices' binding failure conditions,
        (device name, condition types, shareID) each."""
        ...

    def prepare_failed(self, ref: ClaimRef, message: str) -> None:
        """A claim could not be prepared; ``message`` says why."""
        ...


#: Told when a claim failed before binding because of its GPUs (creating MIG devices failed,
#: or no MIG placement was free): the GPUs' UUIDs, why.
GpuProblem = Callable[[tuple[str, ...], str], None]


def _conditions(claim: ClaimToPrepare, key: str) -> dict[str, list[str]]:
    """Device name -> the allocation's ``bindingConditions`` (or failure conditions)."""
    return {str(r.get("device")): list(r.get(key) or []) for r in claim.results}


class GpuDriver:
    """Implements the kubelet plugin's ``Driver`` protocol over a :class:`DeviceState`.

    Prepare and unprepare fsync files. A batch that only writes files (CDI specs, the
    journal) runs on the loop while such batches stay short; the rest (MIG devices, sharing
    steps, and everything once the disk was slow) runs in a worker thread, and a cancelled
    call still waits for its thread, so the node lock is never released early.
    With a ``reporter``, prepared devices appear in the claims' status and failures as events.
    """

    def __init__(
        self,
        state: DeviceState,
        reporter: ClaimStatus | None = None,
        on_carve_failed: GpuProblem | None = None,
        on_no_placement: GpuProblem | None = None,
    ) -> None:
        self.state = state
        self.reporter = reporter
        self.on_carve_failed = on_carve_failed
        self.on_no_placement = on_no_placement
        self._short = InlineRunner()
        # The claims a previous run prepared: counted from the start, not the first call.
        metrics.PREPARED_CLAIMS.set(state.prepared_count())

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """Prepare a batch of claims."""
        started = time.perf_counter()
        run = self._short.run if self.state.quick_prepare(claims) else run_blocking
        results = await run(self.state.prepare, claims)
        metrics.observe_batch(metrics.PREPARE_SECONDS, started, dict(results))
        metrics.PREPARED_CLAIMS.set(self.state.prepared_count())
        if self.reporter is not None:
            for claim in claims:
                outcome = results.get(claim.ref.uid)
                if isinstance(outcome, Exception):
                    self.reporter.prepare_failed(claim.ref, str(outcome))
                elif outcome is not None:
                    self._report_prepared(self.reporter, claim)
        return results

    def _report_prepared(self, reporter: ClaimStatus, claim: ClaimToPrepare) -> None:
        # Prepared is what every binding condition of this driver waits for.
        binding = _conditions(claim, "bindingConditions")
        reporter.set_devices(
            claim.ref,
            [
                (name, {"uuid": uuid}, binding.get(name, []), None, share_id)
                for name, uuid, share_id in self.state.device_ids(claim.ref.uid)
            ],
            (claim.claim.get("metadata") or {}).get("resourceVersion"),
        )

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        """Prepare a claim the scheduler waits for (binding conditions) and set its
        conditions: all True, or on failure its failure conditions, so the scheduler
        deallocates it and schedules the pod again."""
        await self._release_earlier_allocation(claim)
        started = time.perf_counter()
        results = await run_blocking(self.state.prepare, [claim], True)
        metrics.observe_batch(metrics.PREPARE_SECONDS, started, dict(results))
        metrics.PREPARED_CLAIMS.set(self.state.prepared_count())
        outcome = results.get(claim.ref.uid)
        if isinstance(outcome, CarveError) and self.on_carve_failed is not None:
            self.on_carve_failed(outcome.gpus, str(outcome))
        if isinstance(outcome, NoPlacementError) and self.on_no_placement is not None:
            self.on_no_placement(outcome.gpus, str(outcome))
        if self.reporter is None:
            return
        if isinstance(outcome, Exception) or outcome is None:
            message = str(outcome) if outcome is not None else "no result"
            failures = [
                (
                    str(r.get("device")),
                    list(r.get("bindingFailureConditions") or []),
                    r.get("shareID"),
                )
                for r in claim.results
            ]
            self.reporter.binding_failed(claim.ref, failures, message)
            self.reporter.prepare_failed(claim.ref, message)
        else:
            self._report_prepared(self.reporter, claim)

    async def _release_earlier_allocation(self, claim: ClaimToPrepare) -> None:
        """Undo what was prepared before binding for an earlier allocation of ``claim``.

        A claim deallocated and allocated again between two of the watcher's views (the
        same devices, new shares of them) still has the first allocation's preparation,
        which the watcher's view of device names cannot tell apart; answered from it, its
        status would name shares that are no longer the claim's, which the API server
        refuses, and the scheduler would wait out its binding timeout. A failed release is
        raised (the watcher sets the claim's failure conditions)."""
        early = await run_blocking(self.state.prepared_before_binding)
        if claim.ref.uid not in early:
            return
        recorded = sorted((n, s or "") for n, _, s in self.state.device_ids(claim.ref.uid))
        wanted = sorted((str(r.get("device")), str(r.get("shareID") or "")) for r in claim.results)
        if recorded == wanted:
            return
        log.info(
            "unpreparing a claim prepared before binding for an earlier allocation",
            claim=str(claim.ref),
            claim_uid=claim.ref.uid,
            recorded=recorded,
            allocated=wanted,
        )
        outcome = (await self.unprepare([claim.ref])).get(claim.ref.uid)
        if isinstance(outcome, Exception):
            raise outcome

    async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
        """Unprepare what was prepared before binding for a claim that is no longer
        allocated those devices (deallocated by the scheduler, deleted): no pod ran. An
        unprepare that failed is raised, after the others were done (the watcher calls again)."""
        early = await run_blocking(self.state.prepared_before_binding)
        stale = [ref for uid, (ref, names) in early.items() if claims.get(uid) != names]
        if stale:
            log.info(
                "unpreparing claims prepared before binding: no longer allocated",
                claims=[str(r) for r in stale],
            )
            results = await self.unprepare(stale)
            failed = [str(e) for e in results.values() if isinstance(e, Exception)]
            if failed:
                raise ClaimError("; ".join(failed))

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Unprepare a batch of claims."""
        started = time.perf_counter()
        run = self._short.run if self.state.quick_unprepare(claims) else run_blocking
        results = await run(self.state.unprepare, claims)
        metrics.observe_batch(metrics.UNPREPARE_SECONDS, started, dict(results))
        metrics.PREPARED_CLAIMS.set(self.state.prepared_count())
        if self.reporter is not None:
            for ref in claims:
                if results.get(ref.uid) is None:
                    self.reporter.set_devices(ref, [])
        return results
