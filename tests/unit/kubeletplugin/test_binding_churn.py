"""The binding-conditions watcher under churn and with claims it cannot prepare.

The watcher's loop (``_act``) is driven directly; the reflector's callbacks (``_on_listed``,
``_on_event``) stand in for the watch, so a test decides exactly when a claim arrives. Status
writes go to the stand-in API server, which records what it received.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dra_driver import resourceapi
from dra_driver.errors import PrepareError
from dra_driver.kube import KubeClient
from dra_driver.kubeletplugin import binding
from dra_driver.kubeletplugin.binding import BindingWatcher
from dra_driver.kubeletplugin.interfaces import ClaimToPrepare
from dra_driver.resourceslice.rawapi import ApiError
from tests.unit.kubeserver import FakeApiServer, plain_client, serve

DRIVER = "example.dra.dev"
POOL = "node-a"
READY = "example.com/ready"
FAILED = "example.com/failed"
JSON = dict[str, Any]


def _claim(name: str, *devices: str, config: Any = None, allocated: bool = True) -> JSON:
    """A claim allocated ``devices`` of this pool, each waiting for its binding condition."""
    claim: JSON = {
        "apiVersion": resourceapi.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "status": {},
    }
    if allocated:
        results = [
            {
                "request": "r",
                "driver": DRIVER,
                "pool": POOL,
                "device": d,
                "bindingConditions": [READY],
                "bindingFailureConditions": [FAILED],
            }
            for d in devices
        ]
        claim["status"]["allocation"] = {
            "devices": {"results": results, "config": [] if config is None else config},
            "allocationTimestamp": "2026-01-01T00:00:00Z",
        }
    return claim


class GatedDriver:
    """Records what the watcher hands over; ``allocated`` and ``prepare_before_binding``
    wait for their gate (open unless a test closes it), so a test can act in between."""

    def __init__(self) -> None:
        self.allocations: list[dict[str, frozenset[str]]] = []
        self.prepared: list[str] = []
        self.allocated_gate = asyncio.Event()
        self.allocated_gate.set()
        self.prepare_gate = asyncio.Event()
        self.prepare_gate.set()
        self.in_allocated = asyncio.Event()
        self.in_prepare = asyncio.Event()
        #: Raised by the next calls of ``prepare_before_binding``, in order.
        self.errors: list[Exception] = []

    async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
        self.allocations.append(dict(claims))
        self.in_allocated.set()
        await self.allocated_gate.wait()

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        self.prepared.append(claim.ref.name)
        self.in_prepare.set()
        await self.prepare_gate.wait()
        if self.errors:
            raise self.errors.pop(0)


async def _locked(work: Callable[[], Any]) -> None:
    await work()


@asynccontextmanager
async def acting(client: Any, driver: GatedDriver) -> AsyncIterator[tuple[BindingWatcher, Any]]:
    """A watcher whose loop runs as a task; the task must still be running at the end."""
    watcher = BindingWatcher(client, driver, driver_name=DRIVER, pool=POOL, locked=_locked)
    task = asyncio.create_task(watcher._act())
    try:
        yield watcher, task
        await asyncio.sleep(0.05)
        if task.done():
            task.result()  # raises what ended the loop
        assert not task.done(), "the watcher's loop ended"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(what: str, done: Callable[[], bool], task: Any, within: float = 5.0) -> None:
    """Wait for ``done()``; the loop's own exception if it died first."""
    deadline = asyncio.get_running_loop().time() + within
    while not done():
        if task.done():
            task.result()
            raise AssertionError(f"the watcher's loop ended before {what}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# -- churn: the reflector changes the claims while the loop awaits ------------------------------


async def test_a_claim_added_while_the_driver_is_told_the_allocations_is_handled_next() -> None:
    driver = GatedDriver()
    driver.allocated_gate.clear()
    async with acting(None, driver) as (watcher, task):
        watcher._on_listed([_claim("a", "dev-0")])
        await asyncio.wait_for(driver.in_allocated.wait(), 5)
        # The allocation burst goes on while the driver holds the node lock.
        watcher._on_event("ADDED", _claim("b", "dev-1"))
        driver.allocated_gate.set()
        await until("both claims prepared", lambda: sorted(driver.prepared) == ["a", "b"], task)
        assert driver.allocations[0] == {"uid-a": {"dev-0"}}
        assert driver.allocations[-1] == {"uid-a": {"dev-0"}, "uid-b": {"dev-1"}}
        assert driver.prepared.count("b") == 1


async def test_a_driver_failing_the_allocated_claims_gets_them_again_and_watching_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's undo of a deallocated claim fails (the API server, the disk): the
    watcher logs it, hands the same view over again a little later, and keeps preparing."""
    monkeypatch.setattr(binding, "RETRY_DELAY", 0.05)

    class Failing(GatedDriver):
        async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
            await super().allocated(claims)
            if len(self.allocations) == 1:
                raise ApiError(
                    500,
                    "InternalError",
                    "etcdserver: request timed out",
                    verb="patch",
                    resource="nodes",
                )

    driver = Failing()
    async with acting(None, driver) as (watcher, task):
        watcher._on_listed([_claim("a", "dev-0")])
        await until("the view handed over again", lambda: len(driver.allocations) == 2, task)
        assert driver.allocations[1] == driver.allocations[0] == {"uid-a": {"dev-0"}}
        await until("the claim prepared", lambda: driver.prepared == ["a"], task)


async def test_claims_that_change_while_another_is_prepared_are_handled_as_they_are_now() -> None:
    driver = GatedDriver()
    driver.prepare_gate.clear()
    async with acting(None, driver) as (watcher, task):
        watcher._on_listed([_claim("a", "dev-0"), _claim("b", "dev-1")])
        await asyncio.wait_for(driver.in_prepare.wait(), 5)
        assert driver.prepared == ["a"]
        # While "a" is prepared, "b" is deallocated and "c" arrives.
        watcher._on_event("MODIFIED", _claim("b", allocated=False))
        watcher._on_event("ADDED", _claim("c", "dev-2"))
        driver.prepare_gate.set()
        await until("the new claim prepared", lambda: "c" in driver.prepared, task)
        assert driver.allocations[-1] == {"uid-a": {"dev-0"}, "uid-c": {"dev-2"}}
        assert "b" not in driver.prepared  # deallocated before its turn: not prepared


# -- claims that cannot be prepared ------------------------------------------------------------

STATUS = resourceapi.path(resourceapi.RESOURCE_CLAIMS, "bad", namespace="ns", subresource="status")


def _answers(server: FakeApiServer, *statuses: int) -> None:
    """PATCH of the bad claim's status answers ``statuses`` in turn, then 200."""
    left = list(statuses)

    async def handler(request: web.Request) -> web.Response:
        status = left.pop(0) if left else 200
        return web.json_response({"kind": "Status", "message": f"answer {status}"}, status=status)

    server.routes[("PATCH", STATUS)] = handler


def _patches(server: FakeApiServer) -> list[JSON]:
    return [json.loads(r["body"]) for r in server.seen if r["method"] == "PATCH"]


def _failure_written(body: JSON, *devices: str, says: str) -> None:
    """``body`` sets exactly the failure condition of each device, with the reason."""
    assert body["metadata"] == {"name": "bad", "namespace": "ns", "uid": "uid-bad"}
    entries = body["status"]["devices"]
    assert [(e["driver"], e["pool"], e["device"]) for e in entries] == [
        (DRIVER, POOL, d) for d in devices
    ]
    for entry in entries:
        ((condition),) = entry["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            FAILED,
            "True",
            "PrepareFailed",
        )
        assert says in condition["message"]
        assert condition["lastTransitionTime"]


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, KubeClient]]:
    async with serve() as server, plain_client(server) as client:
        yield server, client


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "RETRY_DELAY", 0.01)


