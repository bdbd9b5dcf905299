"""An in-memory Kubernetes API server with churn, for the components' own HTTP clients.

:class:`Cluster` stores objects of a few resources (ResourceSlices, ResourceClaims, Nodes) the
way the API server does: every write bumps one global resourceVersion and is appended to an
event history; LIST answers a snapshot at a resourceVersion (paged with ``continue`` when the
server feels like it); WATCH replays the history after the given resourceVersion and then
follows live, with bookmarks, and answers ``410 Gone`` for a resourceVersion older than the
history kept. Writes are create (POST), update (PUT, conditional on resourceVersion and uid),
delete (conditional on ``preconditions``), and server-side apply of a claim's status
(PATCH ``application/apply-patch+yaml``, merging ``status.devices`` by driver, pool and device).

:class:`Faults` adds the trouble of a busy cluster while ``enabled``: handlers that finish in
a different order than requests came (random delays), 409/429/500 answers, writes that are
stored but answered 500 (a timeout after the commit), watches closed early or expired with
410, and history compacted so that a watch must re-list.

The test drives the cluster directly (:meth:`Cluster.create` and friends), as other clients of
the API server would; the components talk HTTP to it through :func:`serving`.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dra_driver import resourceapi
from dra_driver.kube import APPLY_PATCH
from tests.unit.kubeserver import FakeApiServer, serve

JSON = dict[str, Any]
Key = tuple[str, str]  # namespace ("" when cluster-scoped), name

SLICES = resourceapi.RESOURCE_SLICES
CLAIMS = resourceapi.RESOURCE_CLAIMS
NODES = "nodes"
KINDS = {SLICES: "ResourceSlice", CLAIMS: "ResourceClaim", NODES: "Node"}


@dataclass
class Faults:
    """The trouble the server makes while ``enabled`` (probabilities per request or event)."""

    enabled: bool = False
    error: float = 0.04  # a request answered 409 (writes), 429 or 500 before it is applied
    lost_answer: float = 0.02  # a write applied, but answered 500
    max_delay: float = 0.01  # a handler waits up to this long before and after its work
    slow: float = 0.1  # an answer that takes up to ``slow_delay`` to arrive
    slow_delay: float = 0.1
    watch_life: tuple[float, float] = (0.2, 1.0)  # how long a watch lasts, in seconds
    expire: float = 0.03  # a watch event replaced by ERROR 410 (the watch cache fell behind)
    compact: float = 0.03  # a write forgets the history (watches from before it get 410)
    silent_close: float = 0.1  # a watch closed without a final bookmark


@dataclass
class Event:
    """One entry of the history."""

    rv: int
    resource: str
    type: str
    obj: JSON


@dataclass(eq=False)
class _Watch:
    resource: str
    namespace: str
    selector: list[tuple[str, str]]
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)


class ApiStatus(Exception):
    """An answer other than success, as a Kubernetes Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> JSON:
        """The Status object."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
        }


def parse_selector(text: str) -> list[tuple[str, str]]:
    """A field selector of ``path=value`` terms joined by commas."""
    out = []
    for term in filter(None, text.split(",")):
        path, _, value = term.partition("=")
        out.append((path.strip(), value.strip()))
    return out


def _field(obj: JSON, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def matches(obj: JSON, namespace: str, selector: list[tuple[str, str]]) -> bool:
    """Whether ``obj`` is in ``namespace`` (all when empty) and matches the field selector."""
    if namespace and obj["metadata"].get("namespace", "") != namespace:
        return False
    return all(_field(obj, path) == value for path, value in selector)


def key_of(obj: JSON) -> Key:
    """The object's storage key."""
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


