"""The kubelet plugin and the slice publisher under perturbed scheduling and a churning cluster.

Each run starts the real components on an :class:`~tests.unit.interleave.InterleavingLoop`
(task resumptions in ``kubeletplugin/`` and ``resourceslice/`` moved later at random) against
the in-memory API server of :mod:`tests.unit.fakeapi`:

* the slice controller (supervised as ``publisher``) publishes a desired pool that keeps
  changing, while someone else deletes and edits its slices and adds strays;
* the binding watcher (supervised as ``claim-binding``) follows claims that are created,
  allocated (to this node's pool or another), deallocated and deleted;
* the gRPC servicer (:class:`~dra_driver.kubeletplugin.Plugin`) answers prepares and
  unprepares of random claims, fetched from the same server;
* the liveness servicer is asked whether the node is healthy.

Meanwhile the server answers errors, delays and reorders its answers, closes and expires
watches. Then the churn stops (the scheduling stays perturbed) and the run checks:

* nothing crashed: no call of the loop's exception handler, no supervised loop died, no
  exception logged with its traceback, every gRPC call answered;
* nothing was lost or done twice: each allocation waiting for its binding conditions was
  handed to the driver at most once, and exactly once if it is still allocated; the driver's
  last view of the allocations is the server's; each prepare answers every claim asked once;
  the driver never ran two calls at a time; both reflectors hold what the server holds;
* the slices converged: the controller's own planner finds nothing to write for the server's
  slices, which are exactly what :func:`render_pool` makes of the last desired pool and pass
  the validation rules; slices of other nodes and drivers are untouched;
* liveness tells the truth: healthy throughout, and unhealthy once a loop is killed.

A failure names its seed; ``INTERLEAVE_SEED=<seed>`` runs that seed alone.
``python -m tests.fuzz_async`` runs fresh seeds for as long as wanted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2

from dra_driver import resourceapi
from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.kube import APPLY_PATCH, KubeClient
from dra_driver.kubeletplugin import ClaimRef, KubeClaimFetcher, Plugin
from dra_driver.kubeletplugin.binding import BindingWatcher
from dra_driver.kubeletplugin.interfaces import ClaimToPrepare
from dra_driver.kubeletplugin.liveness import LivenessServicer
from dra_driver.resourceslice import controller as controller_module
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.planner import plan
from dra_driver.resourceslice.pool import DesiredPool, NodeOwner, render_pool
from dra_driver.resourceslice.publisher import Publisher, annotation_key
from dra_driver.resourceslice.rawapi import SLICES_PATH, ApiError
from dra_driver.resourceslice.store import is_older
from dra_driver.supervise import Heartbeats, supervise
from tests.unit.fakeapi import CLAIMS, NODES, SLICES, ApiStatus, Cluster, Faults, serving
from tests.unit.interleave import (
    InterleavingLoop,
    Perturbation,
    crash_events,
    fresh_loggers,
    run,
    seeds,
)
from tests.unit.kubeletplugin.helpers import (
    DRIVER,
    NODE,
    FakeDriver,
    channel,
    config_for,
    prepare_request,
    unprepare_request,
)
from tests.unit.kubeserver import plain_client
from tests.unit.resourceslice.test_planner import device, pool_of
from tests.unit.slice_rules import check_pool

JSON = dict[str, Any]
OTHER_NODE = "node-b"
READY = f"{DRIVER}/ready"
FAILED = f"{DRIVER}/failed"
#: One allocation of one claim: UID, allocation time, devices (as the binding watcher keys it).
Allocation = tuple[str, str, frozenset[str]]


@dataclass(frozen=True)
class Budget:
    """How long each phase of a run may take, in seconds."""

    churn: float = 2.0  # the cluster churns; the server misbehaves but for the quiet end
    quiet: float = 0.6  # the end of the churn: no faults, no pool changes
    settle: float = 12.0  # the components converge (a deadline, usually much less)
    pulse: float = 0.1  # the supervised loops' heartbeat
    allowed_silence: float = 1.0  # liveness fails after this long without a beat


@dataclass
class Outcome:
    """What one run found."""

    seed: int
    failures: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def check(self, ok: bool, what: str) -> None:
        """Record ``what`` as a failure unless ``ok``."""
        if not ok:
            self.failures.append(what)


# ----------------------------------------------------------------- the driver


@dataclass
class BindingRecorder(FakeDriver):
    """The test driver of the servicer (see :class:`FakeDriver`) that also takes claims before
    binding: it records each allocation handed over and sets its binding conditions."""

    client: Any = None
    #: Each hand-over: the allocation, and whether its binding conditions were written.
    before_binding: list[tuple[Allocation, bool]] = field(default_factory=list)
    views: list[dict[str, frozenset[str]]] = field(default_factory=list)

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        await self._enter("before-binding", (claim.ref.uid,))
        key = allocation_of(claim.claim, NODE)
        try:
            await self._set_ready(claim)
        except BaseException:
            self.before_binding.append((key, False))
            raise
        else:
            self.before_binding.append((key, True))
        finally:
            self.active -= 1

    async def allocated(self, claims: dict[str, frozenset[str]]) -> None:
        await self._enter("allocated", tuple(sorted(claims)))
        try:
            self.views.append(dict(claims))
        finally:
            self.active -= 1

    async def _set_ready(self, claim: ClaimToPrepare) -> None:
        """Set the binding conditions, as a driver does once the devices are ready."""
        ref = claim.ref
        devices = [
            {
                "driver": DRIVER,
                "pool": NODE,
                "device": r["device"],
                "conditions": [{"type": READY, "status": "True", "reason": "Prepared"}],
            }
            for r in claim.results
        ]
        body = {
            "apiVersion": resourceapi.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": devices},
        }
        path = resourceapi.path(CLAIMS, ref.name, namespace=ref.namespace, subresource="status")
        response = await self.client.request(
            "PATCH", path, body=body, content_type=APPLY_PATCH, timeout=5
        )
        # Gone or replaced (404, 409): nothing to set. Away or overloaded: raised, so the
        # watcher tries again later.
        if response.status == 429 or response.status >= 500:
            raise ApiError(
                response.status, "", "setting binding conditions", verb="patch", resource=CLAIMS
            )


def condition_true(claim: JSON, device_name: str, condition: str) -> bool:
    """Whether the claim's status says ``condition`` is True for this pool's device."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
            DRIVER,
            NODE,
            device_name,
        ):
            conditions = entry.get("conditions") or []
            return any(c.get("type") == condition and c.get("status") == "True" for c in conditions)
    return False


