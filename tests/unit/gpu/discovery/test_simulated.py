"""The simulated backend: built-in profiles carry the real product facts; bad profiles fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.simulated import (
    BUILTIN_PROFILES,
    SimulatedDiscovery,
    build_inventory,
    builtin_products,
    load_profile,
    overlaps,
)
from dra_driver.gpu.inventory import MIB


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_load(name: str) -> None:
    inventory = SimulatedDiscovery(name, "node-a").discover()
    assert inventory.gpus
    assert [g.index for g in inventory.gpus] == list(range(len(inventory.gpus)))
    assert len({g.uuid for g in inventory.gpus}) == len(inventory.gpus)
    assert len({g.pci_bus_id for g in inventory.gpus}) == len(inventory.gpus)


def test_dgx_h100_facts() -> None:
    inventory = SimulatedDiscovery("dgx-h100", "n1").discover()
    assert len(inventory.gpus) == 8
    gpu = inventory.gpus[0]
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert gpu.architecture == "Hopper"
    assert gpu.cuda_compute_capability == "9.0"
    assert gpu.multiprocessors == 132
    assert gpu.memory_bytes == 81559 * MIB
    assert gpu.mig.capable and not gpu.mig_enabled
    profiles = {p.name: p for p in gpu.mig_profiles}
    assert set(profiles) == {
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    }
    assert [p.start for p in profiles["3g.40gb"].placements] == [0, 4]
    assert {p.size for p in profiles["3g.40gb"].placements} == {4}
    assert [p.start for p in profiles["1g.20gb"].placements] == [0, 2, 4, 6]
    assert profiles["7g.80gb"].multiprocessors == 132
    assert profiles["1g.10gb"].profile_id == 19 and profiles["1g.10gb"].instance_count == 7


def test_dgx_a100_facts() -> None:
    gpu = SimulatedDiscovery("dgx-a100", "n1").discover().gpus[0]
    assert gpu.product_name == "NVIDIA A100-SXM4-40GB"
    assert gpu.multiprocessors == 108 and gpu.memory_bytes == 40 * 1024 * MIB
    sms = {p.name: p.multiprocessors for p in gpu.mig_profiles}
    assert sms == {
        "1g.5gb": 14,
        "1g.5gb+me": 14,
        "1g.10gb": 14,
        "2g.10gb": 28,
        "3g.20gb": 42,
        "4g.20gb": 56,
        "7g.40gb": 98,
    }


def test_l4_is_not_mig_capable() -> None:
    inventory = SimulatedDiscovery("l4x4", "n1").discover()
    assert len(inventory.gpus) == 4
    assert all(not g.mig.capable and not g.mig_profiles for g in inventory.gpus)
    assert inventory.gpus[0].cuda_compute_capability == "8.9"


def test_mixed_has_existing_mig_devices() -> None:
    inventory = SimulatedDiscovery("mixed", "n1").discover()
    a100, h100_mig, h100, l4 = inventory.gpus
    assert a100.mig_enabled and [m.profile_name for m in a100.mig_devices] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
    ]
    assert h100_mig.mig_enabled and len(h100_mig.mig_devices) == 3
    assert not h100.mig_enabled and not l4.mig.capable
    for gpu in (a100, h100_mig):
        placed = [m.placement for m in gpu.mig_devices]
        assert not any(overlaps(a, b) for i, a in enumerate(placed) for b in placed[i + 1 :])
        assert all(m.uuid.startswith("MIG-") for m in gpu.mig_devices)


def test_every_placement_fits_the_eight_slice_axis() -> None:
    for product in builtin_products().values():
        for profile in product.mig_profiles:
            assert len(profile.placements) >= profile.instances or profile.instances == 1
            for p in profile.placements:
                assert p.start >= 0 and p.start + p.size <= 8, (product.name, profile.name)


def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    a1 = SimulatedDiscovery("mixed", "a").discover()
    a2 = SimulatedDiscovery("mixed", "a").discover()
    b = SimulatedDiscovery("mixed", "b").discover()
    assert a1 == a2
    assert {g.uuid for g in a1.gpus}.isdisjoint(g.uuid for g in b.gpus)


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return str(path)


def test_profile_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
gpus:
  - {product: NVIDIA L4, pciBusId: "0000:01:00.0", minor: 3}
""",
    )
    inventory = SimulatedDiscovery(path, "n").discover()
    assert inventory.driver_version == "550.54.15"
    assert inventory.gpus[0].minor == 3 and inventory.gpus[0].numa_node is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("gpus: [", "not valid YAML"),
        ('driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus: []\nextra: 1', "extra"),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - {product: Foo, pciBusId: "0000:01:00.0"}',
            "unknown product 'Foo'",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - {product: NVIDIA L4, pciBusId: "bad"}',
            "pciBusId",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - {product: NVIDIA L4, pciBusId: "0000:01:00.0", migEnabled: true}',
            "does not support MIG",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - product: NVIDIA H100 80GB HBM3\n    pciBusId: "0000:01:00.0"\n'
            "    migEnabled: true\n    migDevices: [{profile: 3g.40gb, start: 0}, {profile: 2g.20gb, start: 2}]",
            "overlaps 3g.40gb@0",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - product: NVIDIA H100 80GB HBM3\n    pciBusId: "0000:01:00.0"\n'
            "    migEnabled: true\n    migDevices: [{profile: 3g.40gb, start: 2}]",
            "cannot start at memory slice 2",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - product: NVIDIA H100 80GB HBM3\n    pciBusId: "0000:01:00.0"\n'
            "    migEnabled: true\n    migDevices: [{profile: 9g.99gb, start: 0}]",
            "unknown MIG profile '9g.99gb'",
        ),
        (
            'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - {product: NVIDIA L4, pciBusId: "0000:01:00.0", minor: 0}\n'
            '  - {product: NVIDIA L4, pciBusId: "0000:02:00.0", minor: 0}',
            "minor numbers must be unique",
        ),
    ],
)
def test_bad_profiles_give_one_clear_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(DiscoveryError) as info:
        build_inventory(load_profile(_write(tmp_path, body)), "n")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_profile_with_a_syntax_error_shows_the_line(tmp_path: Path) -> None:
    """Profiles are parsed with libyaml where it is built in; its errors only name a line
    and column, so the message comes from the pure-Python parser, which shows the line."""
    body = 'driverVersion: "1"\ncudaDriverVersion: "12.4"\ngpus:\n  - product: NVIDIA L4: x\n'
    with pytest.raises(DiscoveryError) as err:
        SimulatedDiscovery(_write(tmp_path, body), "n")
    assert "line 4, column 23" in str(err.value)
    assert "- product: NVIDIA L4: x" in str(err.value)


def test_missing_profile_names_the_builtins() -> None:
    with pytest.raises(DiscoveryError, match="dgx-h100"):
        load_profile("no-such-profile")
