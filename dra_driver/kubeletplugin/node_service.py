"""The logic behind NodePrepareResources and NodeUnprepareResources, free of gRPC types.

Every claim of a request gets exactly one outcome. Failures stay per claim: a missing or
replaced claim, an API error, or a driver exception affects that claim alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from dra_driver.errors import PrepareError
from dra_driver.kubeletplugin.claims import ClaimFetcher, claim_to_prepare
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    Driver,
    PreparedDevice,
    Readiness,
)
from dra_driver.kubeletplugin.lock import NodeLock
from dra_driver.kubeletplugin.threads import OTHER_CALLS
from dra_driver.kubeletplugin.uid import UID_SHAPE, valid_uid
from dra_driver.resourceapi import DNS_LABEL, DNS_SUBDOMAIN

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PrepareOutcome:
    """Result for one claim: devices on success, else a non-empty ``error``."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


#: Longest error message sent back for a claim (the kubelet shows it in the pod's events);
#: a message that quotes a huge config value is cut here.
MAX_ERROR = 1024


def error_text(exc: BaseException) -> str:
    """A message for an exception, never empty and at most :data:`MAX_ERROR` characters."""
    text = str(exc).strip() or type(exc).__name__
    if len(text) > MAX_ERROR:
        text = f"{text[:MAX_ERROR]}... ({len(text) - MAX_ERROR} more characters)"
    return text


def _bad_uid_error(uid: str) -> str:
    shown = uid if len(uid) <= 40 else f"{uid[:40]}... ({len(uid)} characters)"
    return f"claim UID {shown!r} is not a Kubernetes UID ({UID_SHAPE})"


#: A namespace is a DNS label, a claim name a DNS subdomain (which rules out "" and "..").
_NAMESPACE = re.compile(DNS_LABEL)
_NAME = re.compile(DNS_SUBDOMAIN)


def _bad_name_error(ref: ClaimRef) -> str | None:
    """Why ``ref`` names no ResourceClaim the API server could hold, or None."""
    if (
        len(ref.namespace) <= 63
        and _NAMESPACE.fullmatch(ref.namespace)
        and len(ref.name) <= 253
        and _NAME.fullmatch(ref.name)
    ):
        return None
    shown = [v if len(v) <= 64 else f"{v[:64]}..." for v in (ref.namespace, ref.name)]
    return (
        f"claim {ref.uid}: namespace {shown[0]!r} and name {shown[1]!r} are "
        "not a ResourceClaim namespace and name"
    )


def _by_uid_shape(claims: Sequence[ClaimRef]) -> tuple[list[ClaimRef], list[ClaimRef]]:
    """The distinct claims, split into those with a valid UID and the others."""
    valid: list[ClaimRef] = []
    invalid: list[ClaimRef] = []
    for ref in _unique(claims):
        (valid if valid_uid(ref.uid) else invalid).append(ref)
    return valid, invalid


def _unique(claims: Sequence[ClaimRef]) -> list[ClaimRef]:
    # The response is keyed by UID, so a claim listed twice is handled once.
    seen: dict[str, ClaimRef] = {}
    for ref in claims:
        seen.setdefault(ref.uid, ref)
    return list(seen.values())


_Results = Mapping[str, Any]