def allocation_of(claim: JSON, pool: str) -> Allocation:
    """The allocation key of a claim's devices in ``pool``."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    devices = frozenset(str(r["device"]) for r in results if r.get("pool") == pool)
    return str(claim["metadata"]["uid"]), str(allocation.get("allocationTimestamp", "")), devices


# ----------------------------------------------------------------- the churn


class ClaimChurn:
    """The scheduler and the users: claims created, allocated, deallocated, deleted."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        #: Every allocation made: key -> (pool, kind). Kinds: ``waits`` for binding conditions,
        #: ``broken`` waits too but cannot be read (the watcher must fail it), ``plain``.
        self.allocations: dict[Allocation, tuple[str, str]] = {}
        self._names = itertools.count()
        self._times = itertools.count()

    def step(self) -> None:
        claims = self.cluster.list(CLAIMS)
        unallocated = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        roll = self.rng.random()
        if roll < 0.25 or not claims:
            n = next(self._names)
            self.cluster.create(
                CLAIMS,
                {
                    "metadata": {"name": f"claim-{n}", "namespace": f"ns-{n % 3}"},
                    "spec": {"devices": {"requests": [{"name": "gpu"}]}},
                },
            )
        elif roll < 0.55 and unallocated:
            self._allocate(self.rng.choice(unallocated))
        elif roll < 0.75 and allocated:
            claim = self.rng.choice(allocated)
            claim["status"] = {}
            self.cluster.update(CLAIMS, claim, status=True)
        elif roll < 0.85:
            claim = self.rng.choice(claims)
            self.cluster.delete(CLAIMS, claim["metadata"]["namespace"], claim["metadata"]["name"])
        else:
            claim = self.rng.choice(claims)  # an edit that changes no allocation
            claim["metadata"].setdefault("labels", {})["touched"] = str(next(self._times))
            self.cluster.update(CLAIMS, claim)

    def _allocate(self, claim: JSON) -> None:
        pool = NODE if self.rng.random() < 0.75 else OTHER_NODE
        kind = self.rng.choices(["waits", "broken", "plain"], [0.7, 0.1, 0.2])[0]
        waits = kind != "plain"
        count = self.rng.randint(1, 2)
        results = [
            {
                "request": "gpu",
                "driver": DRIVER,
                "pool": pool,
                "device": f"gpu-{self.rng.randrange(8)}-{i}",
            }
            | (
                {"bindingConditions": [READY], "bindingFailureConditions": [FAILED]}
                if waits
                else {}
            )
            for i in range(count)
        ]
        claim["status"] = {
            "allocation": {
                # The API server stores opaque parameters it cannot check: this is no list.
                "devices": {"results": results, "config": "oops" if kind == "broken" else []},
                # Distinct for every allocation, so each is one key of the binding watcher.
                "allocationTimestamp": f"2026-01-01T00:00:00.{next(self._times):06d}Z",
            }
        }
        stored = self.cluster.update(CLAIMS, claim, status=True)
        self.allocations[allocation_of(stored, pool)] = (pool, kind)


def random_pool(rng: random.Random) -> DesiredPool:
    """A pool of 1..3 slices of 1..3 devices each."""
    indices = iter(range(100))
    groups = [
        [device(next(indices), rng.choice(["40Gi", "80Gi"])) for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(1, 3))
    ]
    return pool_of(*groups)


