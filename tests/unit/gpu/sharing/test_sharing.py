"""Sharing applied on the node: time-slices and MPS daemons through the simulated backend,
recorded in the checkpoint before they are taken, undone at unprepare and after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.config import MpsConfig
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.sharing.backend import MpsDaemon, MpsLimits, SharingError
from dra_driver.gpu.sharing.host import HostSharing, control_commands, timeslice_failed
from dra_driver.gpu.sharing.mps import (
    config_limits,
    daemon_for,
    daemons_to_stop,
    gpu_daemon_id,
    mps_limit,
)
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.sharing.timeslicing import timeslice_value, to_reset
from dra_driver.gpu.state.checkpoint import ClaimRecord, ClaimState, DeviceRecord, MpsRecord
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare

NODE = "node-1"
DRIVER = "gpu.dra.dev"


def _config(sharing: dict[str, Any], kind: str = "GpuConfig") -> list[dict[str, Any]]:
    params = {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": kind, "sharing": sharing}
    return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]


TIMESLICE_LONG = _config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
MPS = _config(
    {
        "strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "8Gi"},
    }
)


def _claim(uid: str, *devices: str, config: list[dict[str, Any]] | None = None) -> ClaimToPrepare:
    results = tuple(
        {"request": f"req{i}", "driver": DRIVER, "pool": NODE, "device": d}
        for i, d in enumerate(devices)
    )
    return ClaimToPrepare(
        ref=ClaimRef("ns", f"claim-{uid}", uid),
        claim={},
        results=results,
        config=tuple(config or ()),
    )


def _ref(uid: str) -> ClaimRef:
    return ClaimRef("ns", f"claim-{uid}", uid)


def _state(
    tmp_path: Path, backend: SimulatedSharing, boot_id: str = "boot-1", profile: str = "mixed"
) -> DeviceState:
    return DeviceState(
        inventory=SimulatedDiscovery(profile, NODE).discover(),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id=boot_id,
        sharing=backend,
    )


def _uuid(minor: int, profile: str = "mixed") -> str:
    return next(
        g.uuid for g in SimulatedDiscovery(profile, NODE).discover().gpus if g.minor == minor
    )


# --- pure parts ---------------------------------------------------------------------------


def test_timeslice_values() -> None:
    assert [timeslice_value(i) for i in ("Default", "Short", "Medium", "Long")] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not one of"):
        timeslice_value("Forever")


def _record(uid: str, *devices: DeviceRecord, mps: MpsRecord | None = None) -> ClaimRecord:
    return ClaimRecord(
        state=ClaimState.PREPARE_COMPLETED, namespace="ns", name=uid, devices=list(devices), mps=mps
    )


def _dev(uuid: str, **kw: Any) -> DeviceRecord:
    return DeviceRecord(request_names=["r"], pool_name=NODE, device_name="gpu-0", uuid=uuid, **kw)


def _mps(daemon: str) -> MpsRecord:
    return MpsRecord(daemon=daemon, pipe_dir="/p", log_dir="/l", shm_dir="/s")


def test_timeslice_reset_only_when_no_other_claim_slices_the_gpu() -> None:
    a = _record("a", _dev("GPU-1", timeslice="Long"), _dev("GPU-2", timeslice="Short"))
    b = _record("b", _dev("GPU-2", timeslice="Short"))
    assert to_reset([a], [b]) == ["GPU-1"]
    assert to_reset([a], []) == ["GPU-1", "GPU-2"]
    assert to_reset([_record("c", _dev("GPU-3"))], []) == []


def test_daemons_are_reference_counted_by_claims() -> None:
    share = _mps(gpu_daemon_id(0))
    a = _record("a", _dev("GPU-1", mps=share))
    b = _record("b", _dev("GPU-1", mps=share))
    own = _record("c", _dev("GPU-2"), mps=_mps("c"))
    assert daemons_to_stop([a], [b, own]) == []
    assert [d.daemon for d in daemons_to_stop([a, b], [own])] == ["gpu-0"]
    assert [d.daemon for d in daemons_to_stop([own], [a])] == ["c"]


def test_daemon_limits_from_config() -> None:
    cfg = MpsConfig.model_validate(
        {
            "defaultActiveThreadPercentage": 30,
            "defaultPinnedDeviceMemoryLimit": "4Gi",
            "defaultPerDevicePinnedMemoryLimit": {"GPU-B": "1Gi"},
        }
    )
    limits = config_limits([(0, "GPU-A", cfg), (1, "GPU-B", cfg), (2, "GPU-C", None)])
    assert limits == MpsLimits(30, ((0, "4096M"), (1, "1024M")))
    # Keyed by the claim's index, set for the daemon's ordinal (a plain device came first).
    by_index = cfg.model_copy(update={"default_per_device_pinned_memory_limit": {"1": "2Gi"}})
    assert config_limits([(1, "GPU-B", by_index)]).pinned_memory == ((0, "2048M"),)
    assert mps_limit(10 * 2**30 + 5) == "10240M"
    daemon = MpsDaemon("d", ("GPU-A",), Path("/p"), Path("/l"), Path("/s"), limits)
    assert control_commands(daemon) == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 1024M",
    ]


def test_nvidia_smi_refusals_are_recognised() -> None:
    assert timeslice_failed(0, "") is False
    assert timeslice_failed(0, "Set timeslice to 3 for GPU 00000000:1B:00.0") is False
    assert timeslice_failed(3, "")
    # nvidia-smi reports some refusals with exit status 0.
    assert timeslice_failed(0, "Setting timeslice is Not Supported for GPU 00000000:1B:00.0")


def test_simulated_backend_records_lifecycle(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json", timeslice_unsupported={"GPU-X"})
    sim.set_timeslice("GPU-1", "Medium")
    daemon = MpsDaemon(
        "d1", ("GPU-1",), tmp_path / "p", tmp_path / "l", tmp_path / "s", MpsLimits(50)
    )
    sim.start_mps(daemon)
    sim.start_mps(daemon)  # idempotent
    assert sim.list_mps() == ("d1",) and (tmp_path / "p" / "control").exists()
    sim.stop_mps("d1", tmp_path / "p")
    sim.reset_timeslice("GPU-1")
    state = json.loads((tmp_path / "sim.json").read_text())
    assert state["gpus"]["GPU-1"]["timeslice"] == "Default"
    assert state["mps"]["d1"]["state"] == "stopped"
    assert state["mps"]["d1"]["activeThreadPercentage"] == 50
    ops = [e["op"] for e in state["log"]]
    assert ops == ["set-timeslice", "start-mps", "stop-mps", "reset-timeslice"]
    with pytest.raises(Exception, match="does not support time-slice"):
        sim.set_timeslice("GPU-X", "Long")


# --- through prepare and unprepare --------------------------------------------------------


def test_time_slicing_is_set_and_reset(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sim)
    assert isinstance(state.prepare([_claim("ts", "gpu-2", config=TIMESLICE_LONG)])["ts"], list)
    uuid = _uuid(2)
    assert sim.read().gpus[uuid].timeslice == "Long"
    assert state.prepared_claims()["ts"].devices[0].timeslice == "Long"
    assert state.unprepare([_ref("ts")]) == {"ts": None}
    assert sim.read().gpus[uuid].timeslice == "Default"


def test_unsupported_time_slice_fails_the_claim_clearly(tmp_path: Path) -> None:
    uuid = _uuid(2)
    sim = SimulatedSharing(tmp_path / "sim.json", timeslice_unsupported={uuid})
    state = _state(tmp_path, sim)
    out = state.prepare([_claim("ts", "gpu-2", config=TIMESLICE_LONG), _claim("ok", "gpu-3")])
    assert isinstance(out["ts"], Exception)
    assert "claim ns/claim-ts" in str(out["ts"]) and "does not support time-slice" in str(out["ts"])
    assert isinstance(out["ok"], list)
    assert "ts" not in state.prepared_claims() and not state.spec_path("ts").exists()


def test_time_slicing_on_mig_takes_no_hardware_step(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sim)
    mig = _config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig")
    out = state.prepare([_claim("m", "gpu-0-mig-1g10gb-19-6", config=mig)])
    assert isinstance(out["m"], list)
    assert sim.read().gpus == {} and state.prepared_claims()["m"].devices[0].timeslice is None


def test_mps_daemon_per_claim(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sim)
    assert isinstance(state.prepare([_claim("m", "gpu-2", config=MPS)])["m"], list)
    rec = state.prepared_claims()["m"]
    assert rec.mps is not None and rec.mps.uuids == [_uuid(2)]
    daemon = sim.read().mps["m"]
    assert daemon.state == "running" and daemon.uuids == [_uuid(2)]
    assert daemon.active_thread_percentage == 40 and daemon.pinned_memory == {"0": "8192M"}
    spec = json.loads(state.spec_path("m").read_text())
    (edits,) = [d["containerEdits"] for d in spec["devices"]]  # the MPS client's device
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts == {"/tmp/nvidia-mps": daemon.pipe_dir, "/dev/shm": daemon.shm_dir}
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in edits["env"]
    assert state.unprepare([_ref("m")]) == {"m": None}
    assert sim.read().mps["m"].state == "stopped"
    assert not Path(daemon.pipe_dir).exists()


def test_restart_stops_daemons_of_interrupted_prepares_and_restarts_dead_ones(
    tmp_path: Path,
) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sim)
    state.prepare([_claim("keep", "gpu-2", config=MPS)])
    # A crash right after the daemon of another claim started: the claim is PrepareStarted.
    sim.start_mps(MpsDaemon("lost", ("GPU-Z",), tmp_path / "lp", tmp_path / "ll", tmp_path / "ls"))
    sim.kill_mps("keep")
    _state(tmp_path, sim)
    daemons = sim.read().mps
    assert daemons["lost"].state == "stopped"
    assert daemons["keep"].state == "running" and daemons["keep"].starts == 2


def test_reboot_drops_claims_and_undoes_their_sharing(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sim)
    state.prepare([_claim("m", "gpu-2", config=MPS), _claim("t", "gpu-3", config=TIMESLICE_LONG)])
    _state(tmp_path, sim, boot_id="boot-2")
    assert sim.read().mps["m"].state == "stopped"
    assert sim.read().gpus[_uuid(3)].timeslice == "Default"


def test_an_mps_tool_outside_the_driver_root_fails_the_daemon_with_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon runs the host's copy of the tool, which only the driver root names: one
    found elsewhere on PATH fails the start with a SharingError (its claim's error), not a
    ValueError that would fail every claim of the batch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '')}")
    backend = HostSharing(tmp_path / "mps", tmp_path / "driver-root")
    daemon = daemon_for(tmp_path / "mps", "claim-1", ["GPU-1"])
    with pytest.raises(SharingError, match=r"is not in the driver root .*--driver-root"):
        backend.start_mps(daemon)


def test_a_daemon_whose_quit_fails_is_still_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung daemon makes the control client time out (or the tool is gone after a driver
    upgrade): the recorded process is still terminated, not left running with no claim."""
    from dra_driver.gpu.sharing import host as hostmod
    from dra_driver.gpu.sharing import procs

    daemon = subprocess.Popen(["sleep", "60"])
    try:
        backend = HostSharing(tmp_path / "gpu.dra.dev" / "mps")
        identity = procs.identify(daemon.pid)
        assert identity is not None
        backend._record("d1", identity)

        def hung(pipe_dir: Path, command: str) -> subprocess.CompletedProcess[str]:
            raise SharingError("nvidia-cuda-mps-control: timed out after 30 seconds")

        monkeypatch.setattr(backend, "_control", hung)
        monkeypatch.setattr(backend, "_cleanup", lambda daemon_id, shm_dir: None)
        monkeypatch.setattr(hostmod, "QUIT_GRACE", 0.1)
        backend.stop_mps("d1", backend.mps_root / "d1" / "pipe")
        assert daemon.wait(timeout=5) == -signal.SIGTERM
        assert not (backend.registry / "d1.json").exists()
    finally:
        daemon.kill()
        daemon.wait()


