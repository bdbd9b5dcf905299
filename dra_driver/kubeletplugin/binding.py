"""Binding conditions: the driver prepares a claim before the scheduler binds its pod.

A device published with ``bindingConditions`` makes the scheduler wait, after allocating it
and before binding the pod, until each of those conditions is True in the claim's
``status.devices`` entry for the device; when one of its ``bindingFailureConditions`` is True
instead, the scheduler deallocates the claim and schedules the pod again. The watcher
follows the ResourceClaims (list, then watch), hands the driver each claim of this node's
pool that waits for it, and tells the driver which claims are allocated from the pool, so
that it can undo preparations whose claim was deallocated before any pod ran.

The decisions (:func:`waiting_devices`, :func:`allocated_devices`) are pure functions of a
claim; the watcher is the thin loop around them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import structlog

from dra_driver import resourceapi
from dra_driver.kubeletplugin.claims import claim_to_prepare
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.rawapi import RawApi
from dra_driver.resourceslice.reflector import Reflector
from dra_driver.resourceslice.reporting import ApiErrorReporter

JSON = dict[str, Any]
CLAIMS_PATH = resourceapi.path(resourceapi.RESOURCE_CLAIMS)

log = structlog.get_logger(__name__)


class BindingDriver(Protocol):
    """What the watcher needs from a driver."""

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        """Prepare ``claim`` and set its binding conditions (or its failure conditions)."""
        ...

    async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
        """Every claim allocated from this node's pool: UID -> device names (the whole
        view, after each change); preparations before binding of any other are undone."""
        ...


def _ours(claim: JSON, driver: str, pool: str) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        r
        for r in results
        if isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == pool
    ]


def allocated_devices(claim: JSON, driver: str, pool: str) -> frozenset[str]:
    """The devices of ``driver`` in ``pool`` allocated to the claim (empty: none)."""
    return frozenset(str(r.get("device")) for r in _ours(claim, driver, pool))


def _true(entry: JSON | None, kinds: list[Any]) -> list[bool]:
    conditions = (entry or {}).get("conditions") or []
    status = {c.get("type"): c.get("status") for c in conditions if isinstance(c, dict)}
    return [status.get(k) == "True" for k in kinds]


def waiting_devices(claim: JSON, driver: str, pool: str) -> frozenset[str]:
    """The claim's devices of this pool whose binding conditions wait for the driver: not
    all True yet and no failure condition True (then the scheduler is already moving on).
    Empty for a claim being deleted."""
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        return frozenset()
    entries = {
        (d.get("driver"), d.get("pool"), d.get("device")): d
        for d in (claim.get("status") or {}).get("devices") or []
        if isinstance(d, dict)
    }
    waiting = set()
    for result in _ours(claim, driver, pool):
        kinds = result.get("bindingConditions") or []
        if not kinds:
            continue
        entry = entries.get((driver, pool, result.get("device")))
        if any(_true(entry, result.get("bindingFailureConditions") or [])):
            continue
        if not all(_true(entry, kinds)):
            waiting.add(str(result.get("device")))
    return frozenset(waiting)


def _ref(claim: JSON) -> ClaimRef:
    meta = claim.get("metadata") or {}
    return ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta["uid"]))


def _allocated_at(claim: JSON) -> str:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return str(allocation.get("allocationTimestamp") or "")


class BindingWatcher:
    """Follows the cluster's ResourceClaims and prepares those that wait for this node."""

    def __init__(
        self,
        client: Any,
        driver: BindingDriver,
        *,
        driver_name: str,
        pool: str,
        locked: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]],
    ) -> None:
        """``locked(work)`` runs ``work`` under the node lock the kubelet's calls take."""
        self._driver = driver
        self._driver_name = driver_name
        self._pool = pool
        self._locked = locked
        self._log = log.bind(driver=driver_name, pool=pool)
        self._claims: dict[str, JSON] = {}  # UID -> claim, only those allocated from the pool
        self._listed = False
        self._changed = asyncio.Event()
        # (UID, allocation time, devices) handed to the driver: each allocation once.
        self._started: set[tuple[str, str, frozenset[str]]] = set()
        api = RawApi(client)
        self._reflector = Reflector(
            lambda: api.list_objects(CLAIMS_PATH, "resourceclaims"),
            lambda version, timeout: api.watch_objects(
                CLAIMS_PATH, "resourceclaims", "", version, timeout
            ),
            resource="resourceclaims",
            on_listed=self._on_listed,
            on_event=self._on_event,
            log=self._log,
            reporter=ApiErrorReporter(self._log),
        )

    def _keep(self, claim: JSON) -> None:
        uid = (claim.get("metadata") or {}).get("uid")
        if not uid:
            return
        if allocated_devices(claim, self._driver_name, self._pool):
            self._claims[str(uid)] = claim
        else:
            self._claims.pop(str(uid), None)

    def _on_listed(self, items: list[JSON]) -> None:
        self._claims.clear()
        for claim in items:
            self._keep(claim)
        self._listed = True
        self._changed.set()

    def _on_event(self, kind: str, claim: JSON) -> None:
        if kind == "DELETED":
            self._claims.pop(str((claim.get("metadata") or {}).get("uid")), None)
        else:
            self._keep(claim)
        self._changed.set()

    async def run(self) -> None:
        """Watch and act until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reflector.run(), name="claim-watch")
            group.create_task(self._act(), name="claim-binding")

    async def _act(self) -> None:
        seen: dict[str, frozenset[str]] | None = None
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self._listed:
                continue
            allocated = {
                uid: allocated_devices(c, self._driver_name, self._pool)
                for uid, c in self._claims.items()
            }
            if allocated != seen:
                seen = allocated
                await self._locked(functools.partial(self._driver.allocated, allocated))
            live = {(uid, _allocated_at(c), allocated[uid]) for uid, c in self._claims.items()}
            # Forget allocations that are over, so a new one of the same claim is handled.
            self._started &= live
            for uid, claim in list(self._claims.items()):
                waiting = waiting_devices(claim, self._driver_name, self._pool)
                key = (uid, _allocated_at(claim), allocated[uid])
                if waiting and key not in self._started:
                    self._started.add(key)
                    await self._prepare(claim, waiting)

    async def _prepare(self, claim: JSON, waiting: frozenset[str]) -> None:
        ref = _ref(claim)
        self._log.info(
            "preparing claim before binding",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=sorted(waiting),
        )
        try:
            checked = claim_to_prepare(ref, claim, self._driver_name, self._pool)
        except Exception as exc:  # a claim the API server accepted but we cannot read
            self._log.error("claim not preparable before binding", claim=str(ref), error=str(exc))
            return
        await self._locked(functools.partial(self._driver.prepare_before_binding, checked))
