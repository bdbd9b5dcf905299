"""What the driver tells the API server about claims: device status and failure events.

Writes happen in the background so they never add to prepare latency. Device status goes
through server-side apply on the status subresource with this driver as field manager: the
API server merges our entries by (driver, pool, device) and leaves other drivers' entries
alone, so there is no read-modify-write and no conflict to retry. It cannot apply it to a
claim whose allocation carries opaque parameters spelled otherwise than it would spell them
(:mod:`dra_driver.rawstatus`): such a claim's status is written by update of the whole status.
A write that fails for a reason that may pass (the API server unreachable, 5xx, a conflict)
is tried again with a backoff for as long as the claim stands, without holding up the other
claims' writes. Later updates of one claim replace earlier ones that have not been written
yet, and an update the API server already holds (the claim is still at the version our last
write of the same devices left it, as when the kubelet prepares a claim again after a
restart, or a pod's claim is prepared again right after its unprepare) is not written at
all.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import structlog

from dra_driver import rawstatus, resourceapi
from dra_driver.events import post_event
from dra_driver.kube import KubeClient, server_side_apply
from dra_driver.kubeletplugin.interfaces import ClaimRef

log = structlog.get_logger(__name__)

WRITE_DELAY = 0.5
#: A write that failed for a reason that may pass (the API server down or restarting, a
#: conflict) is tried again after a backoff doubling from 0.2 s up to this: a claim's status
#: is never given up on while the claim stands, since a pod waiting for its binding
#: conditions would wait out the scheduler's binding timeout (10 minutes) instead.
MAX_BACKOFF = 30.0
#: Failed attempts of one claim's write before a warning says it is still being tried.
WARN_AFTER = 6
#: Seconds before the same prepare failure of a claim is posted as an Event again: the
#: kubelet retries a failed prepare every few seconds while the pod waits.
EVENT_REPEAT = 600.0


class DeviceStatus(NamedTuple):
    """One device of a claim: its name and the data to publish (e.g. the GPU UUID)."""

    device: str
    data: Mapping[str, Any]
    #: The binding conditions its allocation waits for: True, since it is prepared.
    binding: Sequence[str] = ()
    #: Preparing it failed: its binding failure conditions (set True) and why.
    failure: tuple[Sequence[str], str] | None = None
    #: One of several allocations of the device: the allocation's shareID (the API server
    #: accepts the status of such a device only under it).
    share_id: str | None = None


def _condition(kind: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def _conditions(d: DeviceStatus, now: str) -> list[dict[str, str]]:
    if d.failure is not None:
        kinds, message = d.failure
        return [_condition(k, "PrepareFailed", message[:1000], now) for k in kinds]
    prepared = "prepared on the node; CDI spec written"
    return [_condition(k, "Prepared", prepared, now) for k in ("Ready", *d.binding)]


def status_body(
    ref: ClaimRef, driver: str, pool: str, devices: Sequence[DeviceStatus], now: str
) -> dict[str, Any]:
    """The apply configuration for a claim's ``status.devices`` (empty list clears ours)."""
    return {
        "apiVersion": resourceapi.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "status": {
            "devices": [
                {
                    "driver": driver,
                    "pool": pool,
                    "device": d.device,
                    **({"shareID": d.share_id} if d.share_id else {}),
                    "conditions": _conditions(d, now),
                    "data": dict(d.data),
                }
                for d in devices
            ]
        },
    }


class _Retry(NamedTuple):
    timer: asyncio.TimerHandle
    ref: ClaimRef
    devices: list[DeviceStatus]