def foreign_slices() -> list[JSON]:
    """Slices of another node and of another driver on this node: not the controller's."""
    out = []
    for node, driver in ((OTHER_NODE, DRIVER), (NODE, "other.dra.dev")):
        for obj in render_pool(pool_of([device(0)], node=node, driver=driver)):
            obj["metadata"]["name"] = f"foreign-{node}-{driver}"
            out.append(obj)
    return out


def ours(objs: list[JSON]) -> list[JSON]:
    """The slices of this node and driver."""
    return [
        o for o in objs if o["spec"].get("nodeName") == NODE and o["spec"].get("driver") == DRIVER
    ]


class SliceChurn:
    """Someone else: the kubelet deleting slices, an operator editing them, strays."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self._strays = itertools.count()

    def step(self) -> None:
        mine = ours(self.cluster.list(SLICES))
        roll = self.rng.random()
        with contextlib.suppress(ApiStatus):
            if roll < 0.4 and mine:
                victim = self.rng.choice(mine)
                self.cluster.delete(SLICES, "", victim["metadata"]["name"])
            elif roll < 0.75 and mine:
                victim = self.rng.choice(mine)
                devices = victim["spec"].get("devices") or []
                if devices and self.rng.random() < 0.7:
                    devices[0].setdefault("attributes", {})["model"] = {"string": "edited"}
                else:
                    victim["metadata"].setdefault("labels", {})["edited"] = "yes"
                victim["metadata"].pop("resourceVersion", None)
                self.cluster.update(SLICES, victim)
            else:
                stray = render_pool(pool_of([{"name": f"stray-{next(self._strays)}"}]))[0]
                stray["metadata"]["name"] = f"stray-{next(self._strays)}"
                self.cluster.create(SLICES, stray)


# ----------------------------------------------------------------- supervision


class Killable:
    """A supervised loop that can be killed on purpose: from then on it crashes at once,
    each time it is started again, and so never beats its heartbeat."""

    def __init__(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self._run = run
        self.killed = asyncio.Event()

    async def __call__(self) -> None:
        if self.killed.is_set():
            raise RuntimeError(f"{self.name} killed on purpose")
        work = asyncio.ensure_future(self._run())
        kill = asyncio.ensure_future(self.killed.wait())
        try:
            await asyncio.wait({work, kill}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kill.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if self.killed.is_set() and work.cancelled():
            raise RuntimeError(f"{self.name} killed on purpose")
        return work.result()


async def healthy(servicer: LivenessServicer) -> bool:
    """Whether the liveness probe would pass now."""
    answer = await servicer.Check(health_pb2.HealthCheckRequest(), None)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


async def until(done: Callable[[], Awaitable[bool]], within: float, step: float = 0.05) -> bool:
    """Poll ``done()`` until it is true (True) or ``within`` seconds passed (False)."""
    deadline = time.monotonic() + within
    while True:
        if await done():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory short enough for unix socket paths."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="il"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------- one run


class Run:
    """The components of one run, the churn driving them and the checks after."""

    def __init__(self, seed: int, budget: Budget, base: Path, outcome: Outcome) -> None:
        self.seed = seed
        self.budget = budget
        self.base = base
        self.outcome = outcome
        self.rng = random.Random(seed ^ 0x5EED)
        self.cluster = Cluster(random.Random(seed ^ 0xA91), Faults())
        self.node = self.cluster.create(NODES, {"metadata": {"name": NODE}})
        for obj in foreign_slices():
            self.cluster.create(SLICES, obj)
        self.foreign = {o["metadata"]["name"]: o for o in self.cluster.list(SLICES)}
        self.claims = ClaimChurn(self.cluster, random.Random(seed ^ 0xC1A))
        self.slices = SliceChurn(self.cluster, random.Random(seed ^ 0x511))
        self.pool = random_pool(self.rng)
        self.grpc_calls = 0
        self.grpc_answers = 0
        self.killed: str | None = None

    async def main(self) -> None:
        """Serve the cluster, run the components and check them."""
        async with serving(self.cluster) as server, plain_client(server) as client:
            await self._with_client(client)
        await asyncio.sleep(0.05)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        self.outcome.check(not left, f"tasks left running after everything stopped: {left}")

    async def _with_client(self, client: KubeClient) -> None:
        budget = self.budget
        # Slow enough that calls queue up behind the node lock and are merged.
        driver = BindingRecorder(client=client, delay=0.003)
        plugin = Plugin(config_for(self.base), driver, KubeClaimFetcher(client, timeout=5))
        controller = SliceController(
            client,
            driver=DRIVER,
            node_name=NODE,
            debounce=0.02,
            backoff_cap=0.5,
            watch_timeout=(1, 3),
        )

        async def locked(work: Callable[[], Awaitable[None]]) -> None:
            async with plugin.lock.hold():
                await work()

        watcher = BindingWatcher(client, driver, driver_name=DRIVER, pool=NODE, locked=locked)
        heartbeats = Heartbeats(allowed=budget.allowed_silence)
        loops = {
            "publisher": Killable("publisher", controller.run),
            "claim-binding": Killable("claim-binding", watcher.run),
        }
        await plugin.start()
        liveness = LivenessServicer(plugin.paths, heartbeats.problem)
        tasks = [
            asyncio.create_task(
                supervise(name, loop, heartbeats, pulse=budget.pulse, restart_cap=0.2), name=name
            )
            for name, loop in loops.items()
        ]
        try:
            await controller.set_pool(self.pool)
            await self._churn(controller, plugin, liveness)
            for task in tasks:
                self.outcome.check(not task.done(), f"supervised loop {task.get_name()} ended")
            await self._settle(controller, watcher, driver)
            await self._kill_one(loops, liveness)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for task, result in zip(tasks, results, strict=True):
                self.outcome.check(
                    isinstance(result, asyncio.CancelledError),
                    f"supervised loop {task.get_name()} ended with {result!r}",
                )
            await plugin.stop()
        self.outcome.check(driver.overlaps == 0, f"{driver.overlaps} overlapping driver calls")
        self.outcome.stats.update(
            {
                "handed over before binding": len(driver.before_binding),
                "allocations": len(self.claims.allocations),
                "gRPC calls": self.grpc_calls,
                "slice writes": controller.writes,
            }
        )
        self.outcome.check(
            self.grpc_answers == self.grpc_calls,
            f"{self.grpc_calls - self.grpc_answers} gRPC calls never answered",
        )

    # ---------------------------------------------------------------- churn

    async def _churn(
        self, controller: SliceController, plugin: Plugin, liveness: LivenessServicer
    ) -> None:
        self.cluster.faults.enabled = True
        stop = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._every(stop, (0.002, 0.03), self.claims.step))
                group.create_task(self._every(stop, (0.02, 0.15), self.slices.step))
                group.create_task(self._pools(stop, controller))
                for _ in range(2):
                    group.create_task(self._kubelet(stop, plugin))
                group.create_task(self._probe(stop, liveness))
                await asyncio.sleep(self.budget.churn - self.budget.quiet)
                # The last changes come without trouble: the watches are the only news of
                # them, no re-list after an error hides an event a reflector lost.
                self.cluster.faults.enabled = False
                await asyncio.sleep(self.budget.quiet)
                stop.set()
        finally:
            self.cluster.faults.enabled = False

    async def _every(
        self, stop: asyncio.Event, pause: tuple[float, float], step: Callable[[], None]
    ) -> None:
        while not stop.is_set():
            step()
            await asyncio.sleep(self.rng.uniform(*pause))

    async def _pools(self, stop: asyncio.Event, controller: SliceController) -> None:
        # Not in the quiet end: rewriting every slice would re-list past a lost event.
        while not stop.is_set() and self.cluster.faults.enabled:
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))
            self.pool = random_pool(self.rng)
            await controller.set_pool(self.pool)

    async def _kubelet(self, stop: asyncio.Event, plugin: Plugin) -> None:
        """Prepares and unprepares of random claims (some asked twice in one call)."""
        async with channel(plugin.paths.dra) as ch:
            stub = v1_grpc.DRAPluginStub(ch)
            while not stop.is_set():
                claims = self.cluster.list(CLAIMS)
                if not claims:
                    await asyncio.sleep(0.01)
                    continue
                picked = [self.rng.choice(claims) for _ in range(self.rng.randint(1, 3))]
                refs = [plugin_ref(c) for c in picked]
                unprepare = self.rng.random() < 0.3
                request = (unprepare_request if unprepare else prepare_request)(v1_pb2, *refs)
                call = stub.NodeUnprepareResources if unprepare else stub.NodePrepareResources
                # Some calls give up early, as the kubelet does at its deadline: the servicer
                # sees them cancelled half-way, the other calls must not notice.
                hasty = self.rng.random() < 0.15
                self.grpc_calls += 0 if hasty else 1
                try:
                    response = await call(
                        request, timeout=self.rng.uniform(0.001, 0.03) if hasty else 20
                    )
                except grpc.aio.AioRpcError as exc:
                    if not (hasty and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                        self.outcome.failures.append(f"gRPC call failed: {exc!r}")
                    continue
                self.grpc_answers += 0 if hasty else 1
                asked = {r.uid for r in refs}
                self.outcome.check(
                    set(response.claims) == asked,
                    f"answered {sorted(response.claims)}, asked {sorted(asked)}",
                )
                if not unprepare:
                    self._check_prepared(response)
                await asyncio.sleep(self.rng.uniform(0, 0.02))

    def _check_prepared(self, response: Any) -> None:
        """A claim answered prepared had exactly those devices allocated in this pool once."""
        for uid, answer in response.claims.items():
            if answer.error:
                continue
            names = frozenset(d.device_name for d in answer.devices)
            self.outcome.check(
                any(
                    key[0] == uid and key[2] == names and pool == NODE
                    for key, (pool, _kind) in self.claims.allocations.items()
                ),
                f"claim {uid} answered prepared with {sorted(names)}, never allocated so",
            )

    async def _probe(self, stop: asyncio.Event, liveness: LivenessServicer) -> None:
        while not stop.is_set():
            self.outcome.check(await healthy(liveness), "liveness failed while the loops ran")
            await asyncio.sleep(0.2)

    # ---------------------------------------------------------------- convergence

    async def _settle(
        self, controller: SliceController, watcher: BindingWatcher, driver: BindingRecorder
    ) -> None:
        owner = NodeOwner(NODE, self.node["metadata"]["uid"])

        async def slices_converged() -> bool:
            server = ours(self.cluster.list(SLICES))
            mine = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in server}
            seen = {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in controller.slices
            }
            return (
                controller.synced
                and mine == seen
                and plan(server, self.pool, owner, controller.dropped_fields).empty
            )

        async def claims_converged() -> bool:
            return not self._binding_problems(watcher, driver, final=True)

        converged = await until(slices_converged, self.budget.settle)
        self.outcome.check(converged, "slices did not converge: " + self._slice_report(controller))
        if converged:
            self._check_slices(owner)
        if not await until(claims_converged, self.budget.settle):
            self.outcome.failures.extend(self._binding_problems(watcher, driver, final=True))
        self.outcome.failures.extend(self._binding_problems(watcher, driver, final=False))

    def _slice_report(self, controller: SliceController) -> str:
        server = sorted(
            (o["metadata"]["name"], o["metadata"]["resourceVersion"])
            for o in ours(self.cluster.list(SLICES))
        )
        seen = sorted(
            (o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in controller.slices
        )
        return f"synced={controller.synced} server={server} controller={seen}"

    def _check_slices(self, owner: NodeOwner) -> None:
        server = {o["metadata"]["name"]: o for o in ours(self.cluster.list(SLICES))}
        generations = {o["spec"]["pool"]["generation"] for o in server.values()}
        self.outcome.check(len(generations) == 1, f"mixed pool generations {generations}")
        expected = render_pool(self.pool, max(generations, default=1), owner)
        self.outcome.check(
            sorted(server) == sorted(e["metadata"]["name"] for e in expected),
            f"slices {sorted(server)}, expected {[e['metadata']['name'] for e in expected]}",
        )
        for wanted in expected:
            got = server.get(wanted["metadata"]["name"])
            if got is None:
                continue
            self.outcome.check(
                got["spec"] == wanted["spec"], f"slice {wanted['metadata']['name']} differs"
            )
            self.outcome.check(
                got["metadata"].get("ownerReferences") == wanted["metadata"]["ownerReferences"],
                f"slice {wanted['metadata']['name']} has the wrong owner",
            )
        self.outcome.failures.extend(check_pool(list(server.values())))
        foreign = {
            o["metadata"]["name"]: o
            for o in self.cluster.list(SLICES)
            if o["metadata"]["name"] in self.foreign
        }
        self.outcome.check(foreign == self.foreign, "slices of other nodes or drivers changed")

    def _binding_problems(
        self, watcher: BindingWatcher, driver: BindingRecorder, *, final: bool
    ) -> list[str]:
        """What the binding watcher got wrong: ``final`` those that only hold once it
        caught up, else those that must hold at any time."""
        if final:
            return self._binding_outcome(watcher, driver)
        problems = []
        done: set[Allocation] = set()
        for key, ok in driver.before_binding:
            pool, kind = self.claims.allocations.get(key, ("", ""))
            if key in done:
                problems.append(f"allocation {key} handed over again after it was done")
            if pool != NODE or kind != "waits":
                problems.append(f"allocation {key} ({pool!r}, {kind!r}) handed over")
            if ok:
                done.add(key)
        return problems

    def _binding_outcome(self, watcher: BindingWatcher, driver: BindingRecorder) -> list[str]:
        """Whether the watcher caught up with the claims as the server holds them now: its
        view, the driver's last view, and the conditions of each claim waiting for them."""
        claims = self.cluster.list(CLAIMS)
        problems = []
        truth = {
            c["metadata"]["uid"]: allocation_of(c, NODE)[2]
            for c in claims
            if allocation_of(c, NODE)[2]
        }
        if not driver.views or driver.views[-1] != truth:
            last = driver.views[-1] if driver.views else None
            problems.append(f"driver's last view of the allocations {last} != {truth}")
        held = {uid: c["metadata"]["resourceVersion"] for uid, c in watcher._claims.items()}
        want = {
            c["metadata"]["uid"]: c["metadata"]["resourceVersion"]
            for c in claims
            if c["metadata"]["uid"] in truth
        }
        if held != want:
            problems.append(f"binding watcher holds {held}, the server {want}")
        handed = Counter(key for key, _ in driver.before_binding)
        for claim in claims:
            key = allocation_of(claim, NODE)
            pool, kind = self.claims.allocations.get(key, ("", ""))
            if pool != NODE or kind == "plain":
                continue
            condition = READY if kind == "waits" else FAILED
            unset = sorted(d for d in key[2] if not condition_true(claim, d, condition))
            if unset:
                problems.append(
                    f"allocation {key} ({kind}, handed over {handed[key]} times): "
                    f"{condition} not True for {unset}"
                )
        return problems

    # ---------------------------------------------------------------- liveness

    async def _kill_one(self, loops: dict[str, Killable], liveness: LivenessServicer) -> None:
        self.outcome.check(await healthy(liveness), "liveness failed after settling")
        name = self.rng.choice(sorted(loops))
        self.killed = name
        loops[name].killed.set()

        async def unhealthy() -> bool:
            return not await healthy(liveness)

        self.outcome.check(
            await until(unhealthy, self.budget.allowed_silence * 3 + 2, step=0.1),
            f"liveness still passes after the {name} loop was killed",
        )


