"""List once, then watch: an in-memory view of one kind of API object that never polls.

The reflector lists the objects, hands them over, then follows a watch (with bookmarks) from
the list's resourceVersion and hands over each event. It lists again only when the watch
expired (410 Gone) or the connection was lost, backing off while the API server is away.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dra_driver.resourceslice.backoff import Backoff, pause
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, ApiError
from dra_driver.resourceslice.reporting import ApiErrorReporter, describe
from dra_driver.resourceslice.store import is_older

JSON = dict[str, Any]

#: ValueError: a garbled watch stream; like a lost connection, the watch position is gone.
WATCH_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, ValueError)

Lister = Callable[[], Awaitable[JSON]]
Watcher = Callable[[str, int], AsyncIterator[JSON]]


class Reflector:
    """Keeps a consumer's view of one kind of object current.

    ``list_objects()`` returns a list (``items``, ``metadata.resourceVersion``);
    ``watch(version, timeout)`` streams watch events from there. ``on_listed`` gets every
    object after each list, ``on_event`` each ADDED/MODIFIED/DELETED event with its object.
    ``reached`` (optional) is set by someone else who got through to the API server: a
    back-off ends early then.
    """

    def __init__(
        self,
        list_objects: Lister,
        watch: Watcher,
        *,
        resource: str,
        on_listed: Callable[[list[JSON]], None],
        on_event: Callable[[str, JSON], None],
        log: Any,
        reporter: ApiErrorReporter,
        backoff_cap: float = 30.0,
        watch_timeout: tuple[int, int] = (300, 600),
        reached: asyncio.Event | None = None,
    ) -> None:
        self._list = list_objects
        self._watch_fn = watch
        self._resource = resource
        self._on_listed = on_listed
        self._on_event = on_event
        self._log = log
        self._reporter = reporter
        self._backoff_cap = backoff_cap
        self._watch_timeout = watch_timeout
        self._reached = reached or asyncio.Event()
        #: resourceVersion of the last listing or event handed over ("" before the first).
        self._handed_over = ""

    @property
    def current(self) -> str:
        """The resourceVersion the consumer's view is current to: that of the last listing or
        event handed over ("" before the first)."""
        return self._handed_over

    async def relist(self) -> str:
        """List, hand the objects over, and return the version to watch from.

        For another task that wants a fresh view while the watch runs: the list's answer
        can arrive after the watch already handed over newer events (another connection),
        and such a listing is not handed over, as it would undo them (a slice deleted since
        would come back, and nothing would tell the consumer it is gone).
        """
        return await self._relist(behind_watch_ok=False)

    async def _relist(self, *, behind_watch_ok: bool) -> str:
        listing = await self._list()
        version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        if not behind_watch_ok and is_older(version, self._handed_over):
            self._log.debug(
                f"listed {self._resource} behind the watch, keeping the watched view",
                rv=version,
                watched=self._handed_over,
            )
            return version
        self._on_listed(list(listing.get("items") or []))
        self._handed_over = version
        return version

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = Backoff(cap=self._backoff_cap)
        version: str | None = None
        while True:
            try:
                if version is None:
                    # No watch runs now: the listing is the newest view there is.
                    version = await self._relist(behind_watch_ok=True)
                    self._log.debug(f"listed {self._resource}", rv=version)
                version = await self._follow(version)
                backoff.reset()
            except ApiError as err:
                version = None
                if err.status == 410:
                    self._log.info("watch expired, re-listing", resource=self._resource)
                    continue
                self._reporter.report(err)
                await pause(backoff.next_delay(err.retry_after), self._reached)
            except WATCH_ERRORS as err:
                version = None
                # Only the first failure of an outage is worth a warning; retries are noise.
                level = self._log.warning if backoff.attempt == 0 else self._log.debug
                delay = backoff.next_delay()
                level(
                    f"lost the watch on {self._resource}, will re-list",
                    error=describe(err),
                    retry_in=round(delay, 2),
                )
                await pause(delay, self._reached)

    async def _follow(self, version: str) -> str | None:
        """Follow one watch request; return where to resume, or None to re-list."""
        low, high = self._watch_timeout
        timeout = random.randint(low, high) if high > low else low
        started = asyncio.get_running_loop().time()
        events = 0
        async for event in self._watch_fn(version, timeout):
            kind = str(event.get("type"))
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    self._log.info("watch expired, re-listing", resource=self._resource)
                    return None
                raise ApiError(
                    code or 500,
                    str(obj.get("reason", "")),
                    str(obj.get("message", "")),
                    verb="watch",
                    resource=self._resource,
                )
            events += 1
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind != "BOOKMARK":
                self._on_event(kind, obj)
                # A watch still catching up with a newer listing does not move it back.
                if not is_older(version, self._handed_over):
                    self._handed_over = version
        if events == 0 and asyncio.get_running_loop().time() - started < 1.0:
            # A watch that ends at once without a word is a proxy or server misbehaving; going
            # straight back would spin, so treat it like a lost connection.
            raise ConnectionError("watch ended immediately")
        return version
