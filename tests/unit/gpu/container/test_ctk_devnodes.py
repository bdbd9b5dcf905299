"""Driver libraries from nvidia-ctk, and device node numbers from the host or the simulation."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver.cdi.spec import NO_EDITS, ContainerEdits, DeviceNode, Mount
from dra_driver.gpu.container import ctk, devnodes
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.cdi_schema import schema_errors

GENERATED: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidia-modeset"}],
        "mounts": [
            {
                "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache"],
            }
        ],
    },
}


HOST_DRIVER_ROOT = Path("/run/nvidia/driver")


def _fake_ctk(tmp_path: Path, body: str) -> str:
    tool = tmp_path / "nvidia-ctk"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(tool)


def _ctk_printing(tmp_path: Path, spec: dict[str, Any]) -> str:
    """An ``nvidia-ctk`` whose ``cdi generate`` prints ``spec`` and records its arguments in
    ``args`` beside it."""
    out = tmp_path / "spec.json"
    out.write_text(json.dumps(spec))
    args = tmp_path / "args"
    return _fake_ctk(
        tmp_path, f'[ "$1 $2" = "cdi generate" ] || exit 3\necho "$@" > {args}\ncat {out}'
    )


def _generated(root: str) -> dict[str, Any]:
    """What ``nvidia-ctk cdi generate --driver-root=<root>`` prints (abridged): host paths are
    under the root as nvidia-ctk sees it."""
    return {
        **GENERATED,
        "containerEdits": {
            **GENERATED["containerEdits"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": f"{root}/dev/nvidiactl"}],
            "mounts": [
                {
                    "hostPath": f"{root}/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                    "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }


def _claim_spec(tmp_path: Path, edits: ContainerEdits) -> dict[str, Any]:
    """The CDI spec written for a claim of one simulated GPU with ``edits`` as common edits."""
    state = DeviceState(
        inventory=SimulatedDiscovery("l4x4", "n").discover(),
        driver_name="gpu.dra.dev",
        node_name="n",
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="b",
        common_edits=edits,
    )
    claim = ClaimToPrepare(
        ref=ClaimRef("ns", "c", "u1"),
        claim={},
        results=({"request": "gpu", "driver": "gpu.dra.dev", "pool": "n", "device": "gpu-1"},),
        config=(),
    )
    assert isinstance(state.prepare([claim])["u1"], list)
    spec: dict[str, Any] = json.loads(state.spec_path("u1").read_text())
    return spec


def test_common_edits_come_from_nvidia_ctk(tmp_path: Path) -> None:
    tool = _ctk_printing(tmp_path, GENERATED)
    edits = ctk.common_edits("/", executable=tool)
    assert [m.container_path for m in edits.mounts] == [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    ]
    assert edits.hooks[0]["hookName"] == "createContainer"
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidia-modeset"]

    # The claim's spec carries them, and stays a valid CDI spec.
    spec = _claim_spec(tmp_path, edits)
    assert schema_errors(spec) == []
    assert spec["containerEdits"]["hooks"][0]["path"] == "/usr/bin/nvidia-cdi-hook"
    assert spec["containerEdits"]["mounts"][0]["options"] == ["ro", "nosuid", "nodev", "bind"]


def test_nvidia_ctk_edits_name_host_paths_the_runtime_can_find(tmp_path: Path) -> None:
    """The agent sees the host's driver root at /driver-root, so nvidia-ctk's host paths start
    there; the runtime on the host stats device nodes without numbers and runc bind-mounts
    sources, so they must be the host's paths (under --host-driver-root)."""
    tool = _ctk_printing(tmp_path, _generated("/driver-root"))
    edits = ctk.common_edits("/driver-root", executable=tool, host_root=HOST_DRIVER_ROOT)
    assert [m.host_path for m in edits.mounts] == [
        f"{HOST_DRIVER_ROOT}/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    ]
    assert [n.host_path for n in edits.device_nodes] == [f"{HOST_DRIVER_ROOT}/dev/nvidiactl"]


@pytest.mark.parametrize(
    ("path", "driver_root", "host_root", "expected"),
    [
        # The driver installed on the host, mounted into the agent at /driver-root.
        ("/driver-root/usr/lib/libcuda.so.1", "/driver-root", "/", "/usr/lib/libcuda.so.1"),
        ("/driver-root/dev/nvidiactl", "/driver-root/", "/", "/dev/nvidiactl"),
        ("/driver-root", "/driver-root", "/", "/"),
        # A driver container's root, mounted at /driver-root.
        (
            "/driver-root/usr/bin/nvidia-smi",
            "/driver-root",
            "/run/nvidia/driver",
            "/run/nvidia/driver/usr/bin/nvidia-smi",
        ),
        # The agent sees the host's / as its own: every path is under the root.
        ("/usr/lib/libcuda.so.1", "/", "/", "/usr/lib/libcuda.so.1"),
        (
            "/usr/lib/libcuda.so.1",
            "/",
            "/run/nvidia/driver",
            "/run/nvidia/driver/usr/lib/libcuda.so.1",
        ),
        # Outside the root, or only sharing its prefix: as is.
        (
            "/run/nvidia-persistenced/socket",
            "/driver-root",
            "/run/nvidia/driver",
            "/run/nvidia-persistenced/socket",
        ),
        ("/driver-rootX/lib/libcuda.so.1", "/driver-root", "/", "/driver-rootX/lib/libcuda.so.1"),
        ("/driver-roo", "/driver-root", "/", "/driver-roo"),
    ],
)
def test_host_path(path: str, driver_root: str, host_root: str, expected: str) -> None:
    assert ctk.host_path(path, driver_root, host_root) == expected


def test_on_host_moves_mounts_and_device_nodes_only() -> None:
    edits = ContainerEdits(
        env=("A=/driver-root/x",),
        device_nodes=(
            DeviceNode(path="/dev/nvidiactl", host_path="/driver-root/dev/nvidiactl"),
            DeviceNode(path="/dev/nvidia-modeset"),  # the runtime stats the host's /dev
        ),
        mounts=(Mount(host_path="/driver-root/lib/a", container_path="/lib/a", options=("ro",)),),
        hooks=({"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"},),
    )
    moved = ctk.on_host(edits, "/driver-root", str(HOST_DRIVER_ROOT))
    assert moved == ContainerEdits(
        env=edits.env,
        device_nodes=(
            DeviceNode(path="/dev/nvidiactl", host_path=f"{HOST_DRIVER_ROOT}/dev/nvidiactl"),
            DeviceNode(path="/dev/nvidia-modeset"),
        ),
        mounts=(
            Mount(host_path=f"{HOST_DRIVER_ROOT}/lib/a", container_path="/lib/a", options=("ro",)),
        ),
        hooks=edits.hooks,
    )


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ((), None),
        (("usr/bin/nvidia-cdi-hook",), "usr/bin/nvidia-cdi-hook"),
        (("usr/local/nvidia/toolkit/nvidia-cdi-hook",), "usr/local/nvidia/toolkit/nvidia-cdi-hook"),
        # nvidia-ctk runs the hooks every nvidia-ctk version writes.
        (("usr/bin/nvidia-cdi-hook", "usr/bin/nvidia-ctk"), "usr/bin/nvidia-ctk"),
    ],
)
def test_host_hook_binary(tmp_path: Path, present: tuple[str, ...], expected: str | None) -> None:
    for relative in present:
        _executable(tmp_path / relative)
    found = ctk.host_hook_binary(tmp_path, HOST_DRIVER_ROOT)
    assert found == (str(HOST_DRIVER_ROOT / expected) if expected else None)


