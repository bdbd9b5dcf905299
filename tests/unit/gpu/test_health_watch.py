"""The agent's NVML health loop ends when its event thread ends, so supervision sees it.

NVML itself is replaced here (``pynvml`` functions patched in-process): these tests are about
what the asyncio side learns when the thread cannot watch, not about NVML's answers (those
are tested against the stand-in library in ``test_nvml_health.py``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import REGISTRY

from dra_driver.agent import NodeAgent, build_state
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.health.nvml import WatchEnded
from dra_driver.gpu.health.tracker import FRAGMENTED_HOLD, HealthEvent
from dra_driver.kubeletplugin.interfaces import HealthStatus
from dra_driver.settings import Settings
from dra_driver.supervise import Heartbeats, supervise


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    """An agent over a simulated inventory whose health loop takes the NVML path."""
    settings = Settings(
        node_name="node-a",
        backend="simulated",
        profile="l4x4",
        cdi_root=tmp_path / "cdi",
        plugins_dir=tmp_path / "plugins",
        registry_dir=tmp_path / "registry",
    )
    inventory = SimulatedDiscovery("l4x4", "node-a").discover()
    agent = NodeAgent(settings, inventory, build_state(settings, inventory), client=None)
    agent.settings = settings.model_copy(update={"backend": "nvml"})
    yield agent


def _nvml_error(code: int) -> Callable[..., Any]:
    def fail(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return fail


def _raise(error: Exception) -> Callable[..., Any]:
    def fail(*_: Any) -> Any:
        raise error

    return fail


def _nothing(*_: Any) -> None:
    return None


def _init_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def _event_set_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _nothing)
    monkeypatch.setattr(pynvml, "nvmlShutdown", _nothing)
    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", _nvml_error(pynvml.NVML_ERROR_UNKNOWN))


def _lookup_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _nothing)
    monkeypatch.setattr(pynvml, "nvmlShutdown", _nothing)
    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: object())
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", _nothing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", _raise(KeyError("bug")))


def _watcher_threads() -> list[threading.Thread]:
    """Event threads still running (settling the future is the last thing a thread does)."""
    threads = [t for t in threading.enumerate() if t.name == "nvml-events"]
    for thread in threads:
        thread.join(timeout=2)
    return [t for t in threads if t.is_alive()]


async def _outcome(run: Callable[[], Awaitable[None]]) -> Exception:
    """What ``run()`` raised, failing the test if it ran on (or returned)."""
    try:
        await asyncio.wait_for(run(), 5)
    except TimeoutError:
        pytest.fail("the health loop outlived its thread")
    except Exception as exc:  # the thread's own error, of any type
        return exc
    pytest.fail("the health loop returned without an error")


@pytest.mark.parametrize(
    ("breaks", "error"),
    [
        (_init_fails, WatchEnded("NVML did not initialise: Driver Not Loaded")),
        (_event_set_fails, WatchEnded("no NVML event set: Unknown Error")),
        (_lookup_raises, KeyError("bug")),
    ],
    ids=["init", "event-set", "unexpected"],
)
async def test_health_loop_ends_when_its_thread_ends(
    agent: NodeAgent,
    monkeypatch: pytest.MonkeyPatch,
    breaks: Callable[[pytest.MonkeyPatch], None],
    error: Exception,
) -> None:
    breaks(monkeypatch)
    raised = await _outcome(agent.background_loops()["health"])
    assert (type(raised), str(raised)) == (type(error), str(error))
    assert _watcher_threads() == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _crashes() -> float:
    sample = REGISTRY.get_sample_value("dra_driver_loop_crashes_total", {"loop": "health"})
    return sample or 0.0


async def test_a_health_watch_that_cannot_start_fails_liveness(
    agent: NodeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    _init_fails(monkeypatch)
    clock = _Clock()
    beats = Heartbeats(allowed=10.0, clock=clock)
    before = _crashes()
    loop = agent.background_loops()["health"]
    task = asyncio.create_task(supervise("health", loop, beats, pulse=0.05, restart_cap=0.05))
    try:
        for _ in range(500):  # restarted with backoff, again and again
            if _crashes() >= before + 3:
                break
            await asyncio.sleep(0.01)
        assert _crashes() >= before + 3, "the health loop was not restarted"
        assert beats.problem() is None  # registered when supervision started
        clock.now = 11.0
        await asyncio.sleep(0.3)  # many pulses: a loop that stayed up would beat again
        assert beats.problem() == "background loops not alive: health"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_no_free_placement_is_not_rechecked_away_before_its_hold(
    agent: NodeAgent,
) -> None:
    # Re-checks more often than FRAGMENTED_HOLD: the probe finds the GPU healthy (it is),
    # which must not untaint it before the hold is over.
    uuid = agent.inventory.gpus[0].uuid
    at = time.monotonic()
    agent.on_no_placement((uuid,), "no placement of 3g.40gb is free")
    try:
        assert agent.health.taints()["gpu-0"][0]["key"].endswith("/mig-fragmented")
        assert agent.health.due(at + FRAGMENTED_HOLD / 2, 10.0) == []
        assert agent.health.due(at + FRAGMENTED_HOLD + 1, 10.0) == [uuid]
    finally:
        tasks = list(agent._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_health_taints_outlive_an_agent_restart(agent: NodeAgent) -> None:
    """NVML reports an Xid once, to the agent running then: the next agent (an upgrade, a
    crash) keeps the GPU tainted, with the same timeAdded, until a re-check finds it
    healthy (was: the new agent published every GPU untainted, a GPU waiting for a reset
    included, and never tainted it again)."""
    gpus = [g.uuid for g in agent.inventory.gpus]
    agent.on_health_event(HealthEvent(gpus[1], "xid", 79))
    agent.on_health_event(HealthEvent(gpus[2], "gpu-lost"))
    agent.on_health_event(HealthEvent(gpus[3], "xid", 94))
    agent.on_no_placement((gpus[0],), "no placement free")  # a hold, not health: not kept
    assert agent.health.recover(gpus[3])  # a re-check found it healthy
    agent.on_recovered(gpus[3], {"gpu-3": "critical Xid 94 error"})
    taints = agent.health.taints()
    tasks = list(agent._tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    inventory = SimulatedDiscovery("l4x4", "node-a").discover()
    restarted = NodeAgent(
        agent.settings, inventory, build_state(agent.settings, inventory), client=None
    )
    assert restarted.health.taints() == {"gpu-1": taints["gpu-1"], "gpu-2": taints["gpu-2"]}
    health = {d.device_name: d.status for d in restarted.health.device_health("node-a")}
    assert health["gpu-1"] == health["gpu-2"] == HealthStatus.UNHEALTHY
    assert health["gpu-0"] == health["gpu-3"] == HealthStatus.HEALTHY
    # ...and a re-check clears them as before.
    assert restarted.health.due(time.monotonic() + 3600, 60.0) == sorted(gpus[1:3])
    # Without re-checks a restart is what clears them, as the setting says.
    never = agent.settings.model_copy(update={"health_recheck_interval": 0})
    cleared = NodeAgent(never, inventory, build_state(never, inventory), client=None)
    assert cleared.health.taints() == {}
