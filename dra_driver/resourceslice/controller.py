"""Keep one node's ResourceSlices of one driver equal to a desired pool, for as long as it runs.

Two tasks share an in-memory copy of the node's slices:

* the watcher lists them once, then watches (with bookmarks) and re-lists only when the watch
  expired (410 Gone) or the connection was lost; it never polls;
* the reconciler wakes on any change (debounced), plans with :func:`planner.plan` and executes
  the plan. A reconcile that finds everything as desired writes nothing, so a steady state
  costs no API calls at all.

Slices deleted by someone else (the kubelet wipes a driver's slices when its plugin is gone,
and all of a node's slices when it starts) or edited by hand come back within the debounce
delay plus one round trip. Stopping the controller leaves the slices in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.errors import DriverError
from dra_driver.kube import KubeClient
from dra_driver.resourceslice.backoff import Backoff, pause
from dra_driver.resourceslice.dropped import (
    declared_features,
    feature_gate_for,
    find_dropped,
    refused_list_attributes,
    refused_paths,
    undeclared_paths,
)
from dra_driver.resourceslice.planner import ContentCache, Plan, plan
from dra_driver.resourceslice.pool import DesiredPool, NodeOwner, inline_counters
from dra_driver.resourceslice.publisher import Publisher
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, ApiError, RawApi
from dra_driver.resourceslice.reflector import Reflector
from dra_driver.resourceslice.reporting import ApiErrorReporter, describe, log_dropped
from dra_driver.resourceslice.store import SliceStore, field_selector, meta

JSON = dict[str, Any]
DroppedCallback = Callable[[frozenset[str]], Awaitable[None] | None]

log = structlog.get_logger(__name__)

#: After this many write rounds in a row for one desired pool, writes are slowed down by a
#: backoff: something (another writer, a server default we do not know) keeps undoing them,
#: and hammering the API server would not help.
_MAX_EAGER_ROUNDS = 4
#: Write rounds count as "in a row" unless this many seconds passed since the last one. A
#: pool that settles in between does not end the row: a writer undoing ours after each
#: settled round would otherwise alternate with us every debounce, for as long as it runs.
_QUIET = 10.0

#: How a Kubernetes 1.34 API server refuses a device whose counter set is in another slice.
COUNTERS_APART = "must reference a counterSet defined in the ResourceSlice sharedCounters"
#: How a Kubernetes 1.35+ API server refuses counter sets in a slice with devices.
COUNTERS_TOGETHER = "only one of `sharedCounters` or `devices` is allowed"
_RELIST_ERRORS: tuple[type[BaseException], ...] = (ApiError, *CONNECTION_ERRORS)


class NodeNotFoundError(DriverError):
    """The Node object does not exist (yet); a node-local pool without its node is not published."""


class SliceController:
    """Publishes a :class:`DesiredPool` as ResourceSlices and keeps it published.

    ``api`` is a :class:`~dra_driver.kube.KubeClient` (or a RawApi over one), owned by the
    caller.
    ``require_node``: when true (the node agent case) slices are only published while the Node
    exists, and always carry it as controlling owner so deleting the node deletes them.
    ``on_dropped`` is called with the feature gate names whenever the API server is newly found
    to drop fields of a feature (see :attr:`dropped_features`).
    ``publisher`` identifies this agent instance when several may run on the node (a rolling
    update): the controller records it on its slices and stops writing while a newer instance
    publishes the pool (see :mod:`dra_driver.resourceslice.publisher`). ``publisher_alive``
    says whether a newer instance still runs: one that does not (a surge update rolled back,
    its pod removed) no longer holds the pool; while yielding, the controller asks again every
    ``publisher_check`` seconds.
    """

    def __init__(
        self,
        api: KubeClient | RawApi,
        *,
        driver: str,
        node_name: str,
        field_manager: str = "dra-driver",
        require_node: bool = True,
        debounce: float = 0.075,
        backoff_cap: float = 30.0,
        watch_timeout: tuple[int, int] = (300, 600),
        on_dropped: DroppedCallback | None = None,
        publisher: Publisher | None = None,
        publisher_alive: Callable[[Publisher], bool] | None = None,
        publisher_check: float = 10.0,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self._api = RawApi(api)
        self._field_manager = field_manager
        self._require_node = require_node
        self._debounce = debounce
        self._backoff_cap = backoff_cap
        self._watch_timeout = watch_timeout
        self._on_dropped = on_dropped
        self._publisher = publisher
        self._yielded_to: Publisher | None = None
        self._publisher_alive = publisher_alive
        self._publisher_check = publisher_check
        self._gone: frozenset[str] = frozenset()  # newer publishers found gone, last round
        self._selector = field_selector(node_name, driver)
        self._contents = ContentCache()
        self._log = log.bind(node=node_name, driver=driver)
        self._reporter = ApiErrorReporter(self._log)

        self._desired: DesiredPool | None = None
        self._owner: NodeOwner | None = None
        self._owner_looked_up = False
        self._store = SliceStore(driver, node_name)
        self._listed = asyncio.Event()
        self._wake = asyncio.Event()
        self._synced = asyncio.Event()
        self._recovered = asyncio.Event()  # the watcher got through to the server
        self._reached = asyncio.Event()  # the reconciler got through to the server
        self._dropped: set[str] = set()
        self._eager_rounds = 0
        self._last_write_round = -math.inf  # monotonic; when the last round wrote
        self._undone = Backoff(cap=backoff_cap)  # slows down rounds past _MAX_EAGER_ROUNDS
        self._generation = 0
        self._inline_counters = False
        #: The features the Node declares, as read before this round of writes (None: the
        #: Node could not be read).
        self._node_features: frozenset[str] | None = None
        self._reflector = Reflector(
            lambda: self._api.list_slices(self._selector),
            lambda version, timeout: self._api.watch_slices(self._selector, version, timeout),
            resource="resourceslices",
            on_listed=self._listed_slices,
            on_event=self._slice_event,
            log=self._log,
            reporter=self._reporter,
            backoff_cap=backoff_cap,
            watch_timeout=watch_timeout,
            reached=self._reached,
        )

        #: API writes made so far (creates + updates + deletes); reads are not counted.
        self.writes = 0

    # ----------------------------------------------------------------- public surface

    @property
    def generation(self) -> int:
        """Pool generation of the last plan (0 before the first reconcile)."""
        return self._generation

    @property
    def dropped_fields(self) -> frozenset[str]:
        """Spec field paths the API server was seen to drop, e.g. ``sharedCounters``."""
        return frozenset(self._dropped)

    @property
    def dropped_features(self) -> frozenset[str]:
        """Feature gates that are likely disabled, judged by the dropped fields."""
        return frozenset(feature_gate_for(p) for p in self._dropped)

    @property
    def slices(self) -> list[JSON]:
        """The controller's current view of this node's slices (a snapshot)."""
        return list(self._store.objects.values())

    async def set_pool(self, desired: DesiredPool) -> None:
        """Replace the desired pool and trigger a reconcile; inventory changes come here too."""
        if desired.driver != self.driver or desired.node_name != self.node_name:
            raise ValueError(
                f"pool is for {desired.driver} on {desired.node_name}, "
                f"controller for {self.driver} on {self.node_name}"
            )
        if desired != self._desired:
            # Writes for a new pool are wanted, not a sign that something undoes ours: the
            # next write round starts a new row.
            self._last_write_round = -math.inf
        self._desired = desired
        self._synced.clear()
        self._wake.set()

    async def wait_synced(self) -> None:
        """Wait until the stored slices match the desired pool (wrap in ``asyncio.timeout``)."""
        await self._synced.wait()

    @property
    def synced(self) -> bool:
        """True while the stored slices are known to match the desired pool."""
        return self._synced.is_set()

    async def run(self) -> None:
        """Watch and reconcile until cancelled; the slices stay in place afterwards."""
        self._log.info("resourceslice controller starting")
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch_loop(), name=f"slice-watch-{self.node_name}")
                group.create_task(self._reconcile_loop(), name=f"slice-sync-{self.node_name}")
        finally:
            self._log.info("resourceslice controller stopped; slices left in place")

    # ----------------------------------------------------------------- watching

    def _listed_slices(self, items: list[JSON]) -> None:
        self._store.replace(items)
        self._listed.set()
        self._recovered.set()
        self._wake.set()

    def _slice_event(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            self._store.forget(obj)
        else:
            self._store.remember(obj)
        self._wake.set()

    async def _relist(self) -> str:
        return await self._reflector.relist()

    async def _watch_loop(self) -> None:
        await self._reflector.run()

    # ----------------------------------------------------------------- reconciling

    async def _reconcile_loop(self) -> None:
        backoff = Backoff(cap=self._backoff_cap)
        while True:
            if self._yielded_to is not None and self._publisher_alive is not None:
                # Yielding: look again now and then whether the newer agent still runs.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._publisher_check)
            else:
                await self._wake.wait()
            # Coalesce bursts (a kubelet wiping every slice, the echoes of our own writes);
            # until the reconciler first got through, there is nothing to coalesce, and the
            # node's devices wait for this round.
            if self._reached.is_set():
                await asyncio.sleep(self._debounce)
            self._wake.clear()
            if self._desired is None or not self._listed.is_set():
                continue
            try:
                if await self._reconcile_once():
                    backoff.reset()
                else:
                    # Verify the result (and finish deferred steps) with a fresh plan.
                    self._wake.set()
                self._reached.set()
            except ApiError as err:
                self._wake.set()
                if err.status in (404, 409):
                    # Our view is stale: someone else changed or removed a slice.
                    listed = await self._relist_quietly()
                    if (
                        listed
                        and err.status == 409
                        and err.verb == "create"
                        and err.name
                        and err.name not in self._store.objects
                    ):
                        # Not ours even after a fresh list: our field selector hides its holder.
                        self._reporter.name_taken(err.name)
                    else:
                        self._log.info(
                            "conflict, re-listed",
                            status=err.status,
                            slice=err.name,
                            verb=err.verb,
                        )
                    delay = backoff.next_delay()
                    if backoff.attempt > 2:
                        # Conflicts that keep coming mean a fight with another writer.
                        await asyncio.sleep(delay)
                    continue
                self._reporter.report(err)
                delay = backoff.next_delay(err.retry_after)
                if err.status == 429 or err.status >= 500:
                    await pause(delay, self._recovered)
                else:
                    await asyncio.sleep(delay)
            except NodeNotFoundError:
                self._wake.set()
                level = self._log.warning if backoff.attempt == 0 else self._log.debug
                delay = backoff.next_delay()
                level(
                    "node object not found, not publishing slices until it exists",
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)
            except CONNECTION_ERRORS as err:
                self._wake.set()
                level = self._log.warning if backoff.attempt == 0 else self._log.debug
                delay = backoff.next_delay()
                level("cannot reach the API server", error=describe(err), retry_in=round(delay, 2))
                await pause(delay, self._recovered)

    async def _relist_quietly(self) -> bool:
        """Re-list; False (logged at debug level) when that failed."""
        try:
            await self._relist()
        except _RELIST_ERRORS as err:
            # The watcher notices the same trouble and re-lists on its own.
            self._log.debug("re-list after conflict failed", error=repr(err))
            return False
        return True

    def _plan(self) -> Plan:
        """The round's plan; a newer publisher that no longer runs is not yielded to."""
        gone: set[str] = set()
        result = self._plan_without(gone)
        alive = self._publisher_alive
        while result.yielded_to is not None and alive is not None and not alive(result.yielded_to):
            gone.add(result.yielded_to.id)
            result = self._plan_without(gone)
        if gone - self._gone:
            self._log.warning(
                "the slices name a newer agent that no longer runs; this one publishes",
                gone=sorted(gone),
            )
        self._gone = frozenset(gone)
        return result

    def _plan_without(self, gone: set[str]) -> Plan:
        assert self._desired is not None
        desired = self._desired
        if self._inline_counters:
            desired = inline_counters(desired) or desired
        return plan(
            list(self._store.objects.values()),
            desired,
            self._owner,
            self._dropped,
            self._publisher,
            self._contents,
            gone,
        )

    async def _reconcile_once(self) -> bool:
        """Make one round of writes; True when nothing needed to be written."""
        result = self._plan()
        if result.empty and not self._owner_looked_up:
            # Slices an earlier run wrote while the Node was unreadable lack its owner
            # reference; a plan without an owner finds them unchanged. Looked up once.
            self._owner = await self._lookup_owner()
            self._owner_looked_up = True
            result = self._plan()
        self._generation = result.generation
        if result.yielded_to != self._yielded_to:
            self._yielded_to = result.yielded_to
            if result.yielded_to is not None:
                self._log.warning(
                    "a newer agent on this node publishes the pool; this one stops writing",
                    newer=result.yielded_to.id,
                )
            else:
                self._log.info("no newer agent publishes the pool any more; publishing again")
        if result.yielded_to is not None:
            self._synced.clear()
            return True
        if result.empty:
            if not self._synced.is_set():
                self._log.info(
                    "pool published", generation=result.generation, slices=len(self._store.objects)
                )
                self._reporter.published()
            self._synced.set()
            return True
        self._synced.clear()
        owner = await self._lookup_owner()
        self._owner_looked_up = True
        if owner != self._owner:
            self._owner = owner
            result = self._plan()
            self._generation = result.generation
        if time.monotonic() - self._last_write_round >= _QUIET:
            self._eager_rounds = 0
            self._undone.reset()
        self._eager_rounds += 1
        if self._eager_rounds > _MAX_EAGER_ROUNDS:
            delay = self._undone.next_delay()
            self._log.warning(
                "pool does not settle; something keeps changing the slices",
                rounds=self._eager_rounds,
                retry_in=round(delay, 2),
            )
            await asyncio.sleep(delay)
            # The pool or the slices may have changed while paused: write what is wanted now.
            result = self._plan()
            self._generation = result.generation
            if result.yielded_to is not None or result.empty:
                return False  # the next round says so
        # Measured from the round's start, after any pause: the pause is not quiet.
        self._last_write_round = time.monotonic()
        await self._execute(result)
        return False

    async def _lookup_owner(self) -> NodeOwner | None:
        """The Node's identity for the ownerReference, fetched before every round of writes.

        Fetching it per round (and not once) means a Node deleted and recreated under the same
        name gets slices owned by the new object, instead of slices the garbage collector
        deletes again at once.
        """
        self._node_features = None
        try:
            node = await self._api.get_node(self.node_name)
        except ApiError as err:
            if err.status == 404 and self._require_node:
                raise NodeNotFoundError(self.node_name) from err
            if err.status in (403, 404):
                if err.status == 403:
                    self._reporter.report(err)
                return None  # publish without an owner rather than not at all
            raise
        self._node_features = declared_features(node)
        uid = meta(node).get("uid")
        return NodeOwner(name=self.node_name, uid=str(uid)) if uid else None

    async def _execute(self, result: Plan) -> None:
        self._log.info(
            "publishing pool",
            generation=result.generation,
            creates=len(result.creates),
            updates=len(result.updates),
            deletes=len(result.deletes),
        )
        dropped: dict[str, str] = {}  # field path -> first slice it was dropped from
        try:
            for body in result.creates:
                self.writes += 1
                stored = await self._refusing(
                    self._api.create_slice(body, self._field_manager), body, dropped
                )
                if stored is None:
                    return
                faults.point("publisher.after-create")
                self._after_write(body, stored, dropped)
            for body in result.updates:
                self.writes += 1
                stored = await self._refusing(
                    self._api.replace_slice(body, self._field_manager), body, dropped
                )
                if stored is None:
                    return
                self._after_write(body, stored, dropped)
        finally:
            # Reported once per round, grouped by feature gate, even if a later write failed.
            await self._report_dropped(dropped)
        for name in result.deletes:
            faults.point("publisher.before-delete")
            self.writes += 1
            await self._api.delete_slice(name, result.delete_uids.get(name))
            self._store.objects.pop(name, None)
            self._log.debug("deleted slice", slice=name)

    async def _refusing(
        self, write: Awaitable[JSON], body: JSON, dropped: dict[str, str]
    ) -> JSON | None:
        """The stored slice; None when the server refused it for a feature the node does not
        support: that feature's fields then count as dropped (the caller ends the round)."""
        try:
            return await write
        except ApiError as err:
            if err.status == 422 and COUNTERS_APART in err.message and not self._inline_counters:
                # Kubernetes 1.34: counter sets go in the slice of the devices consuming them.
                self._log.info("the API server wants counter sets beside their devices (1.34)")
                self._inline_counters = True
                return None
            if err.status == 422 and COUNTERS_TOGETHER in err.message and self._inline_counters:
                # The control plane was upgraded past 1.34: counter sets go apart again.
                self._log.info("the API server wants counter sets in slices of their own")
                self._inline_counters = False
                return None
            paths = self._refused(err, body.get("spec") or {})
            if not paths - self._dropped:
                raise  # nothing new to leave out: an error like any other
            name = str(meta(body).get("name", ""))
            dropped.update((p, name) for p in paths if p not in self._dropped)
            return None

    def _refused(self, err: ApiError, spec: JSON) -> frozenset[str]:
        """The field paths of ``spec`` that ``err`` refused for a feature the server or the
        node lacks (empty: an error like any other)."""
        if err.status == 422:  # validation: the Status names each bad field in its causes
            return refused_list_attributes(err.body, spec)
        if err.status != 403:
            return frozenset()
        # Admission (NodeDeclaredFeatureValidator) answers with a bare Forbidden, no causes,
        # just like RBAC does; the Node's declared features tell which one it is. Slices are
        # node-local, so the node checked is this one.
        if self._node_features is not None and spec.get("nodeName") == self.node_name:
            return undeclared_paths(spec, self._node_features)
        return refused_paths(err.message)  # the Node is unknown: its words are all there is

    def _after_write(self, sent: JSON, stored: JSON, dropped: dict[str, str]) -> None:
        name = str(meta(stored).get("name", ""))
        self._log.debug("wrote slice", slice=name, rv=meta(stored).get("resourceVersion"))
        self._store.remember_written(stored, seen=self._reflector.current)
        for path in find_dropped(sent.get("spec") or {}, stored.get("spec") or {}):
            if path not in self._dropped:
                dropped.setdefault(path, name)

    async def _report_dropped(self, dropped: Mapping[str, str]) -> None:
        """Warn once about newly dropped fields; from now on compare without them."""
        if not dropped:
            return
        self._dropped |= set(dropped)
        log_dropped(self._log, dropped, handled=self._on_dropped is not None)
        if self._on_dropped is not None:
            outcome = self._on_dropped(frozenset(feature_gate_for(p) for p in dropped))
            if inspect.isawaitable(outcome):
                await outcome
