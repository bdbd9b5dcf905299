"""NVLink fabric (clique) discovery: formatting, the node's clique, the simulated gb200 profile,
and the NVML backend against the stand-in library finding the same cliques."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.nvml import fabric_from_nvml
from dra_driver.gpu.discovery.simulated import (
    BUILTIN_PROFILES,
    CLIQUE_ENV,
    ProfileFabric,
    SimulatedDiscovery,
    build_inventory,
    load_profile,
    resolve_clique,
)
from dra_driver.gpu.inventory import (
    MIB,
    Fabric,
    Gpu,
    Inventory,
    format_clique,
    node_clique,
    parse_clique,
)
from tests.fakenvml import render
from tests.unit.gpu.discovery.test_nvml_backend import FakeNode, fake_lib_dir, make_node

__all__ = ["fake_lib_dir"]  # the stand-in library fixture, shared with the NVML tests

CLUSTER = "6b1e2c4a-9d3f-4e8a-b7c5-2f0d1a3e5c71"  # the gb200 profile's
OTHER = "0f0e0d0c-0b0a-4908-8706-050403020100"
GB200_CLIQUE = f"{CLUSTER}.1"
ZERO = "00000000-0000-0000-0000-000000000000"


# -- formatting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "clique_id", "expected"),
    [
        (CLUSTER, 1, GB200_CLIQUE),
        (CLUSTER.upper(), 0, f"{CLUSTER}.0"),
        (CLUSTER.replace("-", ""), 4294967295, f"{CLUSTER}.4294967295"),
        (f"{{{CLUSTER}}}", 32766, f"{CLUSTER}.32766"),
        (ZERO, 1, None),  # NVLink without a multi-node fabric
    ],
)
def test_format_clique(cluster: str, clique_id: int, expected: str | None) -> None:
    assert format_clique(cluster, clique_id) == expected


@pytest.mark.parametrize(
    ("cluster", "clique_id"),
    [("not-a-uuid", 1), (CLUSTER, -1), (CLUSTER, 2**32), (CLUSTER[:-1], 1)],
)
def test_format_clique_rejects(cluster: str, clique_id: int) -> None:
    with pytest.raises(ValueError):
        format_clique(cluster, clique_id)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GB200_CLIQUE, (CLUSTER, 1)),
        (f" {CLUSTER.upper()}.007 ", (CLUSTER, 7)),
        (f"{CLUSTER}.4294967295", (CLUSTER, 4294967295)),
    ],
)
def test_parse_clique(text: str, expected: tuple[str, int]) -> None:
    assert parse_clique(text) == expected
    assert format_clique(*parse_clique(text)) == f"{expected[0]}.{expected[1]}"


@pytest.mark.parametrize(
    "text",
    ["", "1", CLUSTER, f"{CLUSTER}.", f"{CLUSTER}.-1", f"{CLUSTER}.x", f"{ZERO}.1", "abc.1"],
)
def test_parse_clique_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_clique(text)


def test_fabric_model_spells_a_clique_one_way_and_only_when_attached() -> None:
    assert Fabric(state="completed", clique=f"{CLUSTER.upper()}.1").clique == GB200_CLIQUE
    assert Fabric() == Fabric(state="not-supported", clique=None)
    with pytest.raises(ValueError, match="no clique yet"):
        Fabric(state="in-progress", clique=GB200_CLIQUE)
    with pytest.raises(ValueError):
        Fabric(state="completed", clique="rack-1")


# -- NVML's fields -> Fabric -------------------------------------------------------------

_BYTES = uuid.UUID(CLUSTER).bytes


@pytest.mark.parametrize(
    ("state", "status", "cluster", "clique_id", "expected"),
    [
        (3, 0, _BYTES, 1, Fabric(state="completed", clique=GB200_CLIQUE)),
        (3, 0, _BYTES, 0, Fabric(state="completed", clique=f"{CLUSTER}.0")),
        # NVLink, but no multi-node cluster.
        (3, 0, bytes(16), 0, Fabric(state="completed")),
        # Registration finished with an error: the IDs mean nothing.
        (3, 999, _BYTES, 1, Fabric(state="completed")),
        # Registration not done yet: the IDs are not valid yet.
        (2, 0, _BYTES, 1, Fabric(state="in-progress")),
        (1, 0, bytes(16), 0, Fabric(state="not-started")),
        (0, 0, bytes(16), 0, Fabric()),
        # A state newer than this code knows.
        (7, 0, _BYTES, 1, Fabric()),
    ],
)
def test_fabric_from_nvml(
    state: int, status: int, cluster: bytes, clique_id: int, expected: Fabric
) -> None:
    assert fabric_from_nvml(state, status, cluster, clique_id) == expected


# -- the node's clique -------------------------------------------------------------------


def _gpu(minor: int, fabric: Fabric) -> Gpu:
    return Gpu(
        uuid=f"GPU-{minor}",
        minor=minor,
        index=minor,
        product_name="NVIDIA GB200",
        brand="Nvidia",
        architecture="Blackwell",
        cuda_compute_capability="10.0",
        pci_bus_id=f"0000:{minor:02x}:00.0",
        memory_bytes=189471 * MIB,
        multiprocessors=152,
        fabric=fabric,
    )


def _node(*fabrics: Fabric) -> Inventory:
    gpus = tuple(_gpu(i, f) for i, f in enumerate(fabrics))
    return Inventory(driver_version="580.95.05", cuda_driver_version="13.0", gpus=gpus)


A = Fabric(state="completed", clique=f"{CLUSTER}.1")
B = Fabric(state="completed", clique=f"{CLUSTER}.2")
C = Fabric(state="completed", clique=f"{OTHER}.1")
PENDING = Fabric(state="in-progress")
NONE = Fabric()


@pytest.mark.parametrize(
    ("fabrics", "expected"),
    [
        ((), None),
        ((NONE, NONE), None),
        ((PENDING, Fabric(state="completed")), None),
        ((A, A, A, A), A.clique),
        # GPUs still registering do not vote.
        ((A, PENDING, NONE), A.clique),
        # Disagreement: the most common clique wins...
        ((B, A, B, A, B), B.clique),
        ((C, A, A), A.clique),
        # ...and a tie goes to the smallest clique string, whatever the GPU order.
        ((B, A), A.clique),
        ((A, B), A.clique),
        ((A, C), C.clique),  # "0f0e..." sorts before "6b1e..."
    ],
)
def test_node_clique(fabrics: tuple[Fabric, ...], expected: str | None) -> None:
    assert node_clique(_node(*fabrics)) == expected


# -- the simulated backend ---------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_clique_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLIQUE_ENV, raising=False)


def test_gb200_profile_facts() -> None:
    assert "gb200" in BUILTIN_PROFILES
    inventory = SimulatedDiscovery("gb200", "tray-1").discover()
    assert len(inventory.gpus) == 4
    for gpu in inventory.gpus:
        assert gpu.product_name == "NVIDIA GB200"
        assert gpu.architecture == "Blackwell"
        assert gpu.cuda_compute_capability == "10.0"
        assert gpu.memory_bytes == 189471 * MIB
        assert gpu.mig.capable and not gpu.mig_enabled
        assert gpu.fabric == Fabric(state="completed", clique=GB200_CLIQUE)
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 1, 1]
    names = {p.name for p in inventory.gpus[0].mig_profiles}
    assert names == {
        "1g.23gb",
        "1g.23gb+me",
        "1g.47gb",
        "2g.47gb",
        "3g.93gb",
        "4g.93gb",
        "7g.186gb",
    }
    assert node_clique(inventory) == GB200_CLIQUE


def test_gb200_nodes_share_the_clique_but_not_their_gpus() -> None:
    a = SimulatedDiscovery("gb200", "tray-1").discover()
    b = SimulatedDiscovery("gb200", "tray-2").discover()
    assert node_clique(a) == node_clique(b) == GB200_CLIQUE
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)


@pytest.mark.parametrize("profile", [p for p in BUILTIN_PROFILES if p != "gb200"])
def test_other_profiles_have_no_fabric(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Even with an override set for the whole cluster: it cannot add NVLink.
    monkeypatch.setenv(CLIQUE_ENV, "5")
    inventory = SimulatedDiscovery(profile, "n1").discover()
    assert all(g.fabric == Fabric() for g in inventory.gpus)
    assert node_clique(inventory) is None


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (None, GB200_CLIQUE),
        ("", GB200_CLIQUE),
        ("  ", GB200_CLIQUE),
        ("2", f"{CLUSTER}.2"),
        (f"{OTHER}.9", f"{OTHER}.9"),
        (f"{OTHER.upper()}.9", f"{OTHER}.9"),
    ],
)
def test_resolve_clique(override: str | None, expected: str) -> None:
    fabric = ProfileFabric(cluster_uuid=CLUSTER, clique_id=1)
    assert resolve_clique(fabric, override) == expected
    assert resolve_clique(None, override) is None


@pytest.mark.parametrize("override", ["rack-2", f"{ZERO}.1", "4294967296", f"{OTHER}."])
def test_bad_override_is_one_clear_line(override: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLIQUE_ENV, override)
    with pytest.raises(DiscoveryError) as info:
        SimulatedDiscovery("gb200", "n1")
    assert CLIQUE_ENV in str(info.value) and "\n" not in str(info.value)


def test_override_moves_one_node_to_another_rack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLIQUE_ENV, "2")
    moved = SimulatedDiscovery("gb200", "tray-9").discover()
    assert node_clique(moved) == f"{CLUSTER}.2"
    # The argument wins over the variable.
    assert node_clique(SimulatedDiscovery("gb200", "tray-9", clique="").discover()) == (
        GB200_CLIQUE
    )
    # Only the clique moves.
    monkeypatch.delenv(CLIQUE_ENV)
    stays = SimulatedDiscovery("gb200", "tray-9").discover()
    assert [g.uuid for g in moved.gpus] == [g.uuid for g in stays.gpus]


@pytest.mark.parametrize(
    ("fabric", "message"),
    [
        (f'{{clusterUuid: "{ZERO}", cliqueId: 1}}', "all-zero cluster UUID"),
        (f'{{clusterUuid: "{CLUSTER}", cliqueId: -1}}', "fabric.cliqueId"),
        ('{clusterUuid: "rack-1", cliqueId: 1}', "fabric.clusterUuid"),
        (f'{{clusterUuid: "{CLUSTER}"}}', "fabric.cliqueId"),
    ],
)
def test_bad_fabric_in_a_profile(tmp_path: Path, fabric: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        'driverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        f"fabric: {fabric}\n"
        'gpus:\n  - {product: NVIDIA GB200, pciBusId: "0008:01:00.0"}\n'
    )
    with pytest.raises(DiscoveryError, match=message):
        load_profile(str(path))


# -- the stand-in's data file --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fabric", "line"),
    [
        (Fabric(), None),
        (Fabric(state="completed", clique=GB200_CLIQUE), f"fabric 3 {CLUSTER} 1"),
        (Fabric(state="completed"), "fabric 3"),
        (Fabric(state="in-progress"), "fabric 2"),
        (Fabric(state="not-started"), "fabric 1"),
    ],
)
def test_fabric_line(fabric: Fabric, line: str | None) -> None:
    assert render.fabric_line(fabric) == line


def _with_fabric(node: FakeNode, fabric: Fabric) -> FakeNode:
    gpus = tuple(g.model_copy(update={"fabric": fabric}) for g in node.inventory.gpus)
    inventory = node.inventory.model_copy(update={"gpus": gpus})
    node.data.write_text(render.render(inventory))
    return FakeNode(inventory, node.data, node.sysfs, node.lib_dir)


# -- the NVML backend against the stand-in library -------------------------------------------


@pytest.fixture
def gb200(tmp_path: Path, fake_lib_dir: Path) -> FakeNode:
    return make_node("gb200", tmp_path, fake_lib_dir)


def test_nvml_finds_the_simulated_clique(gb200: FakeNode) -> None:
    got = gb200.discover()
    assert [g.fabric for g in got.gpus] == [g.fabric for g in gb200.inventory.gpus]
    assert node_clique(got) == node_clique(gb200.inventory) == GB200_CLIQUE


def test_nvml_gpus_without_fabric_are_not_supported(tmp_path: Path, fake_lib_dir: Path) -> None:
    node = make_node("dgx-h100", tmp_path, fake_lib_dir)
    assert "fabric" not in node.data.read_text()
    got = node.discover()
    assert all(g.fabric == Fabric() for g in got.gpus)


@pytest.mark.parametrize(
    "fabric",
    [Fabric(state="in-progress"), Fabric(state="not-started"), Fabric(state="completed")],
)
def test_nvml_reports_unfinished_or_clusterless_fabric(gb200: FakeNode, fabric: Fabric) -> None:
    node = _with_fabric(gb200, fabric)
    got = node.discover()
    assert all(g.fabric == fabric for g in got.gpus)
    assert node_clique(got) is None


@pytest.mark.parametrize(
    "fail",
    [
        "nvmlDeviceGetGpuFabricInfoV=13",  # a driver without the versioned call
        "nvmlDeviceGetGpuFabricInfoV=25",  # or without this struct version
    ],
)
def test_nvml_falls_back_to_the_older_call(gb200: FakeNode, fail: str) -> None:
    got = gb200.discover(FAKE_NVML_FAIL=fail)
    assert node_clique(got) == GB200_CLIQUE
    # The fallback really is what answered: with both calls gone there is no fabric.
    gone = gb200.discover(FAKE_NVML_FAIL=f"{fail},nvmlDeviceGetGpuFabricInfo=13")
    assert all(g.fabric == Fabric() for g in gone.gpus)


def test_nvml_not_supported_from_the_versioned_call_means_no_fabric(gb200: FakeNode) -> None:
    got = gb200.discover(FAKE_NVML_FAIL="nvmlDeviceGetGpuFabricInfoV=3")
    assert all(g.fabric == Fabric() for g in got.gpus)


@pytest.mark.parametrize(
    ("fail", "call"),
    [
        ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfoV"),
        ("nvmlDeviceGetGpuFabricInfoV=13,nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfo"),
    ],
)
def test_nvml_fabric_errors_name_the_call(gb200: FakeNode, fail: str, call: str) -> None:
    message = gb200.error(FAKE_NVML_FAIL=fail)
    assert f"NVML call {call} failed for GPU 0 (GPU-" in message
    assert message.endswith("Unknown Error") and "\n" not in message


_STRUCTS = """
import ctypes, json, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {}
v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
pynvml.nvmlDeviceGetGpuFabricInfoV(gpu, ctypes.byref(v3))
out["v3"] = [v3.version, v3.state, v3.cliqueId, bytes(v3.clusterUuid).hex(), v3.healthSummary]
bad = pynvml.c_nvmlGpuFabricInfoV_t()
bad.version = 0x01000024
try:
    pynvml.nvmlDeviceGetGpuFabricInfoV(gpu, ctypes.byref(bad))
