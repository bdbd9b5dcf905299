"""Dynamic MIG publishing: counter arithmetic and the slices it produces."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.inventory import Gpu
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.publish.partitions import (
    PlacementSpec,
    consumption,
    counter_capacity,
    counter_set_name,
    placements,
    valid_layouts,
)
from dra_driver.resourceslice.pool import render_pool
from tests.unit.slice_rules import check_pool

SINGLE_H100 = str(Path(__file__).parents[3] / "data" / "single-h100.yaml")


def _gpu(profile: str = SINGLE_H100, index: int = 0) -> Gpu:
    return build_inventory(load_profile(profile), "n1").gpus[index]


def fits(gpu: Gpu, specs: list[PlacementSpec]) -> bool:
    """Whether the scheduler could allocate all of ``specs`` from the GPU's counter set."""
    total: Counter[str] = Counter()
    for spec in specs:
        total.update(consumption(spec))
    capacity = counter_capacity(gpu)
    return all(total[name] <= capacity.get(name, 0) for name in total)


def _by(gpu: Gpu, profile: str, start: int) -> PlacementSpec:
    return next(
        s for s in placements(gpu) if s.profile.name == profile and s.placement.start == start
    )


def _overlap(a: PlacementSpec, b: PlacementSpec) -> bool:
    pa, pb = a.placement, b.placement
    return pa.start < pb.start + pb.size and pb.start < pa.start + pa.size


def test_h100_placements_and_counter_set() -> None:
    gpu = _gpu()
    counts = Counter(s.profile.name for s in placements(gpu))
    assert counts == {
        "1g.10gb": 7,
        "1g.10gb+me": 7,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    }
    capacity = counter_capacity(gpu)
    assert [f"memory-slice-{i}" for i in range(8)] == [
        k for k in capacity if k.startswith("memory-slice")
    ]
    assert capacity["multiprocessors"] == 132 and capacity["ofa-engines"] == 1
    assert len(capacity) <= 32  # API limit per counter set


def test_every_placement_consumes_its_slices_and_engines() -> None:
    gpu = _gpu()
    for spec in placements(gpu):
        used = consumption(spec)
        slices = {int(k.rsplit("-", 1)[1]) for k in used if k.startswith("memory-slice-")}
        assert slices == set(
            range(spec.placement.start, spec.placement.start + spec.placement.size)
        )
        assert used["multiprocessors"] == spec.profile.multiprocessors
        assert used["memory"] == spec.profile.memory_bytes
        assert fits(gpu, [spec]), spec.device_name


def test_overlapping_placements_never_fit_together() -> None:
    gpu = _gpu()
    for a, b in itertools.combinations(placements(gpu), 2):
        if _overlap(a, b):
            assert not fits(gpu, [a, b]), (a.device_name, b.device_name)


@pytest.mark.parametrize("profile", [SINGLE_H100, "dgx-a100", "mixed"])
def test_every_valid_layout_fits(profile: str) -> None:
    for gpu in build_inventory(load_profile(profile), "n1").gpus:
        if gpu.mig.capable:
            for layout in valid_layouts(gpu):
                assert fits(gpu, list(layout)), [s.device_name for s in layout]


def test_seven_1g_fit_an_eighth_device_does_not() -> None:
    gpu = _gpu()
    seven = [_by(gpu, "1g.10gb", start) for start in range(7)]
    assert fits(gpu, seven)
    for extra in placements(gpu):
        if extra not in seven:
            assert not fits(gpu, [*seven, extra]), extra.device_name


def test_3g_and_4g_fit_side_by_side() -> None:
    gpu = _gpu()
    assert fits(gpu, [_by(gpu, "4g.40gb", 0), _by(gpu, "3g.40gb", 4)])
    assert not fits(gpu, [_by(gpu, "4g.40gb", 0), _by(gpu, "3g.40gb", 0)])


@pytest.mark.parametrize("profile", [SINGLE_H100, "dgx-a100", "mixed"])
def test_two_me_instances_never_fit(profile: str) -> None:
    # "+me" profiles allow one instance; the single OFA engine counter enforces it.
    for gpu in build_inventory(load_profile(profile), "n1").gpus:
        me = [s for s in placements(gpu) if s.profile.name.endswith("+me")]
        for a, b in itertools.combinations(me, 2):
            assert not fits(gpu, [a, b])


def test_whole_gpu_excludes_every_placement() -> None:
    gpu = _gpu()
    whole = counter_capacity(gpu)
    for spec in placements(gpu):
        used = consumption(spec)
        assert any(whole[k] + v > whole[k] for k, v in used.items() if v)


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100", "mixed", "l4x4", SINGLE_H100])
def test_dynamic_pool_passes_slice_validation(profile: str) -> None:
    inventory = build_inventory(load_profile(profile), "n1")
    pool = build_catalog(inventory, dynamic=True).pool("n1", "gpu.dra.dev")
    slices = render_pool(pool)
    assert check_pool(slices) == []
    sets = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters", [])}
    capable = [g for g in inventory.gpus if g.mig.capable]
    assert sorted(sets) == sorted(counter_set_name(g) for g in capable)
    for s in slices:
        assert not (s["spec"].get("devices") and s["spec"].get("sharedCounters"))
        for device in s["spec"].get("devices", []):
            for use in device.get("consumesCounters", []):
                assert set(use["counters"]) <= set(sets[use["counterSet"]]), device["name"]
            assert len(device.get("consumesCounters", [])) <= 2
    # One slice per MIG-capable GPU: the whole GPU and all of its placements.
    per_gpu = [
        s for s in slices if any(d.get("consumesCounters") for d in s["spec"].get("devices", []))
    ]
    assert len(per_gpu) == len(capable)
    for s in per_gpu:
        assert len(s["spec"]["devices"]) == 26  # 25 placements + the whole GPU
        assert "uuid" not in s["spec"]["devices"][1]["attributes"]