def plugin_ref(claim: JSON) -> ClaimRef:
    """The kubelet's reference to a claim."""
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def perturbation_for(seed: int) -> Perturbation:
    """How hard a seed pushes the scheduling (seeds differ in that too)."""
    rng = random.Random(seed ^ 0x9E7)
    return Perturbation(
        postpone=rng.uniform(0.1, 0.4),
        delay=rng.uniform(0.02, 0.15),
        max_hops=rng.randint(1, 5),
        max_delay=rng.choice([0.001, 0.004, 0.01]),
    )


def run_seed(
    seed: int, budget: Budget | None = None, perturbation: Perturbation | None = None
) -> Outcome:
    """One run with ``seed`` (see the module); its failures, if any, in the outcome."""
    outcome = Outcome(seed)
    started = time.monotonic()
    loop = InterleavingLoop(seed, perturbation or perturbation_for(seed))
    with short_dir() as base, fresh_loggers() as events:
        scenario = Run(seed, budget or Budget(), base, outcome)
        try:
            run(scenario.main, loop)
        except Exception as exc:
            outcome.failures.append(f"the run raised {exc!r}")
        gc.collect()  # tasks destroyed unfinished, exceptions never retrieved: reported now

    def expected(event: dict[str, Any]) -> bool:
        return event.get("loop") == scenario.killed and "killed on purpose" in str(
            event.get("error", "")
        )

    outcome.failures.extend(crash_events(events, expected))
    outcome.failures.extend(f"stand-in API server: {d}" for d in scenario.cluster.defects)
    for context in loop.unhandled:
        outcome.failures.append(f"unhandled: {context.get('message')} {context.get('exception')!r}")
    outcome.stats.update(loop.stats.counts)
    outcome.stats.update(scenario.cluster.requests)
    outcome.seconds = time.monotonic() - started
    return outcome