except pynvml.NVMLError as exc:
    out["bad_version"] = exc.value
pynvml.nvmlDeviceSetComputeMode(gpu, 0)  # any change: the library writes its file back
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def test_stand_in_fabric_structs_and_persistence(gb200: FakeNode) -> None:
    original = [line for line in gb200.data.read_text().splitlines() if line.startswith("fabric")]
    assert original == [f"fabric 3 {CLUSTER} 1"] * 4
    result = subprocess.run(
        [sys.executable, "-c", _STRUCTS],
        env=gb200.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "v3": [0x03000028, 3, 1, uuid.UUID(CLUSTER).hex, 0],
        "bad_version": 25,  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    }
    saved = [line for line in gb200.data.read_text().splitlines() if line.startswith("fabric")]
    assert saved == original
    assert gb200.discover() == gb200.inventory


def test_build_inventory_takes_the_override_too() -> None:
    inventory = build_inventory(load_profile("gb200"), "n1", clique=f"{OTHER}.3")
    assert node_clique(inventory) == f"{OTHER}.3"


def test_discover_table_names_the_clique() -> None:
    from dra_driver.gpu.discovery.table import inventory_table

    text = inventory_table(SimulatedDiscovery("gb200", "n1").discover())
    assert text.splitlines()[-1] == f"NVLink clique {GB200_CLIQUE} (4 of 4 GPUs)"
    assert "NVLink" not in inventory_table(SimulatedDiscovery("dgx-h100", "n1").discover())
