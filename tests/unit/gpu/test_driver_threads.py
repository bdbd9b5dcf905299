"""Where the GPU driver runs its transactions: plain batches on the loop, the rest in a thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.gpu.state.claim_model import CONFIGS

NODE = "node-1"
DRIVER = "gpu.dra.dev"


class _Recording(DeviceState):
    """Notes the thread each transaction ran in."""

    threads: list[int]

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().prepare(*args, **kwargs)

    def unprepare(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().unprepare(*args, **kwargs)


def _driver(tmp_path: Path) -> tuple[GpuDriver, _Recording]:
    state = _Recording(
        inventory=SimulatedDiscovery("mixed", NODE).discover(),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
    )
    state.threads = []
    return GpuDriver(state), state


def _claim(uid: str, device: str, config: tuple[dict[str, Any], ...] = ()) -> ClaimToPrepare:
    result = {"request": "req0", "driver": DRIVER, "pool": NODE, "device": device}
    return ClaimToPrepare(ClaimRef("ns", f"claim-{uid}", uid), {}, (result,), config)


async def test_a_lone_plain_claim_is_prepared_and_unprepared_on_the_loop(tmp_path: Path) -> None:
    driver, state = _driver(tmp_path)
    claim = _claim("a", "gpu-2")
    assert isinstance((await driver.prepare([claim]))["a"], list)
    assert await driver.unprepare([claim.ref]) == {"a": None}
    assert state.threads == [threading.get_ident()] * 2


async def test_a_claim_with_a_sharing_step_goes_to_a_thread(tmp_path: Path) -> None:
    driver, state = _driver(tmp_path)
    claim = _claim("a", "gpu-2", CONFIGS["timeslice"])
    assert isinstance((await driver.prepare([claim]))["a"], list)
    assert await driver.unprepare([claim.ref]) == {"a": None}
    assert threading.get_ident() not in state.threads