class Cluster:
    """The stored objects, their history and the watches following it."""

    def __init__(self, rng: random.Random, faults: Faults | None = None) -> None:
        self.rng = rng
        self.faults = faults or Faults()
        self.objects: dict[str, dict[Key, JSON]] = {r: {} for r in KINDS}
        self.rv = 1
        self.history: list[Event] = []
        #: Watches from a resourceVersion before this one get 410 Gone.
        self.compacted = 0
        #: Requests served, by verb and resource, and the faults injected.
        self.requests: Counter[str] = Counter()
        #: Exceptions the server itself raised while answering (its own bugs).
        self.defects: list[str] = []
        self._watches: set[_Watch] = set()
        self._uids = itertools.count(1)
        self._snapshots: dict[str, tuple[int, list[JSON]]] = {}
        self._closing = False

    # ----------------------------------------------------------------- direct access

    def list(self, resource: str) -> list[JSON]:
        """Copies of the stored objects of ``resource``."""
        return [copy.deepcopy(o) for o in self.objects[resource].values()]

    def get(self, resource: str, namespace: str, name: str) -> JSON | None:
        """A copy of one stored object."""
        obj = self.objects[resource].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, resource: str, obj: JSON) -> JSON:
        """Store a new object; raises :class:`ApiStatus` 409 when the name is taken."""
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resourceapi.API_VERSION if resource != NODES else "v1")
        obj.setdefault("kind", KINDS[resource])
        key = key_of(obj)
        if key in self.objects[resource]:
            raise ApiStatus(409, "AlreadyExists", f"{resource} {key[1]!r} already exists")
        meta = obj["metadata"]
        meta["uid"] = f"uid-{resource}-{next(self._uids)}"
        meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
        return self._commit(resource, "ADDED", obj)

    def update(self, resource: str, obj: JSON, *, status: bool = False) -> JSON:
        """Replace an object (its spec and metadata, or with ``status`` its status only);
        conditional on the body's resourceVersion and uid when it names them."""
        current = self._current(resource, key_of(obj))
        meta = obj.get("metadata") or {}
        if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
            raise ApiStatus(409, "Conflict", f"Precondition failed: UID in object {meta['uid']}")
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiStatus(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {resource} {key_of(obj)[1]!r}: the object "
                "has been modified; please apply your changes to the latest version and try again",
            )
        if status:
            new = copy.deepcopy(current)
            new["status"] = copy.deepcopy(obj.get("status") or {})
        else:
            # The main resource: spec and metadata from the body, the status stays.
            new = copy.deepcopy(obj)
            new.pop("status", None)
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            for kept in ("uid", "creationTimestamp", "namespace"):
                if kept in current["metadata"]:
                    new["metadata"][kept] = current["metadata"][kept]
            new.setdefault("apiVersion", current.get("apiVersion"))
            new.setdefault("kind", current.get("kind"))
        return self._commit(resource, "MODIFIED", new)

    def delete(self, resource: str, namespace: str, name: str, uid: str | None = None) -> JSON:
        """Remove an object (conditional on ``uid``); 404 when there is none."""
        current = self._current(resource, (namespace, name))
        if uid and uid != current["metadata"]["uid"]:
            raise ApiStatus(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        del self.objects[resource][(namespace, name)]
        return self._commit(resource, "DELETED", copy.deepcopy(current), store=False)

    def apply_status(self, resource: str, namespace: str, name: str, patch: JSON) -> JSON:
        """Server-side apply of ``status.devices`` entries (merged by driver, pool, device)."""
        current = self._current(resource, (namespace, name))
        uid = (patch.get("metadata") or {}).get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise ApiStatus(409, "Conflict", f"uid mismatch: {uid}")
        new = copy.deepcopy(current)
        status = new.setdefault("status", {}) or {}
        new["status"] = status
        entries = {
            (d.get("driver"), d.get("pool"), d.get("device")): d
            for d in status.get("devices") or []
        }
        for entry in (patch.get("status") or {}).get("devices") or []:
            entries[(entry.get("driver"), entry.get("pool"), entry.get("device"))] = copy.deepcopy(
                entry
            )
        status["devices"] = list(entries.values())
        return self._commit(resource, "MODIFIED", new)

    def _current(self, resource: str, key: Key) -> JSON:
        obj = self.objects[resource].get(key)
        if obj is None:
            raise ApiStatus(404, "NotFound", f"{resource} {key[1]!r} not found")
        return obj

    def _commit(self, resource: str, kind: str, obj: JSON, *, store: bool = True) -> JSON:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = key_of(obj)
        old = self.objects[resource].get(key) if store else None
        if store:
            self.objects[resource][key] = obj
        event = Event(self.rv, resource, kind, obj)
        self.history.append(event)
        if self.faults.enabled and self.rng.random() < self.faults.compact:
            self.compacted = self.rv
            self.history.clear()
        for watch in list(self._watches):
            self._notify(watch, event, old)
        return copy.deepcopy(obj)

    def _notify(self, watch: _Watch, event: Event, old: JSON | None) -> None:
        if watch.resource != event.resource:
            return
        now = matches(event.obj, watch.namespace, watch.selector)
        before = old is not None and matches(old, watch.namespace, watch.selector)
        if now:
            kind = (
                "ADDED"
                if event.type == "MODIFIED" and old is not None and not before
                else event.type
            )
            watch.queue.put_nowait(Event(event.rv, event.resource, kind, event.obj))
        elif before:
            # Moved out of the watch's selection: watchers see it go.
            watch.queue.put_nowait(Event(event.rv, event.resource, "DELETED", event.obj))

    def close(self) -> None:
        """End every watch now and refuse new ones (the server is going away)."""
        self._closing = True
        for watch in self._watches:
            watch.queue.put_nowait(None)

    # ----------------------------------------------------------------- HTTP

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one request (the :class:`FakeApiServer` fallback)."""
        try:
            return await self._handle(request)
        except Exception as exc:
            # A defect of this stand-in, not of its clients: kept for the test to report.
            self.defects.append(f"{request.method} {request.path_qs}: {exc!r}")
            raise

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            resource, namespace, name, sub = self._route(request.path)
        except ApiStatus as err:
            return web.json_response(err.body(), status=err.code)
        verb = request.method
        watching = verb == "GET" and request.query.get("watch") == "true"
        self.requests[f"{verb} {resource}{'/watch' if watching else ''}"] += 1
        faults = self.faults
        if faults.enabled and faults.max_delay:
            # Concurrent requests complete in an order of their own.
            await asyncio.sleep(self.rng.uniform(0, faults.max_delay))
        if faults.enabled and self.rng.random() < faults.error:
            # 409 where optimistic concurrency can refuse a write (an apply with force only
            # conflicts on a replaced object, which the stand-in does for real).
            codes = [429, 500] + ([409] if verb in ("PUT", "DELETE") else [])
            code = self.rng.choice(codes)
            reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}[code]
            self.requests[f"injected {code}"] += 1
            return web.json_response(ApiStatus(code, reason, "injected").body(), status=code)
        try:
            if watching:
                return await self._watch(request, resource, namespace)
            answer, code = await self._serve(request, verb, resource, namespace, name, sub)
        except ApiStatus as err:
            return web.json_response(err.body(), status=err.code)
        if faults.enabled:
            # The answer is on its way while watches already stream what happened since.
            slow = self.rng.random() < faults.slow
            await asyncio.sleep(
                self.rng.uniform(0, faults.slow_delay if slow else faults.max_delay)
            )
        if verb != "GET" and faults.enabled and self.rng.random() < faults.lost_answer:
            self.requests["lost answer"] += 1
            return web.json_response(ApiStatus(500, "InternalError", "timeout").body(), status=500)
        return web.json_response(answer, status=code)

    @staticmethod
    def _route(path: str) -> tuple[str, str, str, str]:
        """resource, namespace, name, subresource of a REST path."""
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif parts[:3] == ["apis", resourceapi.GROUP, resourceapi.VERSION]:
            rest = parts[3:]
        else:
            raise ApiStatus(404, "NotFound", f"{path} not found")
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in KINDS or len(rest) > 3:
            raise ApiStatus(404, "NotFound", f"{path} not found")
        return (
            rest[0],
            namespace,
            rest[1] if len(rest) > 1 else "",
            rest[2] if len(rest) > 2 else "",
        )

    async def _serve(
        self, request: web.Request, verb: str, resource: str, namespace: str, name: str, sub: str
    ) -> tuple[JSON, int]:
        if verb == "GET" and not name:
            return self._list(request, resource, namespace), 200
        if verb == "GET":
            return copy.deepcopy(self._current(resource, (namespace, name))), 200
        body = await request.json() if request.can_read_body else {}
        if verb == "POST" and not name:
            body.setdefault("metadata", {})
            if namespace:
                body["metadata"]["namespace"] = namespace
            return self.create(resource, body), 201
        if verb == "PUT" and name:
            body.setdefault("metadata", {})["name"] = name
            if namespace:
                body["metadata"]["namespace"] = namespace
            return self.update(resource, body, status=sub == "status"), 200
        if verb == "DELETE" and name:
            uid = ((body or {}).get("preconditions") or {}).get("uid")
            return self.delete(resource, namespace, name, uid), 200
        if verb == "PATCH" and sub == "status" and request.content_type == APPLY_PATCH:
            return self.apply_status(resource, namespace, name, body), 200
        raise ApiStatus(405, "MethodNotAllowed", f"{verb} {request.path}")

    def _list(self, request: web.Request, resource: str, namespace: str) -> JSON:
        token = request.query.get("continue", "")
        if token:
            rv, rest = self._snapshots.pop(token, (0, []))
            if not rv:
                raise ApiStatus(410, "Expired", "the continue token expired")
        else:
            selector = parse_selector(request.query.get("fieldSelector", ""))
            rest = [
                copy.deepcopy(o)
                for _, o in sorted(self.objects[resource].items())
                if matches(o, namespace, selector)
            ]
            rv = self.rv
        limit = int(request.query.get("limit") or 0) or len(rest) or 1
        if self.faults.enabled:
            limit = min(limit, self.rng.randint(1, 4))  # pages smaller than asked for
        page, rest = rest[:limit], rest[limit:]
        meta: JSON = {"resourceVersion": str(rv)}
        if rest:
            token = f"c{self.rv}-{next(self._uids)}"
            self._snapshots[token] = (rv, rest)
            meta["continue"] = token
        return {"kind": KINDS[resource] + "List", "metadata": meta, "items": page}

    async def _watch(
        self, request: web.Request, resource: str, namespace: str
    ) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()

        async def send(kind: str, obj: JSON) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since < self.compacted or self._closing:
            await send(
                "ERROR", ApiStatus(410, "Expired", f"too old resource version: {since}").body()
            )
            return response
        watch = _Watch(resource, namespace, parse_selector(request.query.get("fieldSelector", "")))
        # Registered and replayed in one step: no event is missed or sent twice.
        for event in self.history:
            if event.rv > since:
                self._notify(watch, event, None if event.type == "ADDED" else event.obj)
        self._watches.add(watch)
        life = timeout
        if self.faults.enabled:
            life = min(life, self.rng.uniform(*self.faults.watch_life))
        deadline = loop.time() + life
        sent = since
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await watch.queue.get()
                except TimeoutError:
                    break
                if event is None:
                    return response
                if self.faults.enabled and self.rng.random() < self.faults.expire:
                    await send("ERROR", ApiStatus(410, "Expired", "watch cache fell behind").body())
                    return response
                await send(event.type, copy.deepcopy(event.obj))
                sent = event.rv
            if not (self.faults.enabled and self.rng.random() < self.faults.silent_close):
                # Everything up to now was delivered: a bookmark may say so.
                at = self.rv if watch.queue.empty() else sent
                await send(
                    "BOOKMARK", {"kind": KINDS[resource], "metadata": {"resourceVersion": str(at)}}
                )
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away
        finally:
            self._watches.discard(watch)
        return response


@asynccontextmanager
async def serving(cluster: Cluster) -> AsyncIterator[FakeApiServer]:
    """Serve ``cluster`` over HTTP on a loopback port."""
    async with serve() as server:
        server.fallback = cluster.handle
        server.record = False
        try:
            yield server
        finally:
            cluster.close()