@dataclass(eq=False)
class _Waiter:
    kind: str  # "prepare" or "unprepare"
    items: Sequence[Any]
    result: asyncio.Future[_Results] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class _Coalescer:
    """Runs driver calls one at a time under the node lock, merging calls that queue up.

    Each driver call fsyncs the checkpoint once or twice, whatever the batch size; while one
    call runs, the calls waiting behind it are merged into one batch. A call of the kind
    ``overtakes`` (unprepare) also joins a batch ahead of calls of the other kind queued
    before it, unless one of them names the same claim; the other kind (prepare) never runs
    ahead of a call queued before it. So freeing devices may come earlier than asked, taking
    them never does (a prepare of a device an earlier unprepare frees would fail), and every
    claim's calls run in the order they came.
    If the call that runs a batch is cancelled (its caller's deadline), the others of the batch
    find their result unset when they get the lock and run their own claims, still in their
    places in the queue. A call answered by another's batch returns without the lock.
    """

    def __init__(
        self,
        lock: NodeLock,
        calls: Mapping[str, Callable[[list[Any]], Awaitable[_Results]]],
        key: Mapping[str, Callable[[Any], str]],
        overtakes: str,
    ) -> None:
        self._lock = lock
        self._calls = calls
        self._key = key
        self._overtakes = overtakes
        self._queue: list[_Waiter] = []

    async def run(self, kind: str, items: Sequence[Any]) -> _Results:
        me = _Waiter(kind, items)
        self._queue.append(me)
        try:
            # The usual call: nobody to be batched by. A free lock alone is not enough: a
            # call queued before us may not have begun waiting for it yet, and taking it
            # here would run us ahead of that call.
            if len(self._queue) == 1 and not self._lock.locked():
                return await self._turn(me)
            # Queued behind others: a batch that takes this call along answers it before the
            # lock comes round (an unprepare runs ahead of prepares queued before it), and
            # the answer must not wait for them.
            turn = asyncio.ensure_future(self._turn(me))
            try:
                await asyncio.wait({turn, me.result}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not turn.done():
                    # Answered, or our caller is gone: leave the queue (no batch may take
                    # a call nobody waits for) and stop waiting for the lock; cancelling
                    # that wait (or our own batch) never leaves the lock held.
                    if me in self._queue:
                        self._queue.remove(me)
                    turn.cancel()
                    await asyncio.gather(turn, return_exceptions=True)
            return me.result.result() if me.result.done() else turn.result()
        finally:
            if me in self._queue:
                self._queue.remove(me)

    async def _turn(self, me: _Waiter) -> _Results:
        """Under the lock: ``me``'s result if a batch already gave it, else run its batch."""
        kind = me.kind
        try:
            async with self._lock.hold():
                if me.result.done():
                    return me.result.result()
                batch = self._batch(me)
                merged: dict[str, Any] = {}
                for waiter in batch:
                    for item in waiter.items:
                        merged.setdefault(self._key[kind](item), item)
                results = await self._calls[kind](list(merged.values()))
                # Only now do the others leave the queue: if this call is cancelled, they
                # keep their places, so no later call of the other kind runs ahead of them.
                self._queue = [w for w in self._queue if w not in batch]
                for waiter in batch[1:]:
                    if not waiter.result.done():
                        waiter.result.set_result(results)
                return results
        finally:
            # Out of the queue as the lock is released, before the next holder batches.
            if me in self._queue:
                self._queue.remove(me)

    def _batch(self, me: _Waiter) -> list[_Waiter]:
        """``me`` and the queued calls that run with it (see the class)."""
        batch = [me]
        passed: set[str] = set()  # claims of the other kind's calls the batch runs ahead of
        for other in self._queue:
            if other is me or other.result.done():
                continue
            if other.kind != me.kind:
                if me.kind != self._overtakes:
                    break
                passed.update(self._key[other.kind](item) for item in other.items)
            elif not passed or passed.isdisjoint(self._key[me.kind](i) for i in other.items):
                batch.append(other)
        return batch


class NodeService:
    """Fetches and checks claims, then calls the driver under the node lock.

    A driver that is a ``Readiness`` and not ready yet holds the calls before they take the
    lock: one held under it would keep the driver from loading the state it waits for.
    """

    def __init__(
        self,
        driver: Driver,
        fetcher: ClaimFetcher,
        lock: NodeLock,
        driver_name: str,
        node_name: str,
        pool_name: str | None,
    ) -> None:
        """``pool_name`` selects the allocation results to prepare (``None``: any pool)."""
        self._driver = driver
        self._fetcher = fetcher
        self._lock = lock
        self._driver_name = driver_name
        self._node = node_name
        self._pool = pool_name
        self._in_progress = 0  # prepare and unprepare calls between their start and answer
        # The driver to wait for before taking the lock; None once it is ready (or if it is
        # always ready), so a call then costs one attribute check.
        self._not_ready: Readiness | None = (
            driver if isinstance(driver, Readiness) and not driver.ready else None
        )
        self._batches = _Coalescer(
            lock,
            {"prepare": self._driver_prepare, "unprepare": self._driver_unprepare},
            {"prepare": lambda c: c.ref.uid, "unprepare": lambda r: r.uid},
            overtakes="unprepare",
        )

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare each claim; the result has one entry per distinct claim UID."""
        with self._in_progress_call():
            return await self._prepare(claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim; maps claim UID to an error message (empty on success).

        A UID that is not a Kubernetes UID was never prepared: unpreparing it succeeds.
        """
        with self._in_progress_call():
            return await self._unprepare(claims)

    @contextlib.contextmanager
    def _in_progress_call(self) -> Iterator[None]:
        """Count a call of the kubelet while it is in progress (see ``OTHER_CALLS``)."""
        self._in_progress += 1
        try:
            yield
        finally:
            self._in_progress -= 1

    async def _prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        refs, invalid = _by_uid_shape(claims)
        outcomes = {ref.uid: PrepareOutcome(error=_bad_uid_error(ref.uid)) for ref in invalid}
        for ref in invalid:
            log.error("prepare refused", claim=str(ref), error=outcomes[ref.uid].error)
        if len(refs) == 1:  # the usual call: its claim is read without a task of its own
            checked = [await self._fetch(refs[0])]
        else:
            checked = await asyncio.gather(*(self._fetch(ref) for ref in refs))
        ready: list[ClaimToPrepare] = []
        for ref, item in zip(refs, checked, strict=True):
            if isinstance(item, ClaimToPrepare):
                ready.append(item)
            else:
                outcomes[ref.uid] = PrepareOutcome(error=item)
        if ready:
            results = await self._call_prepare(ready)
            for item in ready:
                outcomes[item.ref.uid] = self._prepare_outcome(item.ref, results.get(item.ref.uid))
        return outcomes

    async def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        refs, invalid = _by_uid_shape(claims)
        errors = {ref.uid: "" for ref in invalid}
        for ref in invalid:
            log.warning("unprepare of an invalid claim UID: nothing to do", claim=str(ref))
        if not refs:
            return errors
        if self._not_ready is not None:
            await self._until_ready(self._not_ready)
        results = await self._batches.run("unprepare", refs)
        for ref in refs:
            if ref.uid not in results:
                errors[ref.uid] = "driver returned no result for this claim"
            else:
                result = results[ref.uid]
                errors[ref.uid] = "" if result is None else error_text(result)
            if errors[ref.uid]:
                log.error(
                    "unprepare failed",
                    claim=str(ref),
                    claim_uid=ref.uid,
                    node=self._node,
                    error=errors[ref.uid],
                )
            else:
                # The driver logs the details; this layer only confirms at debug level.
                log.debug("claim unprepared", claim=str(ref), claim_uid=ref.uid, node=self._node)
        return errors

    async def _fetch(self, ref: ClaimRef) -> ClaimToPrepare | str:
        """The checked claim, or the error message for it."""
        bad_name = _bad_name_error(ref)
        if bad_name is not None:
            log.error("prepare refused", claim=str(ref), claim_uid=ref.uid, error=bad_name)
            return bad_name
        try:
            claim = await self._fetcher.get_claim(ref.namespace, ref.name)
            return claim_to_prepare(ref, claim, self._driver_name, self._pool)
        except PrepareError as exc:
            message = error_text(exc)
        except Exception as exc:
            message = f"fetching ResourceClaim {ref}: {error_text(exc)}"
        log.error(
            "claim not preparable",
            claim=str(ref),
            claim_uid=ref.uid,
            node=self._node,
            error=message,
        )
        return message

    async def _call_prepare(
        self, ready: Sequence[ClaimToPrepare]
    ) -> Mapping[str, Sequence[PreparedDevice] | Exception]:
        if self._not_ready is not None:
            await self._until_ready(self._not_ready)
        return await self._batches.run("prepare", ready)

    async def _until_ready(self, driver: Readiness) -> None:
        """Wait, without the lock, until ``driver`` serves calls.

        A call cancelled here (its deadline) has not queued for the lock: it leaves nothing.
        """
        await driver.wait_ready()
        self._not_ready = None

    async def _driver_prepare(
        self, ready: list[ClaimToPrepare]
    ) -> Mapping[str, Sequence[PreparedDevice] | Exception]:
        """One driver call for a batch (under the node lock); failures become per-claim."""
        others = OTHER_CALLS.set(self._in_progress - 1)
        try:
            return await self._driver.prepare(ready)
        except Exception as exc:
            log.exception("driver prepare failed", node=self._node, claims=len(ready))
            return dict.fromkeys((c.ref.uid for c in ready), exc)
        finally:
            OTHER_CALLS.reset(others)

    async def _driver_unprepare(self, refs: list[ClaimRef]) -> Mapping[str, Exception | None]:
        """One driver call for a batch (under the node lock); failures become per-claim."""
        others = OTHER_CALLS.set(self._in_progress - 1)
        try:
            return await self._driver.unprepare(refs)
        except Exception as exc:
            log.exception("driver unprepare failed", node=self._node, claims=len(refs))
            return dict.fromkeys((r.uid for r in refs), exc)
        finally:
            OTHER_CALLS.reset(others)

    def _prepare_outcome(
        self, ref: ClaimRef, result: Sequence[PreparedDevice] | Exception | None
    ) -> PrepareOutcome:
        if result is None:
            outcome = PrepareOutcome(error="driver returned no result for this claim")
        elif isinstance(result, Exception):
            outcome = PrepareOutcome(error=error_text(result))
        else:
            outcome = PrepareOutcome(devices=tuple(result))
        if outcome.error:
            log.error(
                "prepare failed",
                claim=str(ref),
                claim_uid=ref.uid,
                node=self._node,
                error=outcome.error,
            )
        else:
            log.debug(
                "claim prepared",
                claim=str(ref),
                claim_uid=ref.uid,
                node=self._node,
                devices=[d.device_name for d in outcome.devices],
            )
        return outcome
