"""Binding conditions: the driver prepares a claim before the scheduler binds its pod.

A device published with ``bindingConditions`` makes the scheduler wait, after allocating it
and before binding the pod, until each of those conditions is True in the claim's
``status.devices`` entry for the device; when one of its ``bindingFailureConditions`` is True
instead, the scheduler deallocates the claim and schedules the pod again. The watcher
follows the ResourceClaims (list, then watch), hands the driver each claim of this node's
pool that waits for it, and tells the driver which claims are allocated from the pool, so
that it can undo preparations whose claim was deallocated before any pod ran.

A claim the watcher cannot hand over (its allocation cannot be read, or the driver raised)
gets its devices' failure conditions set right here, so the scheduler moves on at once
instead of waiting out its binding timeout. When the API server is what failed (away,
overloaded: :func:`transient`), the claim is tried again with back-off instead: the claim
is fine, and a failure would only send its pod round the scheduler.

The decisions (:func:`waiting_devices`, :func:`allocated_devices`, :func:`failure_status`)
are pure functions of a claim; the watcher is the thin loop around them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp
import structlog

from dra_driver import resourceapi
from dra_driver.kube import server_side_apply
from dra_driver.kubeletplugin.claims import claim_to_prepare
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, ApiError, RawApi
from dra_driver.resourceslice.reflector import Reflector
from dra_driver.resourceslice.reporting import ApiErrorReporter, describe

JSON = dict[str, Any]
CLAIMS_PATH = resourceapi.path(resourceapi.RESOURCE_CLAIMS)
#: Seconds before a claim is tried again after the API server failed; doubles up to the cap.
#: The scheduler gives up on a claim after 10 minutes, which ends the retries with it.
RETRY_DELAY = 1.0
RETRY_CAP = 30.0
#: Deadline of one status write (the loop waits for it).
WRITE_TIMEOUT = 10.0

log = structlog.get_logger(__name__)


class BindingDriver(Protocol):
    """What the watcher needs from a driver."""

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        """Prepare ``claim`` and set its binding conditions (or its failure conditions)."""
        ...

    async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
        """Every claim allocated from this node's pool: UID -> device names (the whole
        view, after each change); preparations before binding of any other are undone.
        Raising makes the watcher hand the same view over again a second later."""
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


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the API server was away or overloaded (try again later), rather
    than that the claim cannot be prepared."""
    if isinstance(exc, ApiError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError)


def failure_status(
    claim: JSON, driver: str, pool: str, devices: frozenset[str], message: str, now: str
) -> JSON | None:
    """The apply configuration that sets the binding failure conditions of ``devices``
    (those that have some) in the claim's ``status.devices``; None when none has any. A
    device allocated with a shareID gets one entry per share, under its shareID (the API
    server accepts the status of such a device only under it)."""
    entries: dict[tuple[str, str | None], JSON] = {}
    for result in _ours(claim, driver, pool):
        device = str(result.get("device"))
        share = str(result["shareID"]) if result.get("shareID") else None
        kinds = [str(k) for k in result.get("bindingFailureConditions") or []]
        if device not in devices or not kinds or (device, share) in entries:
            continue
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": "PrepareFailed",
                "message": message[:1000],
                "lastTransitionTime": now,
            }
            for kind in kinds
        ]
        entries[device, share] = {
            "driver": driver,
            "pool": pool,
            "device": device,
            **({"shareID": share} if share else {}),
            "conditions": conditions,
        }
    if not entries:
        return None
    meta = claim.get("metadata") or {}
    return {
        "apiVersion": resourceapi.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
        "status": {"devices": list(entries.values())},
    }


def _ref(claim: JSON) -> ClaimRef:
    meta = claim.get("metadata") or {}
    return ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta["uid"]))


def _allocated_at(claim: JSON) -> str:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return str(allocation.get("allocationTimestamp") or "")