async def test_an_unreadable_claim_gets_its_failure_conditions(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api
    _answers(server)
    driver = GatedDriver()
    async with acting(client, driver) as (watcher, task):
        # The API server stores opaque parameters it cannot check; this config is no list.
        watcher._on_listed([_claim("bad", "dev-0", "dev-1", config="oops")])
        await until("the claim's status written", lambda: bool(_patches(server)), task)
        (patch,) = [r for r in server.seen if r["method"] == "PATCH"]
        assert patch["path"] == STATUS
        assert ("fieldManager", DRIVER) in patch["query"]
        assert patch["headers"]["Content-Type"] == "application/apply-patch+yaml"
        _failure_written(_patches(server)[0], "dev-0", "dev-1", says="expected a list")
        assert driver.prepared == []
        # Handled once: another event of an unchanged allocation writes nothing more.
        watcher._on_event("MODIFIED", _claim("bad", "dev-0", "dev-1", config="oops"))
        await asyncio.sleep(0.1)
        assert len(_patches(server)) == 1


async def test_a_driver_error_on_prepare_sets_the_failure_conditions(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api
    _answers(server)
    driver = GatedDriver()
    driver.errors = [PrepareError("GpuConfig: unknown sharing strategy 'Nope'")]
    async with acting(client, driver) as (watcher, task):
        watcher._on_listed([_claim("bad", "dev-0"), _claim("good", "dev-1")])
        await until("the claim's status written", lambda: bool(_patches(server)), task)
        await until("the other claim prepared", lambda: len(driver.prepared) == 2, task)
        (body,) = _patches(server)
        _failure_written(body, "dev-0", says="unknown sharing strategy")


@pytest.mark.parametrize("failure", ["503", "429", "connection refused"])
async def test_the_failure_conditions_are_written_once_the_api_server_answers(
    api: tuple[FakeApiServer, KubeClient], failure: str
) -> None:
    server, real = api
    client: Any = real
    if failure.isdigit():
        _answers(server, int(failure), int(failure))
    else:
        _answers(server)
        client = Unreachable(real, failures=2)
    driver = GatedDriver()
    async with acting(client, driver) as (watcher, task):
        watcher._on_listed([_claim("bad", "dev-0", config="oops")])
        attempts = 3 if failure.isdigit() else 1
        await until(f"{attempts} status writes", lambda: len(_patches(server)) >= attempts, task)
        await asyncio.sleep(0.2)
        patches = _patches(server)
        assert len(patches) == attempts  # retried until written, then never again
        for body in patches:
            _failure_written(body, "dev-0", says="expected a list")
        if not failure.isdigit():
            assert client.failed == 2


async def test_a_transient_driver_error_is_retried_not_failed(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api
    _answers(server)
    driver = GatedDriver()
    driver.errors = [
        ApiError(503, "ServiceUnavailable", "etcd leader changed", verb="get", resource="nodes"),
        aiohttp.ClientConnectionError("connection refused"),
    ]
    async with acting(client, driver) as (watcher, task):
        watcher._on_listed([_claim("c", "dev-0")])
        await until("three attempts", lambda: len(driver.prepared) >= 3, task)
        await asyncio.sleep(0.2)
        assert driver.prepared == ["c", "c", "c"]  # the third succeeded: no fourth
        assert _patches(server) == []  # the API server was away, not the claim wrong


class Unreachable:
    """A client whose first ``failures`` requests fail to connect."""

    def __init__(self, client: KubeClient, failures: int) -> None:
        self._client = client
        self._left = failures
        self.failed = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._left:
            self._left -= 1
            self.failed += 1
            raise aiohttp.ClientConnectionError("Cannot connect to host 10.96.0.1:443")
        return await self._client.request(method, path, **kwargs)


async def test_the_allocations_are_read_once_the_node_lock_is_held() -> None:
    """The view handed to the driver is the one when the node lock is taken: a claim
    allocated (and prepared by the kubelet) while the watcher waited for the lock is in it,
    else a driver that undoes what is not allocated (the ComputeDomain plugin leaving a
    domain) would undo it."""
    driver = GatedDriver()
    lock_free = asyncio.Event()

    async def held_lock(work: Callable[[], Any]) -> None:
        await lock_free.wait()  # a kubelet call holds the node lock
        await work()

    watcher = BindingWatcher(None, driver, driver_name=DRIVER, pool=POOL, locked=held_lock)
    task = asyncio.create_task(watcher._act())
    try:
        watcher._on_listed([_claim("a", "dev-0")])
        await asyncio.sleep(0.05)  # the round waits for the lock
        watcher._on_event("ADDED", _claim("b", "dev-1"))
        lock_free.set()
        await until("the driver told", lambda: bool(driver.allocations), task)
        assert driver.allocations[0] == {"uid-a": {"dev-0"}, "uid-b": {"dev-1"}}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