def test_a_hook_binary_that_is_not_executable_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "nvidia-ctk").write_text("")
    assert ctk.host_hook_binary(tmp_path, HOST_DRIVER_ROOT) is None


def test_nvidia_ctk_is_told_the_hosts_hook_binary(tmp_path: Path) -> None:
    """Hooks run in the runtime's mount namespace on the host: nvidia-ctk must write the
    host's path of a hook binary, not its own path in the agent's image."""
    root = tmp_path / "root"
    _executable(root / "usr" / "bin" / "nvidia-ctk")
    tool = _ctk_printing(tmp_path, _generated(str(root)))
    ctk.common_edits(str(root), executable=tool, host_root=HOST_DRIVER_ROOT)
    args = (tmp_path / "args").read_text().split()
    assert f"--nvidia-ctk-path={HOST_DRIVER_ROOT}/usr/bin/nvidia-ctk" in args

    # None under the driver root: nvidia-ctk's own choice stands.
    ctk.common_edits(str(tmp_path / "empty"), executable=tool, host_root=HOST_DRIVER_ROOT)
    assert not [a for a in (tmp_path / "args").read_text().split() if "ctk-path" in a]


def _effective_env(spec: dict[str, Any], device: str) -> dict[str, str]:
    """The container's environment after the runtime applies the spec: claim-wide edits, then
    the device's; runtime-tools' Generator replaces an entry of the same name (addEnv), so
    the last value of a name wins."""
    env: dict[str, str] = {}
    edits = [spec.get("containerEdits") or {}] + [
        d["containerEdits"] for d in spec["devices"] if d["name"] == device
    ]
    for e in edits:
        for entry in e.get("env", []):
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def test_nvidia_ctk_common_env_does_not_replace_the_claims_visible_devices(
    tmp_path: Path,
) -> None:
    """nvidia-ctk's common env carries NVIDIA_VISIBLE_DEVICES=void; the claim's containers
    get the claim's GPU UUIDs (docs/cdi.md), stated once."""
    spec = _claim_spec(
        tmp_path, ctk.common_edits("/", executable=_ctk_printing(tmp_path, GENERATED))
    )
    (device,) = spec["devices"]
    visible = _effective_env(spec, device["name"])["NVIDIA_VISIBLE_DEVICES"]
    assert visible.startswith("GPU-"), visible
    names = [e.partition("=")[0] for e in spec["containerEdits"]["env"]]
    assert names.count("NVIDIA_VISIBLE_DEVICES") == 1