def describe(outcome: Outcome) -> str:
    """The failures of a run, with the seed to reproduce it."""
    lines = "\n  ".join(outcome.failures[:20])
    more = len(outcome.failures) - 20
    return (
        f"INTERLEAVE_SEED={outcome.seed} failed ({len(outcome.failures)} problems"
        f"{', first 20 shown' if more > 0 else ''}):\n  {lines}"
    )


# ----------------------------------------------------------------- the bounded suite

#: Seeds of the bounded run: fixed, so a failure here is reproducible as it is.
SEEDS = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("seed", seeds(SEEDS))
def test_components_hold_under_perturbed_scheduling_and_churn(seed: int) -> None:
    outcome = run_seed(seed)
    assert not outcome.failures, describe(outcome)
    # The run did perturb and churn (a silent no-op would pass every check).
    assert outcome.stats["postponed"] and outcome.stats["delayed"], outcome.stats
    assert outcome.stats["POST resourceslices"] and outcome.stats["GET resourceclaims"]


# ----------------------------------------------------------------- defects found, pinned


async def test_a_relist_answered_after_newer_watch_events_does_not_bring_back_stale_slices() -> (
    None
):
    """The reconciler re-lists after a conflict while the watch goes on. When the list's
    answer arrives after the watch already delivered a newer event (here: a slice deleted by
    someone else), the older list must not undo it: the controller would believe the slice
    is still there and never create it again."""
    cluster = Cluster(random.Random(0))
    node = cluster.create(NODES, {"metadata": {"name": NODE}})
    pool = pool_of([device(0)], [device(1)])
    names = [o["metadata"]["name"] for o in render_pool(pool)]
    answered = asyncio.Event()
    release = asyncio.Event()
    conflicts = [names[0]]

    async with serving(cluster) as server, plain_client(server) as client:

        async def put(request: web.Request) -> web.StreamResponse:
            # One update of the first slice is refused: the reconciler re-lists.
            if conflicts and request.path.endswith("/" + conflicts[0]):
                conflicts.clear()
                return web.json_response(ApiStatus(409, "Conflict", "stale").body(), status=409)
            return await cluster.handle(request)

        async def list_or_watch(request: web.Request) -> web.StreamResponse:
            response = await cluster.handle(request)  # the list as the server holds it now
            if request.query.get("watch") != "true" and not conflicts and not release.is_set():
                answered.set()
                await release.wait()  # ... and its answer takes its time
            return response

        server.routes[("PUT", f"{SLICES_PATH}/{names[0]}")] = put
        server.routes[("GET", SLICES_PATH)] = list_or_watch
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool)
            async with asyncio.timeout(5):
                await controller.wait_synced()
            # Someone edits the first slice: the controller's update of it is refused.
            edited = cluster.get(SLICES, "", names[0])
            assert edited is not None
            edited["spec"]["devices"][0]["attributes"]["model"] = {"string": "edited"}
            cluster.update(SLICES, edited)
            async with asyncio.timeout(5):
                await answered.wait()
            # While the re-list's answer is on its way, the kubelet deletes the other slice,
            # and the watch tells the controller.
            cluster.delete(SLICES, "", names[1])

            async def told() -> bool:
                return names[1] not in {o["metadata"]["name"] for o in controller.slices}

            assert await until(told, 5, step=0.005), "the watch did not tell of the delete"
            release.set()
            await deleted_slice_comes_back(cluster, controller, pool, node, task)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_create_answered_after_the_watch_showed_it_deleted_is_created_again() -> None:
    """The answer to a create can be handled after the watch already told of that slice's
    ADDED and DELETED events (someone deleted it at once). The answer must not bring the
    slice back into the controller's view: it would believe the pool published while the
    server has no slice."""
    cluster = Cluster(random.Random(0))
    node = cluster.create(NODES, {"metadata": {"name": NODE}})
    pool = pool_of([device(0)])
    once = [True]

    async with serving(cluster) as server, plain_client(server) as client:
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)

        async def create(request: web.Request) -> web.StreamResponse:
            response = await cluster.handle(request)
            if once:
                once.clear()
                # The kubelet deletes the new slice; the answer waits for the watch's news.
                name = ours(cluster.list(SLICES))[0]["metadata"]["name"]
                gone = cluster.delete(SLICES, "", name)["metadata"]["resourceVersion"]

                async def told() -> bool:
                    return not is_older(controller_seen(controller), gone)

                assert await until(told, 5, step=0.005), "the watch did not tell of the delete"
            return response

        server.routes[("POST", SLICES_PATH)] = create
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool)
            await deleted_slice_comes_back(cluster, controller, pool, node, task)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def controller_seen(controller: SliceController) -> str:
    """The resourceVersion the controller's watch has handed over."""
    return controller._reflector.current