#: One allocation of one claim: UID, allocation time, devices of this pool.
Key = tuple[str, str, frozenset[str]]


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
        self._client = client
        self._log = log.bind(driver=driver_name, pool=pool)
        self._claims: dict[str, JSON] = {}  # UID -> claim, only those allocated from the pool
        self._listed = False
        self._changed = asyncio.Event()
        # (UID, allocation time, devices) handed to the driver: each allocation once.
        self._started: set[Key] = set()
        # Allocations the API server failed for: attempts so far; those waiting out their
        # back-off are in ``_backoff`` until their timer runs.
        self._attempts: dict[Key, int] = {}
        self._backoff: set[Key] = set()
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
        failures = 0  # driver.allocated() failures in a row
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self._listed:
                continue
            # One view for the whole round: the reflector changes ``_claims`` at every await
            # below, and each change sets ``_changed``, so the next round sees it.
            claims = dict(self._claims)
            allocated = self._allocated()
            if allocated != seen:
                try:
                    seen, failures = await self._hand_over(), 0
                except Exception as exc:
                    # The driver's undo of a deallocated claim failed (the API server, the
                    # disk): watching goes on, and the same claims are handed over again.
                    delay = min(RETRY_CAP, RETRY_DELAY * 2**failures)
                    failures += 1
                    self._log.warning(
                        "the driver failed to handle the allocated claims, will retry",
                        error=str(exc) or type(exc).__name__,
                        attempt=failures,
                        retry_in=delay,
                    )
                    asyncio.get_running_loop().call_later(delay, self._changed.set)
            live = {(uid, _allocated_at(c), allocated[uid]) for uid, c in claims.items()}
            # Forget allocations that are over, so a new one of the same claim is handled.
            self._started &= live
            self._backoff &= live
            self._attempts = {k: n for k, n in self._attempts.items() if k in live}
            for uid, claim in claims.items():
                if self._claims.get(uid) is not claim:
                    continue  # changed (or gone) since the round began: the next one has it
                waiting = waiting_devices(claim, self._driver_name, self._pool)
                key = (uid, _allocated_at(claim), allocated[uid])
                if not waiting or key in self._started or key in self._backoff:
                    continue
                failed = await self._prepare(claim, waiting)
                if failed is None:
                    self._started.add(key)
                    self._attempts.pop(key, None)
                else:
                    self._retry_later(key, claim, failed)

    def _allocated(self) -> dict[str, frozenset[str]]:
        return {
            uid: allocated_devices(c, self._driver_name, self._pool)
            for uid, c in self._claims.items()
        }

    async def _hand_over(self) -> dict[str, frozenset[str]]:
        """Tell the driver the allocated claims as they are once the node lock is held (a
        claim allocated and prepared by the kubelet while this waited for it is in the
        view, which a view taken before would undo); returns the view told."""
        told: dict[str, frozenset[str]] = {}

        async def current() -> None:
            told.update(self._allocated())
            await self._driver.allocated(dict(told))

        await self._locked(current)
        return told

    def _retry_later(self, key: Key, claim: JSON, error: str) -> None:
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        delay = min(RETRY_CAP, RETRY_DELAY * 2**attempt)
        self._backoff.add(key)
        self._log.warning(
            "the API server failed a claim waiting for binding, will retry",
            claim=str(_ref(claim)),
            error=error,
            attempt=attempt + 1,
            retry_in=delay,
        )
        asyncio.get_running_loop().call_later(delay, self._retry_now, key)

    def _retry_now(self, key: Key) -> None:
        self._backoff.discard(key)
        self._changed.set()

    async def _prepare(self, claim: JSON, waiting: frozenset[str]) -> str | None:
        """Prepare the claim, or set its failure conditions; or return how the API server
        failed (then it is tried again later)."""
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
            return await self._fail(claim, waiting, str(exc))
        try:
            await self._locked(functools.partial(self._driver.prepare_before_binding, checked))
        except Exception as exc:  # the driver sets conditions itself; it raised instead
            if transient(exc):
                return str(exc)
            self._log.exception("preparing before binding failed", claim=str(ref))
            return await self._fail(claim, waiting, f"preparing failed: {exc}")
        return None

    async def _fail(self, claim: JSON, waiting: frozenset[str], message: str) -> str | None:
        """Set the failure conditions of the waiting devices, so the scheduler deallocates
        the claim and tries again; or return how the API server failed."""
        ref = _ref(claim)
        body = failure_status(
            claim, self._driver_name, self._pool, waiting, message, resourceapi.api_time()
        )
        if body is None:
            self._log.error(
                "no binding failure conditions to set: the scheduler waits for its timeout",
                claim=str(ref),
            )
            return None
        path = resourceapi.path(
            resourceapi.RESOURCE_CLAIMS, ref.name, namespace=ref.namespace, subresource="status"
        )
        try:
            response = await server_side_apply(
                self._client, path, body, field_manager=self._driver_name, timeout=WRITE_TIMEOUT
            )
        except CONNECTION_ERRORS as exc:
            return f"setting the binding failure conditions: {describe(exc)}"
        if response.status == 429 or response.status >= 500:
            return f"setting the binding failure conditions: HTTP {response.status}"
        if not response.ok and response.status not in (404, 409):  # 404, 409: gone, replaced
            self._log.error(
                "binding failure conditions rejected",
                claim=str(ref),
                status=response.status,
                error=response.body.decode("utf-8", "replace")[:500],
            )
        return None