def test_without_nvidia_ctk_or_driver_files_there_are_no_common_edits(tmp_path: Path) -> None:
    # (With driver files the agent mounts them itself: test_driverfiles.py.)
    empty_root = str(tmp_path / "root")
    assert ctk.common_edits(empty_root, executable=str(tmp_path / "missing")) == NO_EDITS


def test_a_failing_nvidia_ctk_is_survived(tmp_path: Path) -> None:
    empty_root = str(tmp_path / "root")
    failing = _fake_ctk(tmp_path, "echo broken >&2; exit 1")
    assert ctk.common_edits(empty_root, executable=failing) == NO_EDITS
    garbage = _fake_ctk(tmp_path, "echo not-json")
    assert ctk.common_edits(empty_root, executable=garbage) == NO_EDITS


def test_host_device_nodes_carry_their_numbers() -> None:
    info = os.stat("/dev/null")
    node = devnodes.host()("/dev/null")
    assert (node.type, node.major, node.minor) == (
        "c",
        os.major(info.st_rdev),
        os.minor(info.st_rdev),
    )
    assert node.host_path is None
    # Missing nodes are left to the runtime.
    assert devnodes.host()("/dev/nvidia99") == devnodes.plain("/dev/nvidia99")


def test_driver_root_device_nodes_point_at_the_host_path(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/null", tmp_path / "dev" / "nvidiactl")
    node = devnodes.host(tmp_path)("/dev/nvidiactl")
    assert node.path == "/dev/nvidiactl" and node.host_path == str(tmp_path / "dev" / "nvidiactl")
    assert node.type == "c"


def test_simulated_numbers() -> None:
    assert devnodes.simulated("/dev/nvidia3").to_json() == {
        "path": "/dev/nvidia3",
        "type": "c",
        "major": 195,
        "minor": 3,
    }
    assert devnodes.simulated("/dev/nvidiactl").minor == 255
    assert devnodes.simulated("/dev/nvidia-caps/nvidia-cap30").minor == 30
    assert devnodes.simulated("/dev/other") == devnodes.plain("/dev/other")


def test_device_nodes_found_in_the_mounted_root_name_the_hosts_path(tmp_path: Path) -> None:
    """The agent sees the driver root at /driver-root; the runtime must be told the host's
    path (/run/nvidia/driver/dev/...), or it stats a file that does not exist."""
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/null", tmp_path / "dev" / "nvidia0")
    node = devnodes.host(tmp_path, Path("/run/nvidia/driver"))("/dev/nvidia0")
    assert node.host_path == "/run/nvidia/driver/dev/nvidia0"
    assert (node.type, node.major) == ("c", os.major(os.stat("/dev/null").st_rdev))
    # A driver installed on the host itself: the path alone.
    assert devnodes.host(tmp_path, Path("/"))("/dev/nvidia0").host_path is None


PROC_DEVICES = (
    "Character devices:\n  1 mem\n195 nvidia\n236 nvidia-caps\n508 nvidia-uvm\n\n"
    "Block devices:\n  8 sd\n259 nvidia-caps\n"
)


@pytest.mark.parametrize(
    ("path", "proc_devices", "expected"),
    [
        ("/dev/nvidia-uvm", PROC_DEVICES, ("c", 508, 0)),
        ("/dev/nvidia-uvm-tools", PROC_DEVICES, ("c", 508, 1)),
        ("/dev/nvidia-caps/nvidia-cap12", PROC_DEVICES, ("c", 236, 12)),
        ("/dev/nvidia-caps/nvidia-cap1", PROC_DEVICES, ("c", 236, 1)),
        # The driver's module not loaded: the path alone.
        ("/dev/nvidia-caps/nvidia-cap12", "Character devices:\n195 nvidia\n", (None, None, None)),
        ("/dev/nvidia-uvm", "", (None, None, None)),
        # Only character devices count.
        ("/dev/nvidia-caps/nvidia-cap3", "Block devices:\n259 nvidia-caps\n", (None, None, None)),
        # Not a node numbered by its name.
        ("/dev/nvidia0", PROC_DEVICES, (None, None, None)),
        ("/dev/nvidia-caps/nvidia-capX", PROC_DEVICES, (None, None, None)),
    ],
)
def test_registered_numbers(
    path: str, proc_devices: str, expected: tuple[str | None, int | None, int | None]
) -> None:
    node = devnodes.registered(path, proc_devices)
    assert (node.type, node.major, node.minor) == expected
    assert node.path == path and node.host_path is None


def test_missing_mig_cap_node_still_gets_its_numbers(tmp_path: Path) -> None:
    """A MIG capability node made by dynamic MIG inside the agent's container (its /dev is
    not the host's) is missing under the driver root. Without numbers CDI stats the host path,
    fails, and the container is not created; the numbers are known without the node, and
    the node gets no host path (the runtime creates it)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "devices").write_text(PROC_DEVICES)
    (tmp_path / "dev").mkdir()
    node = devnodes.host(tmp_path, HOST_DRIVER_ROOT)("/dev/nvidia-caps/nvidia-cap12")
    assert node == DeviceNode(path="/dev/nvidia-caps/nvidia-cap12", type="c", major=236, minor=12)


def test_registry_files_are_tried_in_order(tmp_path: Path) -> None:
    without_caps = tmp_path / "stand-in"
    without_caps.write_text("Character devices:\n508 nvidia-uvm\n")
    kernel = tmp_path / "kernel"
    kernel.write_text(PROC_DEVICES)
    resolve = devnodes.host(tmp_path, proc_devices=(tmp_path / "missing", without_caps, kernel))
    assert resolve("/dev/nvidia-uvm").major == 508
    assert resolve("/dev/nvidia-caps/nvidia-cap4").major == 236


def test_an_unknown_major_leaves_the_path_and_warns_once(tmp_path: Path) -> None:
    registry = tmp_path / "devices"
    registry.write_text("Character devices:\n195 nvidia\n")
    resolve = devnodes.host(tmp_path, proc_devices=(registry,))
    with capture_logs() as logs:
        nodes = [resolve(f"/dev/nvidia-caps/nvidia-cap{n}") for n in (1, 2)]
        assert resolve("/dev/nvidia0") == devnodes.plain("/dev/nvidia0")  # not numbered by name
    assert nodes == [devnodes.plain(f"/dev/nvidia-caps/nvidia-cap{n}") for n in (1, 2)]
    assert [entry["driver"] for entry in logs if entry["log_level"] == "warning"] == ["nvidia-caps"]