async def deleted_slice_comes_back(
    cluster: Cluster, controller: SliceController, pool: DesiredPool, node: JSON, task: Any
) -> None:
    """Assert the controller publishes ``pool`` again and knows the server's slices."""
    owner = NodeOwner(NODE, node["metadata"]["uid"])

    async def converged() -> bool:
        assert not task.done(), task
        listed = ours(cluster.list(SLICES))
        server = {o["metadata"]["name"] for o in listed}
        seen = {o["metadata"]["name"] for o in controller.slices}
        return controller.synced and server == seen and plan(listed, pool, owner).empty

    assert await until(converged, 5, step=0.02), (
        "the deleted slice never came back: the server has "
        f"{sorted(o['metadata']['name'] for o in ours(cluster.list(SLICES)))}, the "
        f"controller believes {sorted(o['metadata']['name'] for o in controller.slices)}"
    )


async def test_a_pool_set_while_writes_pause_is_what_the_controller_writes_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds that do not settle the pool (another writer undoes every write) make the
    controller pause before its next write. The plan of that write must be made after the
    pause: made before it, a pool set meanwhile (a GPU's taint, say) was overwritten by the
    older one first, and the slices showed the older devices for another round."""
    cluster = Cluster(random.Random(0))
    node = cluster.create(NODES, {"metadata": {"name": NODE}})
    first = pool_of([device(0)])
    second = pool_of([device(0, memory="40Gi")])
    fight = [True]
    written: list[str] = []
    paused, resume = asyncio.Event(), asyncio.Event()

    class PausesHeld:
        """The controller's asyncio, whose backoff pauses last until the test resumes them
        (its debounce sleeps are short and pass)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(delay: float) -> None:
            if delay < 0.1:
                await asyncio.sleep(delay)
                return
            paused.set()
            await resume.wait()

    monkeypatch.setattr(controller_module, "asyncio", PausesHeld())

    async with serving(cluster) as server, plain_client(server) as client:

        async def write(request: web.Request) -> web.StreamResponse:
            if request.method not in ("POST", "PUT") or not request.path.startswith(SLICES_PATH):
                return await cluster.handle(request)
            response = await cluster.handle(request)
            (stored,) = ours(cluster.list(SLICES))
            written.append(stored["spec"]["devices"][0]["capacity"]["memory"]["value"])
            if fight:
                (undone,) = ours(cluster.list(SLICES))
                undone["spec"]["devices"][0]["attributes"]["model"] = {"string": "undone"}
                cluster.update(SLICES, undone)
            return response

        server.fallback = write
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(first)
            async with asyncio.timeout(5):
                await paused.wait()
            fight.clear()
            await controller.set_pool(second)
            since = len(written)
            resume.set()
            await deleted_slice_comes_back(cluster, controller, second, node, task)
            assert written[since:] == ["40Gi"], written
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_slices_published_without_their_node_as_owner_are_adopted_at_start() -> None:
    """Slices an earlier run wrote while the Node was unreadable have no owner reference. A
    later agent whose pool is the same must still add it (else deleting the Node leaves them
    behind): a plan without an owner found them unchanged and wrote nothing."""
    cluster = Cluster(random.Random(0))
    node = cluster.create(NODES, {"metadata": {"name": NODE}})
    pool = pool_of([device(0)], [device(1)])
    for obj in render_pool(pool):
        cluster.create(SLICES, obj)
    assert all("ownerReferences" not in o["metadata"] for o in ours(cluster.list(SLICES)))

    async with serving(cluster) as server, plain_client(server) as client:
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool)
            await deleted_slice_comes_back(cluster, controller, pool, node, task)
            for obj in ours(cluster.list(SLICES)):
                (ref,) = obj["metadata"]["ownerReferences"]
                assert (ref["kind"], ref["uid"]) == ("Node", node["metadata"]["uid"]), obj
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_slice_a_newer_agent_created_again_during_a_round_is_not_deleted() -> None:
    """A round that updates one slice and deletes another (the pool shrank) deletes the slice
    it planned against. When a newer agent (a rolling update) deleted and created that name
    again while the update was on the wire, and the watch has shown it, the delete must be
    conditional on the planned slice's uid: it fails, the newer agent's slice stays, and
    this agent yields to it (was: the uid was read at delete time, the new slice's)."""
    cluster = Cluster(random.Random(0))
    cluster.create(NODES, {"metadata": {"name": NODE}})
    two = pool_of([device(0)], [device(1)])
    one = pool_of([device(0, memory="40Gi")])
    names = [o["metadata"]["name"] for o in render_pool(two)]
    newer = Publisher(2, "newer")
    key = annotation_key(DRIVER)
    armed: list[bool] = []

    async with serving(cluster) as server, plain_client(server) as client:
        controller = SliceController(
            client, driver=DRIVER, node_name=NODE, debounce=0.01, publisher=Publisher(1, "older")
        )

        async def put(request: web.Request) -> web.StreamResponse:
            response = await cluster.handle(request)
            if armed:
                armed.clear()
                old = cluster.get(SLICES, "", names[1])
                assert old is not None
                cluster.delete(SLICES, "", names[1])
                metadata = {
                    "name": names[1],
                    "annotations": {**old["metadata"]["annotations"], key: newer.annotation()},
                }
                again = cluster.create(SLICES, {**old, "metadata": metadata})
                uid = again["metadata"]["uid"]

                async def seen() -> bool:
                    return any(o["metadata"]["uid"] == uid for o in controller.slices)

                assert await until(seen, 5, step=0.005), "the watch did not show the new slice"
            return response

        server.routes[("PUT", f"{SLICES_PATH}/{names[0]}")] = put
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(two)
            async with asyncio.timeout(5):
                await controller.wait_synced()
            armed.append(True)
            await controller.set_pool(one)

            async def yielded() -> bool:
                assert not task.done(), task
                return not armed and controller._yielded_to == newer

            assert await until(yielded, 5, step=0.01), "the controller did not yield"
            survivor = cluster.get(SLICES, "", names[1])
            assert survivor is not None, "the newer agent's slice was deleted"
            assert survivor["metadata"]["annotations"][key] == newer.annotation()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("relist_fails", [False, True])
