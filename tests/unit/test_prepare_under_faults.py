"""Claims prepared through the real plugin and GPU driver while the filesystem fails, then a
restart: every claim the kubelet was told is prepared is still known, with a valid CDI spec.

Each fault hits one call (the Nth create, write, fsync or rename of the writer) somewhere in a
sequence of prepares, one claim per call, as the kubelet sends them; a claim that failed is
retried once, as the kubelet retries. The restart is a new ``DeviceState`` on the same dirs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin import Plugin
from tests.unit.cdi_schema import schema_errors
from tests.unit.faultfs import FaultFS
from tests.unit.kubeletplugin.helpers import (
    DRIVER,
    NODE,
    FakeFetcher,
    channel,
    config_for,
    make_claim,
    prepare_request,
)

INVENTORY = SimulatedDiscovery("mixed", NODE).discover()
DEVICES = ["gpu-2", "gpu-3"]
# Two plain claims make these calls (each claim: one CDI spec written through a temp file and
# a rename without fsync, then one journal batch of one write and one fdatasync); a fault
# lands in each of them.
POINTS = [
    pytest.param(op, kind, nth)
    for op, kinds, last in [
        ("create", ("ENOSPC", "EIO"), 2),
        ("write", ("ENOSPC", "EIO", "short"), 4),
        ("fsync", ("ENOSPC", "EIO"), 2),
        ("rename", ("EIO",), 2),
    ]
    for kind in kinds
    for nth in range(1, last + 1)
]


@pytest.fixture
def base() -> Iterator[Path]:
    # Short enough for AF_UNIX socket paths.
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="ff"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _state(base: Path) -> DeviceState:
    return DeviceState(
        inventory=INVENTORY,
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=base / "cdi",
        state_dir=base / "plugins" / DRIVER,
        boot_id="boot-1",
    )


async def _prepare_all(base: Path, faultfs: FaultFS, fault: tuple[str, str, int]) -> set[str]:
    """Prepare one claim per device with the fault armed; returns the UIDs answered prepared."""
    fetcher = FakeFetcher()
    plugin = Plugin(config_for(base), GpuDriver(_state(base)), fetcher)
    answered: set[str] = set()
    errors: list[str] = []
    await plugin.start()
    try:
        op, kind, nth = fault
        faultfs.arm(op, nth, kind)
        async with channel(plugin.paths.dra) as ch:
            stub = v1_grpc.DRAPluginStub(ch)
            for i, device in enumerate(DEVICES):
                uid = f"0000000{i}-0000-4000-8000-000000000000"
                results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
                ref = fetcher.add(make_claim(uid, results=results))
                for _attempt in range(2):  # the kubelet retries a failed prepare
                    resp = await stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10)
                    outcome = resp.claims[uid]
                    if not outcome.error:
                        answered.add(uid)
                        break
                    errors.append(outcome.error)
    finally:
        faultfs.clear()
        await plugin.stop()
    for error in errors:
        assert "cannot write" in error or "cannot sync directory" in error, error
    return answered


@pytest.mark.parametrize(("op", "kind", "nth"), POINTS)
async def test_answered_claims_survive_a_restart(
    base: Path, faultfs: FaultFS, op: str, kind: str, nth: int
) -> None:
    answered = await _prepare_all(base, faultfs, (op, kind, nth))
    assert faultfs.injected, "the fault point was never reached"
    restarted = _state(base)
    known = restarted.prepared_claims()
    assert answered <= set(known), f"answered prepared but lost: {answered - set(known)}"
    for uid in known:
        spec = json.loads(restarted.spec_path(uid).read_text())
        assert schema_errors(spec) == []
    leftovers = [p.name for d in (base / "cdi", base / "plugins" / DRIVER) for p in d.iterdir()]
    assert not [n for n in leftovers if n.endswith(".tmp")], leftovers
