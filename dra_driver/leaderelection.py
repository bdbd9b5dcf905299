"""Leader election on a coordination.k8s.io Lease: one replica of a controller acts at a time.

A candidate takes the Lease when it is free, expired or already its own, and renews it
while it works. A leader that cannot renew within the lease's duration, or finds another
replica holding it, stops acting (its work is cancelled): two controllers writing the same
objects is what the lease exists to prevent. A leader whose work ends (SIGTERM, a crash)
gives the lease up once the work has stopped, so the next one need not wait out the
duration. The choice of who may take the lease (:func:`may_take`) is a pure function of the
lease and the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog

from dra_driver.errors import DriverError
from dra_driver.kube import KubeClient, Response
from dra_driver.resourceslice.rawapi import ApiError, raise_for_status

JSON = dict[str, Any]
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

log = structlog.get_logger(__name__)

#: How long a leader that stops may spend giving its lease up (within the pod's 30 s grace).
RELEASE_WITHIN = 5.0


class LostLease(DriverError):
    """The leader could not renew its lease in time."""


def _micro_time(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def may_take(
    lease: JSON | None,
    identity: str,
    now: datetime.datetime,
    unchanged_for: float | None = None,
) -> bool:
    """Whether ``identity`` may hold the lease now: it is missing, unheld, its own, or its
    holder has not renewed it within its duration.

    ``unchanged_for`` (seconds this replica has seen the same lease record, by its own
    clock) replaces the comparison of ``now`` with the holder's renewTime: that one is
    written by another machine's clock, and skew between the two would end a live leader's
    term early (two leaders) or stretch a dead one's.
    """
    if lease is None:
        return True
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if not holder or holder == identity:
        return True
    renewed = _parse_time(spec.get("renewTime")) or _parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return True
    if unchanged_for is not None:
        return unchanged_for > duration
    return now > renewed + datetime.timedelta(seconds=duration)


def lease_spec(lease: JSON | None, identity: str, duration: int, now: datetime.datetime) -> JSON:
    """The spec ``identity`` writes to take or renew the lease."""
    spec = dict((lease or {}).get("spec") or {})
    taking = spec.get("holderIdentity") != identity
    spec.update(
        holderIdentity=identity,
        leaseDurationSeconds=duration,
        renewTime=_micro_time(now),
    )
    if taking:
        spec["acquireTime"] = _micro_time(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
    return spec


class LeaderElector:
    """Take a Lease, then run work while renewing it."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: int = 15,
        renew_deadline: float = 10.0,
        renew_every: float = 2.0,
        retry_every: float = 2.0,
    ) -> None:
        self._client = client
        self._collection = LEASES.format(namespace=quote(namespace, safe=""))
        self._name = name
        self._identity = identity
        self._duration = duration
        self._renew_deadline = min(renew_deadline, duration)
        self._renew_every = renew_every
        self._retry_every = retry_every
        #: The lease record last seen and when (loop clock) it was first seen so: expiry is
        #: judged by this replica's own clock only (client-go's observedTime).
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        #: The holder the last read of the lease named ("" when none or unread).
        self._holder = ""

    def _unchanged_for(self, lease: JSON | None) -> float:
        """Seconds this replica has seen ``lease`` exactly as it is now."""
        spec = (lease or {}).get("spec") or {}
        metadata = (lease or {}).get("metadata") or {}
        record = (
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            spec.get("acquireTime"),
            metadata.get("resourceVersion"),
        )
        now = asyncio.get_running_loop().time()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at

    async def _try(self) -> bool:
        """One attempt to take or renew the lease; True when it is ours."""
        path = f"{self._collection}/{quote(self._name, safe='')}"
        now = datetime.datetime.now(datetime.UTC)
        self._holder = ""
        response = await self._client.request("GET", path, timeout=10)
        lease: JSON | None = None
        if response.ok:
            lease = response.json()
            self._holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        elif response.status != 404:
            self._refused(response, "get")
            return False
        if not may_take(lease, self._identity, now, self._unchanged_for(lease)):
            return False
        spec = lease_spec(lease, self._identity, self._duration, now)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name},
                "spec": spec,
            }
            written = await self._client.request("POST", self._collection, body=body, timeout=10)
        else:
            body = {**lease, "spec": spec}
            written = await self._client.request("PUT", path, body=body, timeout=10)
        if not written.ok and written.status != 409:  # 409: someone else wrote it first
            self._refused(written, "update" if lease else "create")
        return written.ok

    def _refused(self, response: Response, verb: str) -> None:
        """Log a lease request the API server refused (403, 422, 5xx): one that is refused
        every time would otherwise keep this replica waiting, or stop a leader, unexplained
        (client-go logs each failed attempt too)."""
        try:
            raise_for_status(response, verb=verb, resource="leases", name=self._name)
        except ApiError as exc:
            log.warning(
                "lease request refused", lease=self._name, status=exc.status, error=str(exc)
            )

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Wait for the lease, then run ``work`` until it returns or the lease is lost
        (:class:`LostLease`)."""
        renewed = await self._acquire()
        log.info("leader", lease=self._name, identity=self._identity)
        task = asyncio.ensure_future(work())
        lost = False
        try:
            await self._renew_until(task, renewed)
        except LostLease:
            lost = True
            raise
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not lost:
                # Only once the work has stopped: the next leader then acts at once instead
                # of waiting out the duration (client-go's ReleaseOnCancel).
                await self._release()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def _acquire(self) -> float:
        """Poll until the lease is ours; the loop time the successful attempt started (no
        later than the renewTime it wrote)."""
        # Polling is the protocol: a lease has no watchable "free" event of its own.
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if await self._attempt():
                return started
            await asyncio.sleep(self._retry_every)

    async def _release(self) -> None:
        """Give the lease up if it is still ours (never another replica's: the write carries
        the version read, so one taken meanwhile refuses it with 409)."""
        path = f"{self._collection}/{quote(self._name, safe='')}"
        try:
            async with asyncio.timeout(RELEASE_WITHIN):
                response = await self._client.request("GET", path, timeout=RELEASE_WITHIN)
                lease = response.json() if response.ok else None
                spec = dict((lease or {}).get("spec") or {})
                if lease is None or spec.get("holderIdentity") != self._identity:
                    return
                now = _micro_time(datetime.datetime.now(datetime.UTC))
                # As client-go releases: no holder, a duration of 1 s.
                spec.update(
                    holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now
                )
                body = {**lease, "spec": spec}
                written = await self._client.request("PUT", path, body=body, timeout=RELEASE_WITHIN)
        except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("lease release failed", lease=self._name, error=str(exc))
            return
        if written.ok:
            log.info("released the lease", lease=self._name, identity=self._identity)
        else:
            log.warning("lease release refused", lease=self._name, status=written.status)

    async def _attempt(self) -> bool:
        try:
            return await self._try()
        except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("lease request failed", lease=self._name, error=str(exc))
            return False

    async def _renew_until(self, task: asyncio.Future[None], renewed: float) -> None:
        """Renew until ``task`` ends; ``renewed`` is when the last renewal started."""
        loop = asyncio.get_running_loop()
        while not task.done():
            await asyncio.wait({task}, timeout=self._renew_every)
            if task.done():
                return
            started = loop.time()
            ok = False
            # A stalled API server must not hold the check below past the deadline (each
            # request alone may take 10 s): the attempt gets only what is left of it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(renewed + self._renew_deadline - started, 0)):
                    ok = await self._attempt()
            if ok:
                # The lease's renewTime was taken after this, so it expires no earlier.
                renewed = started
            elif self._holder not in ("", self._identity):
                # Another replica took it (the lease deleted and made again, edited): it acts
                # already, so this one stops now, not at the renew deadline.
                log.error(
                    "another replica holds the lease, stopping",
                    lease=self._name,
                    identity=self._identity,
                    holder=self._holder,
                )
                raise LostLease(f"lease {self._name} is held by {self._holder}")
            elif loop.time() - renewed >= self._renew_deadline:
                # Stop before the lease runs out, so no other replica acts while this one does.
                log.error("lost the lease, stopping", lease=self._name, identity=self._identity)
                raise LostLease(f"lease {self._name} not renewed for {self._renew_deadline} s")