def _whole_root(tmp_path: Path) -> tuple[Path, Path]:
    """A driver root that is a whole root filesystem (the chart mounts the host's /) whose
    libc is not this system's: here one that cannot load at all."""
    root = tmp_path / "driver-root"
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    (root / "usr" / "bin").mkdir()
    (libs / "libc.so.6").write_bytes(b"\x7fELF\x02\x01\x01\x00 another system's libc")
    return root, libs


def test_the_driver_roots_own_libc_is_not_lent_to_its_tools(tmp_path: Path) -> None:
    """nvidia-smi from the driver root runs under this system's dynamic loader: given the
    driver root's library directories (LD_LIBRARY_PATH), it loaded that system's libc and
    failed before main wherever the two differ (an agent image and a host of other glibc)."""
    root, _ = _whole_root(tmp_path)
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$@" > "$0.args"\n')
    smi.chmod(0o755)
    HostSharing(tmp_path / "mps", driver_root=root).set_timeslice("GPU-1", "Short")
    assert smi.with_name("nvidia-smi.args").read_text().split() == [
        "compute-policy",
        "-i",
        "GPU-1",
        f"--set-timeslice={timeslice_value('Short')}",
    ]


def test_only_the_mps_daemon_gets_the_driver_libraries_preloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's own tools of the launch (sh, mkdir, mount, unshare) run with the host's
    libraries; the daemon gets the driver's NVML and CUDA preloaded by their host paths."""
    from dra_driver.gpu.sharing import host as hostmod
    from dra_driver.gpu.sharing import procs

    root, libs = _whole_root(tmp_path)
    for name in ("libnvidia-ml.so.1", "libcuda.so.1"):
        (libs / name).write_bytes(b"")
    tool = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    host_root = Path("/run/nvidia/driver")
    backend = HostSharing(tmp_path / "mps", driver_root=root, host_driver_root=host_root)
    seen: dict[str, Any] = {}

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(argv=argv, env=kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(procs, "host_namespace_pid", lambda: 1)
    monkeypatch.setattr(hostmod.subprocess, "run", run)
    monkeypatch.setattr(backend, "_search", lambda *a: None)
    daemon = daemon_for(tmp_path / "mps", "claim-1", ["GPU-1"])
    with pytest.raises(SharingError, match="no daemon serves"):
        backend.start_mps(daemon)
    assert "LD_LIBRARY_PATH" not in seen["env"] and "LD_PRELOAD" not in seen["env"]
    argv = seen["argv"]
    at = argv.index("env")
    host_libs = host_root / "usr" / "lib" / "x86_64-linux-gnu"
    assert argv[at + 1 : at + 3] == [
        f"PATH={host_root}/usr/bin:{host_root}/usr/local/bin:{host_root}/bin:"
        + os.environ["PATH"],
        f"LD_PRELOAD={host_libs}/libnvidia-ml.so.1 {host_libs}/libcuda.so.1",
    ]
    assert argv[at + 3 :] == [str(host_root / "usr" / "bin" / "nvidia-cuda-mps-control"), "-d"]
