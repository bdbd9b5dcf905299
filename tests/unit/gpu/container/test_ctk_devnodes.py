"""Driver libraries from nvidia-ctk, and device node numbers from the host or the simulation."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from dra_driver.cdi.spec import NO_EDITS
from dra_driver.gpu.container import ctk, devnodes
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.cdi_schema import schema_errors

GENERATED = {
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


def _fake_ctk(tmp_path: Path, body: str) -> str:
    tool = tmp_path / "nvidia-ctk"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(tool)


def test_common_edits_come_from_nvidia_ctk(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    out.write_text(json.dumps(GENERATED))
    tool = _fake_ctk(tmp_path, f'[ "$1 $2" = "cdi generate" ] || exit 3\ncat {out}')
    edits = ctk.common_edits("/", executable=tool)
    assert [m.container_path for m in edits.mounts] == [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    ]
    assert edits.hooks[0]["hookName"] == "createContainer"
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidia-modeset"]

    # The claim's spec carries them, and stays a valid CDI spec.
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
    spec = json.loads(state.spec_path("u1").read_text())
    assert schema_errors(spec) == []
    assert spec["containerEdits"]["hooks"][0]["path"] == "/usr/bin/nvidia-cdi-hook"
    assert spec["containerEdits"]["mounts"][0]["options"] == ["ro", "nosuid", "nodev", "bind"]


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