class ClaimReporter:
    """Background writer of claim device status and prepare-failure events."""

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        pool: str,
        delay: float = WRITE_DELAY,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        """``client`` is owned by the caller; ``pool`` is the pool of this node's devices.

        Writes wait ``delay`` seconds, so a claim unprepared right after its prepare (pod
        churn) costs the API server nothing at all; a failed write is tried again after a
        backoff of up to ``max_backoff`` seconds, for as long as the claim stands.
        """
        self._client = client
        self._delay = delay
        self._max_backoff = max_backoff
        self._driver = driver
        self._pool = pool
        self._pending: dict[str, tuple[ClaimRef, list[DeviceStatus]]] = {}
        #: Per claim UID, the resourceVersion our last write left and the devices it wrote;
        #: only while those devices stand (a clear, a failed write or a 404 drops the entry),
        #: so it holds at most the claims prepared on this node.
        self._written: dict[str, tuple[str, list[DeviceStatus]]] = {}
        #: Claims whose devices the API server may show: a write of devices was sent (it
        #: may have landed even when its answer was lost) and no clear has been written
        #: since. A clear for one of these is always written.
        self._shown: set[str] = set()
        #: Claims whose status the API server refuses to apply over their allocation's opaque
        #: parameters: written by update instead, until cleared or gone.
        self._by_update: set[str] = set()
        #: Per claim UID, the write that failed and waits for its next attempt, and how many
        #: attempts have failed in a row (the backoff); a newer update replaces the write.
        self._retries: dict[str, _Retry] = {}
        self._failures: dict[str, int] = {}
        #: Claims whose write is awaiting the API server's answer (in neither queue).
        self._writing: set[str] = set()
        #: (claim UID, message) -> when its Event was posted, for those within EVENT_REPEAT.
        self._events: dict[tuple[str, str], float] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    def set_devices(
        self,
        ref: ClaimRef,
        devices: Sequence[tuple[Any, ...]],
        resource_version: str | None = None,
    ) -> None:
        """Publish the claim's prepared devices, (device name, data[, binding conditions[,
        failure[, shareID]]]) each (an empty list clears them); a driver passes plain tuples
        and needs nothing from this module.

        ``resource_version`` is the claim's version as the caller read it, after any write
        of ours it could have seen: when it is the version our last write of these same
        devices left, the API server holds them and nothing is written (a clear still
        queued is dropped).
        """
        self._drop_retry(ref.uid)
        queued = self._pending.get(ref.uid)
        if not devices and queued is not None and queued[1] and ref.uid not in self._shown:
            # Cleared before its devices were written: the API server never saw them.
            del self._pending[ref.uid]
            return
        statuses = [DeviceStatus(*d) for d in devices]
        if (
            statuses
            and resource_version
            and self._written.get(ref.uid)
            == (
                resource_version,
                statuses,
            )
        ):
            self._pending.pop(ref.uid, None)
            return
        self._pending[ref.uid] = (ref, statuses)
        self._wake.set()

    def binding_failed(
        self, ref: ClaimRef, devices: Sequence[tuple[Any, ...]], message: str
    ) -> None:
        """Preparing the claim before binding failed: set each device's binding failure
        conditions, (device name, condition types[, shareID]) each, so the scheduler tries
        elsewhere."""
        self._drop_retry(ref.uid)
        self._pending[ref.uid] = (
            ref,
            [DeviceStatus(d[0], {}, (), (d[1], message), *d[2:]) for d in devices],
        )
        self._wake.set()

    @property
    def pending(self) -> int:
        """Claims whose status is waiting to be written (queued, being written, or to be
        tried again)."""
        return len(self._pending.keys() | self._retries.keys() | self._writing)

    def prepare_failed(self, ref: ClaimRef, message: str) -> None:
        """A Warning event on the claim, so ``kubectl describe`` shows why (the same failure
        once per :data:`EVENT_REPEAT`)."""
        now, key = time.monotonic(), (ref.uid, message)
        last = self._events.get(key)
        if last is not None and now - last < EVENT_REPEAT:
            return
        self._events = {k: t for k, t in self._events.items() if now - t < EVENT_REPEAT}
        self._events[key] = now
        task = asyncio.create_task(
            post_event(
                self._client,
                kind="ResourceClaim",
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
                reason="PrepareFailed",
                message=message,
                component=self._driver,
            )
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self, within: float) -> None:
        """Write what is pending now and wait for the events posted, for at most ``within``
        seconds (at shutdown, once the kubelet's calls are done and :meth:`run` is
        cancelled): a status set in the last moments still reaches the claim."""

        for uid in list(self._retries):  # their next attempt is now
            self._requeue(uid)

        async def write_all() -> None:
            while self._pending:
                uid = next(iter(self._pending))
                await self._apply(*self._pending.pop(uid))
            await asyncio.gather(*self._tasks, return_exceptions=True)

        try:
            await asyncio.wait_for(write_all(), within)
        except TimeoutError:
            log.warning("claim status not written before shutdown", claims=len(self._pending))

    async def run(self) -> None:
        """Write pending updates until cancelled."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._delay)
            self._wake.clear()
            # This round's updates; those queued while it writes wait a delay for the next,
            # so a claim unprepared and prepared again meanwhile is still one update.
            for uid in list(self._pending):
                queued = self._pending.pop(uid, None)
                if queued is None:
                    continue
                self._writing.add(uid)
                try:
                    failed = await self._apply(*queued)
                except asyncio.CancelledError:
                    # Stopped mid-write (shutdown): the update stays for flush to write.
                    self._pending.setdefault(uid, queued)
                    raise
                finally:
                    self._writing.discard(uid)
                if failed:
                    self._retry_later(*queued)

    def _retry_later(self, ref: ClaimRef, devices: list[DeviceStatus]) -> None:
        """Queue the write of ``devices`` again after this claim's backoff."""
        failures = self._failures.get(ref.uid, 0) + 1
        self._failures[ref.uid] = failures
        if failures == WARN_AFTER:
            log.warning(
                "claim status not written yet, still trying",
                claim=str(ref),
                claim_uid=ref.uid,
                attempts=failures,
            )
        backoff = min(self._max_backoff, 0.2 * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)
        timer = asyncio.get_running_loop().call_later(backoff, self._requeue, ref.uid)
        self._retries[ref.uid] = _Retry(timer, ref, devices)

    def _requeue(self, uid: str) -> None:
        """The next attempt of the claim's failed write is due: queue it."""
        retry = self._retries.pop(uid)
        retry.timer.cancel()  # when called before its time (at shutdown)
        self._pending[uid] = (retry.ref, retry.devices)
        self._wake.set()

    def _drop_retry(self, uid: str) -> None:
        """A newer update of the claim replaces the write waiting to be tried again."""
        retry = self._retries.pop(uid, None)
        if retry is not None:
            retry.timer.cancel()

    async def _apply(self, ref: ClaimRef, devices: list[DeviceStatus]) -> bool:
        """Write one update of a claim; True if it failed for a reason that may pass and no
        newer update of the claim came meanwhile (then the caller tries it again later)."""
        # Whatever stood is changing: until this write's answer, nothing may be skipped.
        self._written.pop(ref.uid, None)
        if devices:
            self._shown.add(ref.uid)
        status, text = await self._write(ref, devices)
        if not (200 <= status < 300 or status in (400, 403, 404, 422)):
            log.debug("claim status not written", claim=str(ref), status=status, error=text[:200])
            return ref.uid not in self._pending
        self._failures.pop(ref.uid, None)
        if 200 <= status < 300:
            version = _resource_version(text)
            if devices and version:
                self._written[ref.uid] = (version, devices)
            elif not devices:
                self._by_update.discard(ref.uid)
                self._shown.discard(ref.uid)
        elif status == 404:  # the claim is gone, nothing to report on
            self._by_update.discard(ref.uid)
            self._shown.discard(ref.uid)
        else:
            log.error("claim status rejected", claim=str(ref), status=status, error=_message(text))
        return False

    async def _write(self, ref: ClaimRef, devices: list[DeviceStatus]) -> tuple[int, str]:
        """One write of the claim's devices: the API server's status and answer (0 when it
        could not be reached)."""
        body = status_body(ref, self._driver, self._pool, devices, resourceapi.api_time())
        by_update = ref.uid in self._by_update
        try:
            if by_update:
                status, text = await self._update(ref, body["status"]["devices"])
            else:
                status, text = await self._server_side_apply(ref, body)
        except Exception as exc:  # connection trouble: tried again later
            return 0, str(exc)
        if not by_update and status in (403, 422) and "status.allocation" in text:
            # Our apply never names the allocation: the API server re-encoded its opaque
            # parameters (see rawstatus). Write this claim's status by update from now on.
            log.debug("claim status written by update from now on", claim=str(ref))
            self._by_update.add(ref.uid)
            return await self._write(ref, devices)
        return status, text

    async def _server_side_apply(self, ref: ClaimRef, body: dict[str, Any]) -> tuple[int, str]:
        path = resourceapi.path(
            resourceapi.RESOURCE_CLAIMS, ref.name, namespace=ref.namespace, subresource="status"
        )
        response = await server_side_apply(self._client, path, body, field_manager=self._driver)
        return response.status, response.body.decode("utf-8", "replace")

    async def _update(self, ref: ClaimRef, ours: list[dict[str, Any]]) -> tuple[int, str]:
        """Replace this driver's entries in the claim's ``status.devices`` by an update of
        the whole status, its opaque JSON spelled as stored (:mod:`dra_driver.rawstatus`).
        A conflict (409) means the claim changed meanwhile: the caller tries again."""
        path = resourceapi.path(resourceapi.RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
        as_json = await self._client.request("GET", path)
        if not as_json.ok:
            return as_json.status, as_json.body.decode("utf-8", "replace")
        claim = json.loads(as_json.body)
        if (claim.get("metadata") or {}).get("uid") != ref.uid:
            return 404, "another claim of the same name"
        as_protobuf = await self._client.request("GET", path, accept=rawstatus.PROTOBUF)
        if not as_protobuf.ok:
            return as_protobuf.status, as_protobuf.body.decode("utf-8", "replace")
        try:
            raw = rawstatus.stored_raw(as_protobuf.body)
            body = rawstatus.status_update(claim, raw, self._driver, self._pool, ours)
        except ValueError as exc:
            return 409, str(exc)
        response = await self._client.request(
            "PUT", f"{path}/status", query=[("fieldManager", self._driver)], body=body
        )
        return response.status, response.body.decode("utf-8", "replace")


def _resource_version(text: str) -> str | None:
    """The resourceVersion of the claim the API server answered a write with."""
    try:
        version = json.loads(text)["metadata"]["resourceVersion"]
    except (ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, str) else None


def _message(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text))[:500]
    except (ValueError, AttributeError):
        return text[:500]
