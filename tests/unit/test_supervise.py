"""Background loops: a crash is logged with the loop's name, counted and recovered from, and a
loop that stops beating fails liveness."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from dra_driver import supervise as supervise_module
from dra_driver.agent import NodeAgent, build_state
from dra_driver.claimreport import DeviceStatus
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.health.injected import INJECT_FILE, inject
from dra_driver.kubeletplugin.interfaces import ClaimRef
from dra_driver.settings import Settings
from dra_driver.supervise import Heartbeats, supervise

FAST = {"pulse": 0.05, "restart_cap": 0.05}


@pytest.fixture(autouse=True)
def fresh_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A logger proxy of its own: the module's may have cached the configuration in force
    when an earlier test first used it, and then capture_logs would see nothing."""
    monkeypatch.setattr(supervise_module, "log", structlog.get_logger(supervise_module.__name__))


def _crashes(loop: str) -> float:
    return REGISTRY.get_sample_value("dra_driver_loop_crashes_total", {"loop": loop}) or 0.0


async def _until(check: Callable[[], Any], what: str) -> None:
    """Poll ``check`` (state changed by other tasks, no event to wait on) for up to 5 s."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within 5 s: {what}")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    settings = Settings(
        node_name="node-a",
        backend="simulated",
        profile="l4x4",
        cdi_root=tmp_path / "cdi",
        plugins_dir=tmp_path / "plugins",
        registry_dir=tmp_path / "registry",
    )
    inventory = SimulatedDiscovery("l4x4", "node-a").discover()
    yield NodeAgent(settings, inventory, build_state(settings, inventory), client=None)


async def _supervised(
    agent: NodeAgent, name: str, crashed: asyncio.Event, recovered: Callable[[], bool]
) -> list[dict[str, Any]]:
    """Run the agent's loop ``name`` supervised until it crashed and recovered; its logs."""
    before = _crashes(name)
    with capture_logs() as logs:
        task = asyncio.create_task(supervise(name, agent.background_loops()[name], agent.heartbeats, **FAST))
        try:
            await _until(crashed.is_set, f"{name} crashed")
            await _until(recovered, f"{name} recovered")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert _crashes(name) == before + 1
    return [e for e in logs if e["event"] == "background loop crashed"]


def _crash_once(crashed: asyncio.Event, real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not crashed.is_set():
            crashed.set()
            raise RuntimeError("injected crash")
        return real(*args, **kwargs)

    return wrapper


async def test_publisher_reconcile_crash_is_seen_and_recovered(
    agent: NodeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed = asyncio.Event()
    runs = 0

    async def reconcile() -> None:
        nonlocal runs
        runs += 1
        if not crashed.is_set():
            crashed.set()
            raise RuntimeError("injected crash")
        await asyncio.Event().wait()

    async def idle() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(agent.slices, "_reconcile_loop", reconcile)
    monkeypatch.setattr(agent.slices, "_watch_loop", idle)
    logs = await _supervised(agent, "publisher", crashed, lambda: runs == 2)
    assert [(e["loop"], e["error"]) for e in logs] == [("publisher", "RuntimeError: injected crash")]


async def test_claim_reporter_crash_is_seen_and_recovered(
    agent: NodeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed = asyncio.Event()
    applied: list[str] = []

    async def apply(ref: ClaimRef, devices: list[DeviceStatus]) -> None:
        if not crashed.is_set():
            crashed.set()
            raise RuntimeError("injected crash")
        applied.append(ref.uid)

    monkeypatch.setattr(agent.reporter, "_apply", apply)
    monkeypatch.setattr(agent.reporter, "_delay", 0.0)
    agent.reporter.set_devices(ClaimRef("ns", "a", "uid-a"), [DeviceStatus("gpu-0", {})])

    async def report_again() -> None:
        await _until(crashed.is_set, "crash")
        agent.reporter.set_devices(ClaimRef("ns", "b", "uid-b"), [DeviceStatus("gpu-1", {})])

    feeder = asyncio.create_task(report_again())
    logs = await _supervised(agent, "claim-reporter", crashed, lambda: "uid-b" in applied)
    await feeder
    assert [e["loop"] for e in logs] == ["claim-reporter"]


async def test_health_watcher_crash_is_seen_and_recovered(agent: NodeAgent) -> None:
    crashed = asyncio.Event()
    real = agent.on_health_event
    agent.on_health_event = _crash_once(crashed, real)  # type: ignore[method-assign]
    inject(agent.state.state_dir / INJECT_FILE, agent.inventory.gpus[0].uuid, {"xid": 79})
    # After the restart the watcher reads the file afresh and the event reaches the tracker.
    logs = await _supervised(agent, "health", crashed, lambda: bool(agent.health.unhealthy()))
    assert [e["loop"] for e in logs] == ["health"]


async def test_a_loop_that_returns_is_restarted_and_logged() -> None:
    runs = 0

    async def quits() -> None:
        nonlocal runs
        runs += 1
        if runs > 1:
            await asyncio.Event().wait()

    with capture_logs() as logs:
        task = asyncio.create_task(supervise("quitter", quits, Heartbeats(), **FAST))
        await _until(lambda: runs == 2, "restart")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [e["event"] for e in logs if e.get("loop") == "quitter"] == ["background loop ended unexpectedly"]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_loop_that_keeps_crashing_stops_beating() -> None:
    clock = _Clock()
    beats = Heartbeats(allowed=10.0, clock=clock)

    async def crashes() -> None:
        raise RuntimeError("always")

    async def runs() -> None:
        await asyncio.Event().wait()

    tasks = [
        asyncio.create_task(supervise("bad", crashes, beats, **FAST)),
        asyncio.create_task(supervise("good", runs, beats, **FAST)),
    ]
    try:
        await asyncio.sleep(0.3)
        assert beats.problem() is None  # both registered just now
        clock.now = 11.0
        await asyncio.sleep(0.3)  # "good" beats again within a few pulses, "bad" never runs long
        assert beats.stale() == ["bad"]
        assert beats.problem() == "background loops not alive: bad"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_cancel_stops_the_loop_and_its_supervisor() -> None:
    cancelled = asyncio.Event()

    async def loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    task = asyncio.create_task(supervise("x", loop, Heartbeats(), **FAST))
    await asyncio.sleep(0.1)
    task.cancel()
    results: list[Awaitable[Any] | BaseException] = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError) and cancelled.is_set()


async def test_a_loop_that_raises_cancelled_error_itself_is_restarted_and_logged() -> None:
    # A call cancelled beneath the loop (an inner task, a gRPC call) raises CancelledError
    # although nobody cancelled the supervisor: a crash like any other, not an exit.
    runs = 0

    async def cancelled_beneath() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise asyncio.CancelledError
        await asyncio.Event().wait()

    with capture_logs() as logs:
        task = asyncio.create_task(supervise("inner", cancelled_beneath, Heartbeats(), **FAST))
        await _until(lambda: runs == 2 or task.done(), "restart")
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [e["event"] for e in logs if e.get("loop") == "inner"] == ["background loop crashed"]
