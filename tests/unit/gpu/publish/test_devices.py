"""Inventory -> DRA devices -> ResourceSlices: names, attributes and every API rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.cel.environment import Verdict
from dra_driver.cel.match import Selector, match_devices, slice_devices
from dra_driver.gpu.discovery.simulated import BUILTIN_PROFILES, SimulatedDiscovery
from dra_driver.gpu.inventory import Fabric, Gpu, Inventory, MigDevice, MigState, Placement
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.publish.devices import (
    fit_string,
    mig_device_name,
    quantity,
    to_semver,
)
from dra_driver.resourceslice.pool import render_pool, slice_name
from tests.unit.slice_rules import SEMVER, check_pool


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("560.35.03", "560.35.3"),
        ("12.6", "12.6.0"),
        ("9.0", "9.0.0"),
        ("535", "535.0.0"),
        ("580.95.05", "580.95.5"),
        ("1.2.3-rc1", "1.2.3-rc1"),
        ("1.2.3-rc.1+build.5", "1.2.3-rc.1+build.5"),
        # A numeric pre-release identifier with a leading zero is no semver (the API refuses
        # it): the suffix goes, as does one that would take the version past 64 bytes.
        ("550.54.14-01", "550.54.14"),
        ("12.4-rc.01", "12.4.0"),
        ("1.2.3-" + "a" * 59, "1.2.3"),
        ("1.2.3-" + "a" * 58, "1.2.3-" + "a" * 58),
    ],
)
def test_to_semver(raw: str, semver: str) -> None:
    assert to_semver(raw) == semver
    assert SEMVER.fullmatch(semver) and len(semver.encode()) <= 64


def test_to_semver_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        to_semver("abc")
    with pytest.raises(ValueError, match="longer than 64 bytes"):
        to_semver("1" * 65)


@settings(max_examples=200, deadline=None)
@given(
    core=st.from_regex(r"\d{1,6}(\.\d{1,6}){0,2}", fullmatch=True),
    # A suffix that does not continue the numbers: whatever follows them is what is judged.
    start=st.sampled_from("-+ a\ufffd"),
    rest=st.text(st.sampled_from("0123456789abz-.+\ufffd")) | st.text(),
)
def test_to_semver_always_makes_a_version_the_api_accepts(core: str, start: str, rest: str) -> None:
    version = to_semver(core + start + rest)
    assert SEMVER.fullmatch(version) and len(version.encode()) <= 64


@pytest.mark.parametrize(
    ("value", "fitted"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("x" * 70, "x" * 64),
        # U+FFFD is three bytes: 21 of them fill 63, the 22nd would split at byte 64.
        ("\ufffd" * 30, "\ufffd" * 21),
        ("x" * 62 + "\ufffd", "x" * 62),
    ],
)
def test_fit_string_cuts_by_bytes_between_characters(value: str, fitted: str) -> None:
    assert fit_string(value) == fitted


def test_string_attributes_are_cut_to_64_bytes_not_characters() -> None:
    """The API counts a string attribute's bytes (Go's ``len``). NVML names are decoded with
    replacement characters (U+FFFD, three bytes each), so 64 characters can be too many."""
    gpu = SimulatedDiscovery("dgx-h100", "n1").discover().gpus[0]
    name = "NVIDIA \ufffd\ufffd" + "X" * 80  # what nvml_text makes of a name with stray bytes
    inventory = Inventory(
        driver_version="580.65.06",
        cuda_driver_version="13.0",
        gpus=(gpu.model_copy(update={"product_name": name}),),
    )
    slices = render_pool(build_catalog(inventory).pool("node-1"))
    assert check_pool(slices) == []
    product = slices[0]["spec"]["devices"][0]["attributes"]["productName"]["string"]
    assert len(product.encode()) == 64 and name.startswith(product)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (132, "132"),
        (1000, "1k"),
        (85520809984, "85520809984"),
        (2_000_000, "2M"),
        (40 * 10**9, "40G"),
        (42949672960, "42949672960"),
    ],
)
def test_quantity_is_canonical(value: int, text: str) -> None:
    assert quantity(value) == text


def test_mig_device_names() -> None:
    assert mig_device_name(0, "1g.10gb", 19, 3) == "gpu-0-mig-1g10gb-19-3"
    assert mig_device_name(7, "1g.10gb+me", 20, 0) == "gpu-7-mig-1g10gbme-20-0"


def test_h100_gpu_device() -> None:
    inventory = SimulatedDiscovery("dgx-h100", "n1").discover()
    device = build_catalog(inventory).published()[0]
    assert device["name"] == "gpu-0"
    attrs = device["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["uuid"] == {"string": inventory.gpus[0].uuid}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "580.95.5"}
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["migCapable"] == {"bool": True} and attrs["migEnabled"] == {"bool": False}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:1b:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert attrs["numaNode"] == {"int": 0}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert device["capacity"] == {
        "memory": {"value": "85520809984"},
        "multiprocessors": {"value": "132"},
    }


def test_gpu_in_mig_mode_publishes_its_mig_devices_only() -> None:
    inventory = SimulatedDiscovery("mixed", "n1").discover()
    names = [d["name"] for d in build_catalog(inventory).published()]
    assert names == [
        "gpu-0-mig-3g40gb-9-0",
        "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-1g10gb-19-6",
        "gpu-1-mig-4g40gb-5-0",
        "gpu-1-mig-1g10gb-19-4",
        "gpu-1-mig-1g10gb-19-5",
        "gpu-2",
        "gpu-3",
    ]
    mig = build_catalog(inventory).published()[0]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["parentUUID"] == {"string": inventory.gpus[0].uuid}
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert set(mig["capacity"]) == {
        "memory",
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
    }
    assert mig["capacity"]["multiprocessors"] == {"value": "42"}


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_builtin_profiles_render_valid_slices(profile: str) -> None:
    inventory = SimulatedDiscovery(profile, "node-1").discover()
    slices = render_pool(build_catalog(inventory).pool("node-1"))
    assert check_pool(slices) == []
    assert all(
        s["spec"]["nodeName"] == "node-1" and s["spec"]["pool"]["name"] == "node-1" for s in slices
    )
    assert all(s["spec"]["driver"] == "gpu.dra.dev" for s in slices)


def test_long_names_are_hashed_into_valid_slice_names() -> None:
    node = "n" * 250
    names = {slice_name(node, "gpu.dra.dev", i) for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 253 for n in names)


# --- property: any inventory NVML could report renders slices the API server accepts -----

# Any printable text NVML could hand over, replacement characters and other non-ASCII included.
_text = st.text(st.characters(min_codepoint=32, codec="utf-8"), min_size=1, max_size=100) | st.text(
    st.sampled_from("NVIDIA \ufffd"), min_size=1, max_size=100
)
_version = st.tuples(st.integers(0, 999), st.integers(0, 99), st.integers(0, 99)).map(
    lambda t: f"{t[0]}.{t[1]:02d}.{t[2]:02d}"
)


@st.composite
def _gpus(draw: st.DrawFn, minor: int) -> Gpu:
    mig_enabled = draw(st.booleans())
    n_mig = draw(st.integers(0, 7)) if mig_enabled else 0
    migs = tuple(
        MigDevice(
            uuid=f"MIG-{minor}-{i}",
            gpu_instance_id=i + 1,
            compute_instance_id=0,
            profile_id=19,
            profile_name="1g.10gb",
            placement=Placement(start=i, size=1),
            memory_bytes=draw(st.integers(0, 2**40)),
            multiprocessors=16,
            copy_engines=1,
            decoders=1,
            encoders=0,
            jpeg_engines=1,
            ofa_engines=0,
        )
        for i in range(n_mig)
    )
    return Gpu(
        uuid=f"GPU-{minor}-{draw(st.uuids())}",
        minor=minor,
        index=minor,
        product_name=draw(_text),
        brand=draw(_text),
        architecture=draw(_text),
        cuda_compute_capability=f"{draw(st.integers(1, 12))}.{draw(st.integers(0, 9))}",
        pci_bus_id=f"0000:{minor % 256:02x}:00.0",
        pcie_root=draw(st.none() | st.just("pci0000:00")),
        numa_node=draw(st.none() | st.integers(0, 7)),
        memory_bytes=draw(st.integers(0, 2**44)),
        multiprocessors=draw(st.integers(0, 300)),
        mig=MigState(capable=mig_enabled, current_enabled=mig_enabled, pending_enabled=mig_enabled),
        mig_devices=migs,
        # Any cluster UUID and 32-bit clique ID: the longest clique still fits the API's limit.
        fabric=draw(
            st.just(Fabric())
            | st.builds(
                lambda u, c: Fabric(state="completed", clique=f"{u}.{c}"),
                st.uuids(),
                st.integers(0, 2**32 - 1),
            )
        ),
    )


@st.composite
def _inventories(draw: st.DrawFn) -> Inventory:
    # Past one slice's 128 devices, and small enough for Hypothesis's entropy budget.
    count = draw(st.integers(0, 160))
    minors = draw(st.lists(st.integers(0, 10_000), min_size=count, max_size=count, unique=True))
    return Inventory(
        driver_version=draw(_version),
        cuda_driver_version=f"{draw(st.integers(10, 13))}.{draw(st.integers(0, 9))}",
        gpus=tuple(draw(_gpus(m)) for m in minors),
    )


_node_names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(inventory=_inventories(), node=_node_names)
def test_any_inventory_renders_valid_slices(inventory: Inventory, node: str) -> None:
    devices = build_catalog(inventory).published()
    slices = render_pool(build_catalog(inventory).pool(node))
    if devices:
        assert check_pool(slices) == []
    rendered = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert rendered == [d["name"] for d in devices]
    assert all(len(s["spec"]["devices"]) <= 128 for s in slices)


def test_standard_numa_node_only_where_the_gpu_has_one() -> None:
    """The standard attribute follows the kernel's numa_node: none for -1 (no affinity)."""
    inventory = SimulatedDiscovery("dgx-h100", "n1").discover()
    gpus = list(inventory.gpus)
    gpus[1] = gpus[1].model_copy(update={"numa_node": None})
    devices = build_catalog(inventory.model_copy(update={"gpus": tuple(gpus)})).published()
    by_name = {d["name"]: d["attributes"] for d in devices}
    assert by_name["gpu-0"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert "resource.kubernetes.io/numaNode" not in by_name["gpu-1"]
    assert "numaNode" not in by_name["gpu-1"]


# --- the NVLink clique of fabric-attached GPUs -----------------------------------------------

GB200_CLIQUE = "6b1e2c4a-9d3f-4e8a-b7c5-2f0d1a3e5c71.1"


def test_gb200_gpu_device_publishes_its_clique() -> None:
    inventory = SimulatedDiscovery("gb200", "n1", clique="").discover()
    devices = build_catalog(inventory).published()
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    for device in devices:
        assert device["attributes"]["cliqueId"] == {"string": GB200_CLIQUE}
        assert device["attributes"]["productName"] == {"string": "NVIDIA GB200"}
        assert device["attributes"]["architecture"] == {"string": "Blackwell"}


def test_gpus_without_fabric_publish_no_clique() -> None:
    devices = build_catalog(SimulatedDiscovery("dgx-h100", "n1").discover()).published()
    assert devices and all("cliqueId" not in d["attributes"] for d in devices)


def test_mig_devices_carry_no_clique(tmp_path: Path) -> None:
    # A GPU in MIG mode has no NVLink: its MIG devices are in no clique.
    profile = tmp_path / "gb200-mig.yaml"
    profile.write_text(
        'driverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        'fabric: {clusterUuid: "6b1e2c4a-9d3f-4e8a-b7c5-2f0d1a3e5c71", cliqueId: 1}\n'
        "gpus:\n"
        '  - product: NVIDIA GB200\n    pciBusId: "0008:01:00.0"\n    migEnabled: true\n'
        "    migDevices: [{profile: 3g.93gb, start: 0}, {profile: 1g.23gb, start: 4}]\n"
        '  - {product: NVIDIA GB200, pciBusId: "0009:01:00.0"}\n'
    )
    inventory = SimulatedDiscovery(str(profile), "n1", clique="").discover()
    devices = {d["name"]: d["attributes"] for d in build_catalog(inventory).published()}
    assert set(devices) == {"gpu-0-mig-3g93gb-9-0", "gpu-0-mig-1g23gb-19-4", "gpu-1"}
    assert "cliqueId" not in devices["gpu-0-mig-3g93gb-9-0"]
    assert "cliqueId" not in devices["gpu-0-mig-1g23gb-19-4"]
    assert devices["gpu-1"]["cliqueId"] == {"string": GB200_CLIQUE}


def test_dynamic_mig_whole_gpu_has_the_clique_placements_do_not() -> None:
    inventory = SimulatedDiscovery("gb200", "n1", clique="").discover()
    devices = build_catalog(inventory, dynamic=True).published()
    whole = [d for d in devices if d["attributes"]["type"] == {"string": "gpu"}]
    parts = [d for d in devices if d["attributes"]["type"] == {"string": "mig"}]
    assert len(whole) == 4 and parts
    assert all(d["attributes"]["cliqueId"] == {"string": GB200_CLIQUE} for d in whole)
    assert all("cliqueId" not in d["attributes"] for d in parts)
    slices = render_pool(build_catalog(inventory, dynamic=True).pool("n1"))
    assert check_pool(slices) == []


@pytest.mark.parametrize(("profile", "dynamic"), [("mixed", False), ("dgx-a100", True)])
def test_compat_mode_mig_devices_carry_the_older_parent_index(profile: str, dynamic: bool) -> None:
    # The NVIDIA driver's releases before Sep 2025 published parentIndex (int) on MIG devices
    # beside index and minor on whole GPUs; a claim of that time pins its MIG devices to one
    # GPU with `device.attributes["gpu.nvidia.com"].parentIndex == 1` on class mig.nvidia.com.
    inventory = SimulatedDiscovery(profile, "n1").discover()
    index = {g.uuid: g.index for g in inventory.gpus}
    pool = build_catalog(inventory, dynamic=dynamic).pool(
        "n1", "gpu.nvidia.com", legacy_nvidia=True
    )
    slices = render_pool(pool)
    assert check_pool(slices) == []
    devices = slice_devices(slices)
    migs = [d for d in devices if d.data["attributes"]["type"] == {"string": "mig"}]
    assert migs
    for device in migs:
        parent = device.data["attributes"]["parentUUID"]["string"]
        assert device.data["attributes"]["parentIndex"] == {"int": index[parent]}, device.name
    mig_class = Selector(
        "class mig.nvidia.com",
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"',
    )
    request = Selector("request", 'device.attributes["gpu.nvidia.com"].parentIndex == 1')
    matched = {
        r.device.name
        for r in match_devices(devices, [mig_class, request], with_explanation=False)
        if r.verdict is Verdict.MATCH
    }
    on_gpu_1 = {d.name for d in migs if index[d.data["attributes"]["parentUUID"]["string"]] == 1}
    assert on_gpu_1 and matched == on_gpu_1
    # Without compat mode, no such attribute.
    plain = build_catalog(inventory, dynamic=dynamic).published()
    assert not [d for d in plain if "parentIndex" in d["attributes"]]