def test_whole_gpu_taints_apply_to_its_placements() -> None:
    inventory = build_inventory(load_profile(SINGLE_H100), "n1")
    taint = {"key": "gpu.dra.dev/xid", "value": "79", "effect": "NoSchedule"}
    pool = build_catalog(inventory, dynamic=True).pool("n1", "gpu.dra.dev", {"gpu-0": [taint]})
    devices = [d for s in pool.slices for d in s.devices]
    assert devices and all(d["taints"] == [taint] for d in devices)


# An A30 (R525+ drivers): 4 memory slices, one JPEG and one OFA engine, and two media
# extension profiles that each take both (NVIDIA's MIG user guide, "A30 MIG Profiles").
A30_NODE = """
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
products:
  - name: NVIDIA A30
    brand: Nvidia
    architecture: Ampere
    computeCapability: "8.0"
    memoryMiB: 24576
    multiprocessors: 56
    migProfiles:
      - {name: 1g.6gb, id: 14, nvmlIndex: 0, slices: 1, instances: 4, memoryMiB: 5952,
         sm: 14, ce: 1, dec: 0, enc: 0, jpeg: 0, ofa: 0, placements: "0,1,2,3:1"}
      - {name: 1g.6gb+me, id: 21, nvmlIndex: 7, slices: 1, instances: 1, memoryMiB: 5952,
         sm: 14, ce: 1, dec: 1, enc: 0, jpeg: 1, ofa: 1, placements: "0,1,2,3:1"}
      - {name: 2g.12gb, id: 5, nvmlIndex: 1, slices: 2, instances: 2, memoryMiB: 11968,
         sm: 28, ce: 2, dec: 2, enc: 0, jpeg: 0, ofa: 0, placements: "0,2:2"}
      - {name: 2g.12gb+me, id: 6, nvmlIndex: 8, slices: 2, instances: 1, memoryMiB: 11968,
         sm: 28, ce: 2, dec: 2, enc: 0, jpeg: 1, ofa: 1, placements: "0,2:2"}
      - {name: 4g.24gb, id: 0, nvmlIndex: 3, slices: 4, instances: 1, memoryMiB: 24000,
         sm: 56, ce: 4, dec: 4, enc: 0, jpeg: 1, ofa: 1, placements: "0:4"}
gpus:
  - {product: NVIDIA A30, pciBusId: "0000:1b:00.0"}
"""


def test_media_extension_profiles_of_different_sizes_never_fit_together(
    tmp_path: Path,
) -> None:
    """The A30's 1g.6gb+me and 2g.12gb+me both take its only JPEG and OFA engine: each allows
    one instance, and they exclude each other. Their placements do not overlap, so only the
    engine counters can keep the scheduler from allocating both (NVML refuses the second)."""
    path = tmp_path / "a30.yaml"
    path.write_text(A30_NODE)
    gpu = _gpu(str(path))
    one_me, two_me = _by(gpu, "1g.6gb+me", 0), _by(gpu, "2g.12gb+me", 2)
    assert not fits(gpu, [one_me, two_me])
    assert not any({one_me, two_me} <= set(layout) for layout in valid_layouts(gpu))
    # Each beside plain profiles still fits, as does the whole GPU's worth of them.
    assert fits(gpu, [one_me, _by(gpu, "1g.6gb", 1), _by(gpu, "2g.12gb", 2)])
    assert fits(gpu, [two_me, _by(gpu, "2g.12gb", 0)])
    assert fits(gpu, [_by(gpu, "1g.6gb", s) for s in range(4)])
    assert counter_capacity(gpu)["ofa-engines"] == 1
    assert counter_capacity(gpu)["jpeg-engines"] == 1


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-h100", "gb200"])
def test_seven_1g_instances_fit_on_every_built_in_product(profile: str) -> None:
    # The engine limit is the full GPU instance's: a product whose 7g holds fewer engines
    # than seven 1g instances together would make the counters refuse a layout NVML allows.
    gpu = _gpu(profile)
    smallest = min(gpu.mig_profiles, key=lambda p: (p.slice_count, p.memory_bytes, "+" in p.name))
    assert fits(gpu, [_by(gpu, smallest.name, start) for start in range(7)])


def test_media_extension_profiles_exclude_each_other_without_the_whole_gpus_profile(
    tmp_path: Path,
) -> None:
    """--mig-profiles may leave out the profile spanning the GPU (4g.24gb on an A30), whose
    engines bound every layout: the bound must stay, or both +me profiles are allocated."""
    from dra_driver.gpu.publish.profiles import restrict_profiles

    path = tmp_path / "a30.yaml"
    path.write_text(A30_NODE)
    inventory = build_inventory(load_profile(str(path)), "n1")
    chosen = {"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me"}
    (gpu,) = restrict_profiles(inventory, chosen).gpus
    assert {p.name for p in gpu.mig_profiles} == chosen
    one_me, two_me = _by(gpu, "1g.6gb+me", 0), _by(gpu, "2g.12gb+me", 2)
    assert not fits(gpu, [one_me, two_me])
    assert fits(gpu, [one_me, _by(gpu, "1g.6gb", 1), _by(gpu, "2g.12gb", 2)])
    assert counter_capacity(gpu)["ofa-engines"] == 1