async def test_a_create_racing_an_earlier_agents_own_slice_is_not_blamed_on_others(
    relist_fails: bool,
) -> None:
    """Our create conflicts with this node's own slice, made by an earlier agent just before
    and not yet shown by the watch. That is a race, not a slice of another node or driver
    holding the name: even when the re-list after the conflict fails, the agent must not
    tell the operator to delete the slice."""
    from structlog.testing import capture_logs

    cluster = Cluster(random.Random(0))
    cluster.create(NODES, {"metadata": {"name": NODE}})
    pool = pool_of([device(0)])
    earlier = render_pool(pool)[0]
    first = [True]
    failed_lists: list[bool] = []

    async def post(request: web.Request) -> web.StreamResponse:
        if first:
            first.clear()
            cluster.create(SLICES, earlier)
        return await cluster.handle(request)

    with capture_logs() as logs:
        async with serving(cluster) as server, plain_client(server) as client:
            server.routes[("POST", SLICES_PATH)] = post
            controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)
            relist = controller._relist

            async def relist_once_failing() -> str:
                if relist_fails and not first and not failed_lists:
                    failed_lists.append(True)
                    raise aiohttp.ClientConnectionError("connection reset")
                return await relist()

            controller._relist = relist_once_failing  # type: ignore[method-assign]
            task = asyncio.create_task(controller.run())
            try:
                await controller.set_pool(pool)
                async with asyncio.timeout(5):
                    await controller.wait_synced()
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert failed_lists == ([True] if relist_fails else [])
    assert not [e for e in logs if "is taken by a ResourceSlice" in e["event"]], logs
