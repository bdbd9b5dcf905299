"""The device catalogue: ``dra-driver slices`` prints exactly what the agent publishes, and
prepare finds every published device behind the same name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver import logs
from dra_driver.agent import NodeAgent, build_mig, build_state
from dra_driver.cli import main
from dra_driver.gpu.discovery.simulated import BUILTIN_PROFILES, SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.resourceslice.pool import render_pool
from dra_driver.settings import Settings

NODE = "node-a"
DRIVER = "gpu.dra.dev"


@pytest.mark.parametrize("shared", ["", "all"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_slices_command_prints_what_the_agent_publishes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    profile: str,
    dynamic: bool,
    shared: str,
) -> None:
    # The process-wide log configuration caches loggers on first use, which would keep later
    # tests from capturing the logs of the agent's parts built here.
    monkeypatch.setattr(logs, "configure", lambda *_: None)
    flags = ["--backend", "simulated", "--profile", profile, "--node-name", NODE]
    flags += ["--shared-gpus", shared] if shared else []
    flags += ["--dynamic-mig", "true"] if dynamic else []
    assert main(["slices", *flags, "-o", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)["items"]  # a v1 List

    settings = Settings(
        backend="simulated",
        profile=profile,
        node_name=NODE,
        driver_name=DRIVER,
        shared_gpus=shared,
        dynamic_mig=dynamic,
        plugins_dir=tmp_path / "plugins",
        registry_dir=tmp_path / "registry",
        cdi_root=tmp_path / "cdi",
    )
    inventory = SimulatedDiscovery(profile, NODE).discover()
    mig = build_mig(settings, inventory)
    agent = NodeAgent(settings, inventory, build_state(settings, inventory, mig), None, mig)
    published = render_pool(agent.publishing.pool(NODE, DRIVER, agent.health.taints()))

    assert printed == published
    # Counters for every MIG-capable GPU that is not shared ("all" shares those not in MIG mode).
    partitioned = any(
        g.mig.capable and not (shared == "all" and not g.mig_enabled) for g in inventory.gpus
    )
    assert any(s["spec"].get("sharedCounters") for s in printed) == (dynamic and partitioned)
    if shared:
        devices = [d for s in printed for d in s["spec"].get("devices") or []]
        assert any(d.get("allowMultipleAllocations") for d in devices)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_every_published_device_has_what_backs_it(profile: str, dynamic: bool) -> None:
    inventory = SimulatedDiscovery(profile, NODE).discover()
    catalog = build_catalog(inventory, dynamic=dynamic)
    for device in catalog.published():
        entry = catalog.get(device["name"])
        assert entry is not None and entry.device == device
        uuid = device["attributes"].get("uuid", {}).get("string")
        if entry.mig is not None:
            assert uuid == entry.mig.uuid
        elif entry.placement is not None:
            assert uuid is None and entry.placement.device_name == device["name"]
        else:
            assert uuid == entry.gpu.uuid


def test_dynamic_catalogue_still_knows_existing_mig_devices() -> None:
    # mixed: gpu-0 is in MIG mode with MIG devices; with dynamic MIG they are not published,
    # but a claim prepared for one before the switch must still be understood.
    inventory = SimulatedDiscovery("mixed", NODE).discover()
    static = build_catalog(inventory)
    dynamic = build_catalog(inventory, dynamic=True)
    existing = [n for n, e in static.entries.items() if e.mig is not None]
    assert existing
    published = {d["name"] for d in dynamic.published()}
    for name in existing:
        entry = dynamic.get(name)
        assert entry is not None
        assert (entry.device is None) == (name not in published)


async def test_without_device_taints_unhealthy_devices_are_withdrawn() -> None:
    from dra_driver.gpu.publish.publisher import NodePublishing

    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    publishing = NodePublishing(None, inventory)
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}

    def devices() -> dict[str, dict[str, object]]:
        pool = render_pool(publishing.pool(NODE, DRIVER, {"gpu-1": [taint]}))
        return {d["name"]: d for s in pool for d in s["spec"].get("devices") or []}

    assert devices()["gpu-1"]["taints"] == [taint]
    assert list(await publishing.on_dropped(frozenset({"DRADeviceTaints"}))) == ["DRADeviceTaints"]
    assert not publishing.taints_supported
    assert "gpu-1" not in devices() and "gpu-0" in devices()
    assert not any("taints" in d for d in devices().values())
