"""Prepare/unprepare on the node: CDI specs, the checkpoint, restarts and refusals."""

from __future__ import annotations

import errno
import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import faults
from dra_driver.cdi.spec import CdiNameError, parse_qualified_name
from dra_driver.cdi.writer import DurableWriteError
from dra_driver.gpu.container.claim_spec import cdi_device_id
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.inventory import Gpu, MigDevice, MigProfile
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.sharing.backend import MpsDaemon, SharingBackend
from dra_driver.gpu.sharing.host import HostSharing
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.checkpoint import ClaimState
from dra_driver.gpu.state.device_state import ClaimError, DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare, PreparedDevice
from dra_driver.kubeletplugin.lock import hold_file_lock
from dra_driver.kubeletplugin.sockets import LOCK_FILE_NAME
from tests.unit.cdi_schema import schema_errors
from tests.unit.gpu.mig.test_dynamic_mig import MIG_3G, NOTHING_IN_USE
from tests.unit.gpu.mig.test_dynamic_mig import _inventory as _h100
from tests.unit.gpu.state.claim_model import CONFIGS

NODE = "node-1"
DRIVER = "gpu.dra.dev"


def _state(
    tmp_path: Path,
    profile: str = "mixed",
    boot_id: str = "boot-1",
    sharing: SharingBackend | None = None,
) -> DeviceState:
    return DeviceState(
        inventory=SimulatedDiscovery(profile, NODE).discover(),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id=boot_id,
        sharing=sharing,
    )


def _claim(
    uid: str, *devices: str, config: list[dict[str, Any]] | None = None, admin: bool = False
) -> ClaimToPrepare:
    results = tuple(
        {
            "request": f"req{i}",
            "driver": DRIVER,
            "pool": NODE,
            "device": d,
            **({"adminAccess": True} if admin else {}),
        }
        for i, d in enumerate(devices)
    )
    return ClaimToPrepare(
        ref=ClaimRef("ns", f"claim-{uid}", uid),
        claim={},
        results=results,
        config=tuple(config or ()),
    )


def _spec(state: DeviceState, uid: str) -> dict[str, Any]:
    return json.loads(state.spec_path(uid).read_text())


def test_prepare_writes_a_valid_cdi_spec(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("uid-a", "gpu-2")])
    devices = out["uid-a"]
    assert isinstance(devices, list)
    assert devices == [
        PreparedDevice(("req0",), NODE, "gpu-2", ("k8s.gpu.dra.dev/claim=uid-a-gpu-2",))
    ]
    spec = _spec(state, "uid-a")
    assert state.spec_path("uid-a").name == "k8s.gpu.dra.dev-claim_uid-a.json"
    assert schema_errors(spec) == []
    assert spec["kind"] == "k8s.gpu.dra.dev/claim"
    assert spec["devices"][0]["name"] == "uid-a-gpu-2"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia2"}]
    edits = spec["containerEdits"]
    uuid = SimulatedDiscovery("mixed", NODE).discover().gpus[2].uuid
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in edits["env"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    for cdi_id in devices[0].cdi_device_ids:
        assert parse_qualified_name(cdi_id) == ("k8s.gpu.dra.dev", "claim", "uid-a-gpu-2")


def test_lowest_cdi_version(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("abc", "gpu-2"), _claim("123", "gpu-3")])
    assert _spec(state, "abc")["cdiVersion"] == "0.3.0"
    # A device name that starts with a digit needs 0.5.0.
    assert _spec(state, "123")["cdiVersion"] == "0.5.0"


@pytest.mark.parametrize(
    "name",
    [
        "k8s.gpu.dra.dev/claim=uid-a-gpu-2\n",
        "k8s.gpu.dra.dev/claim\n=uid-a-gpu-2",
        "k8s.gpu.dra.dev\n/claim=uid-a-gpu-2",
    ],
)
def test_cdi_names_with_a_trailing_newline_are_refused(name: str) -> None:
    """CDI (tags.cncf.io/container-device-interface/pkg/parser) refuses any character but
    letters, digits and ``_.:-`` in a device name (``_.-`` in vendor and class): a name
    ending in a newline must not pass as valid (a regex's ``$`` matches before one)."""
    with pytest.raises(CdiNameError):
        parse_qualified_name(name)
    with pytest.raises(CdiNameError):
        cdi_device_id("uid-a", "gpu-2", "share-1\n")


def test_mig_device_gets_its_caps(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("m", "gpu-0-mig-3g40gb-9-0")])
    assert not isinstance(out["m"], Exception)
    spec = _spec(state, "m")
    assert schema_errors(spec) == []
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0" and all(
        n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:]
    )
    mig_uuid = SimulatedDiscovery("mixed", NODE).discover().gpus[0].mig_devices[0].uuid
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in spec["containerEdits"]["env"]


def test_one_bad_claim_does_not_fail_the_others(tmp_path: Path) -> None:
    state = _state(tmp_path)
    bad_config = [
        {
            "source": "FromClaim",
            "requests": ["req0"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "Nope"},
                },
            },
        }
    ]
    out = state.prepare(
        [
            _claim("good", "gpu-2"),
            _claim("ghost", "gpu-99"),
            _claim("badcfg", "gpu-3", config=bad_config),
        ]
    )
    assert isinstance(out["good"], list)
    assert isinstance(out["ghost"], ClaimError) and "'gpu-99' is not published by this node" in str(
        out["ghost"]
    )
    assert "sharing.strategy" in str(out["badcfg"]) and "claim ns/claim-badcfg" in str(
        out["badcfg"]
    )
    assert set(state.prepared_claims()) == {"good"}
    assert not state.spec_path("ghost").exists() and not state.spec_path("badcfg").exists()


def test_repeat_prepare_returns_the_recorded_result(tmp_path: Path) -> None:
    state = _state(tmp_path)
    first = state.prepare([_claim("a", "gpu-2")])["a"]
    again = state.prepare([_claim("a", "gpu-2")])["a"]
    restarted = _state(tmp_path).prepare([_claim("a", "gpu-2")])["a"]
    assert first == again == restarted


def test_double_allocation_is_refused(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", "gpu-2")])
    out = state.prepare([_claim("b", "gpu-2")])
    assert "device gpu-2 is already prepared for claim ns/claim-a" in str(out["b"])
    # Within one batch too.
    out = state.prepare([_claim("c", "gpu-3"), _claim("d", "gpu-3")])
    assert isinstance(out["c"], list) and isinstance(out["d"], ClaimError)


def test_admin_access_may_share_a_device(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", "gpu-2")])
    out = state.prepare([_claim("monitor", "gpu-2", admin=True)])
    assert isinstance(out["monitor"], list)


def test_unprepare_after_restart_and_of_unknown_claims(tmp_path: Path) -> None:
    _state(tmp_path).prepare([_claim("a", "gpu-2")])
    state = _state(tmp_path)
    assert state.unprepare([ClaimRef("ns", "claim-a", "a"), ClaimRef("ns", "never", "zzz")]) == {
        "a": None,
        "zzz": None,
    }
    assert not state.spec_path("a").exists()
    assert _state(tmp_path).prepared_claims() == {}
    # The device is free again.
    assert isinstance(_state(tmp_path).prepare([_claim("b", "gpu-2")])["b"], list)


def test_mps_config_becomes_environment_and_pipe_mount(tmp_path: Path) -> None:
    state = _state(tmp_path)
    mps = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {
                        "strategy": "MPS",
                        "mpsConfig": {
                            "defaultActiveThreadPercentage": 25,
                            "defaultPinnedDeviceMemoryLimit": "10Gi",
                        },
                    },
                },
            },
        }
    ]
    out = state.prepare([_claim("mps", "gpu-2", config=mps)])
    assert isinstance(out["mps"], list)
    spec = _spec(state, "mps")
    assert schema_errors(spec) == []
    (edits,) = [d["containerEdits"] for d in spec["devices"]]  # the MPS client's device
    env = edits["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in env
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
    mount = edits["mounts"][0]
    assert mount["containerPath"] == "/tmp/nvidia-mps" and Path(mount["hostPath"]).is_dir()
    assert state.prepared_claims()["mps"].devices[0].sharing == "MPS"
    state.unprepare([ClaimRef("ns", "claim-mps", "mps")])
    assert not Path(mount["hostPath"]).exists()


def _snapshot(path: Path) -> checkpoint.CheckpointFile:
    """The checkpoint at ``path`` with its journal folded into the snapshot file."""
    file = checkpoint.CheckpointFile(path, "boot-1")
    file.write(file.read())  # the first write of a CheckpointFile is a snapshot
    return file


def test_corrupt_checkpoint_is_moved_aside(tmp_path: Path) -> None:
    _state(tmp_path).prepare([_claim("a", "gpu-2")])
    path = tmp_path / "plugin" / "checkpoint.json"
    _snapshot(path).close()
    path.write_text(path.read_text().replace("gpu-2", "gpu-3"))  # checksum no longer matches
    state = _state(tmp_path)
    assert state.corrupt is not None and "checksum mismatch" in state.corrupt.reason
    assert state.corrupt.moved_to.exists()
    # Rebuilt from the claim's CDI spec: the claim is not forgotten.
    rebuilt = state.prepared_claims()
    assert list(rebuilt) == ["a"] and [d.device_name for d in rebuilt["a"].devices] == ["gpu-2"]
    path.write_text("{not json")
    assert _state(tmp_path).corrupt is not None


def test_reboot_drops_stale_claims(tmp_path: Path) -> None:
    _state(tmp_path, boot_id="boot-1").prepare([_claim("a", "gpu-2")])
    state = _state(tmp_path, boot_id="boot-2")
    assert state.prepared_claims() == {}
    assert not state.spec_path("a").exists()


def test_interrupted_prepare_is_undone_at_start(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", "gpu-2")])
    file = checkpoint.CheckpointFile(tmp_path / "plugin" / "checkpoint.json", "boot-1")
    data = file.read()
    data.claims["a"].state = ClaimState.PREPARE_STARTED
    file.write(data)
    file.close()
    restarted = _state(tmp_path)
    assert restarted.prepared_claims() == {}
    assert not restarted.spec_path("a").exists()


def test_cdi_write_failure_is_a_claim_error(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (tmp_path / "cdi").write_text("a file where the directory should be")
    out = state.prepare([_claim("a", "gpu-2")])
    assert isinstance(out["a"], ClaimError) and "cannot write CDI spec" in str(out["a"])
    assert state.prepared_claims() == {}


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100", "l4x4", "mixed"])
def test_every_published_device_can_be_prepared(tmp_path: Path, profile: str) -> None:
    from dra_driver.gpu.publish.catalog import build_catalog

    state = _state(tmp_path, profile)
    names = [
        d["name"] for d in build_catalog(SimulatedDiscovery(profile, NODE).discover()).published()
    ]
    out = state.prepare([_claim(f"c{i}", n) for i, n in enumerate(names)])
    assert all(isinstance(v, list) for v in out.values())
    for i in range(len(names)):
        assert schema_errors(_spec(state, f"c{i}")) == []


@pytest.mark.parametrize(("config", "syncs"), [("none", 2), ("timeslice", 3)])
def test_syncs_per_claim_and_what_a_restart_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, syncs: int
) -> None:
    """Prepare and unprepare: one journal batch each, one fdatasync each, no fsync, and one
    more before a claim whose prepare makes more than its CDI spec (here a time-slice); what
    each answered is what a restart finds."""
    import os

    state = _state(tmp_path)
    calls: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, n=name, r=real: (calls.append(n), r(fd))[1])
    claim = _claim("a", "gpu-2", config=list(CONFIGS[config]))
    assert isinstance(state.prepare([claim])["a"], list)
    assert _state(tmp_path).prepared_claims()["a"].state is ClaimState.PREPARE_COMPLETED
    assert state.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    assert calls == ["fdatasync"] * syncs
    monkeypatch.undo()
    assert _state(tmp_path).prepared_claims() == {}


def test_only_batches_that_write_nothing_but_files_are_quick(tmp_path: Path) -> None:
    """Quick batches may run on the event loop: a plain claim is; one with a sharing config
    (a time-slice to set) is not, nor is unpreparing it or a claim not recorded."""
    state = _state(tmp_path)
    plain = _claim("a", "gpu-2")
    sliced = _claim("b", "gpu-3", config=list(CONFIGS["timeslice"]))
    assert state.quick_prepare([plain])
    assert not state.quick_prepare([plain, sliced])
    state.prepare([plain, sliced])
    assert state.quick_unprepare([plain.ref])
    assert not state.quick_unprepare([plain.ref, sliced.ref])
    assert not state.quick_unprepare([ClaimRef("ns", "claim-c", "c")])
    assert state.device_ids("a") == [
        ("gpu-2", SimulatedDiscovery("mixed", NODE).discover().gpus[2].uuid, None)
    ]
    assert state.device_ids("c") == []


def test_another_agent_sees_the_journal(tmp_path: Path) -> None:
    """A surge update runs two agents on one checkpoint: each takes up the other's batches."""
    first = _state(tmp_path)
    second = _state(tmp_path)
    assert isinstance(first.prepare([_claim("a", "gpu-2")])["a"], list)
    out = second.prepare([_claim("b", "gpu-2")])
    assert isinstance(out["b"], ClaimError) and "gpu-2" in str(out["b"])
    assert isinstance(second.prepare([_claim("c", "gpu-3")])["c"], list)
    assert first.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    assert sorted(_state(tmp_path).prepared_claims()) == ["c"]


def test_start_up_sweeps_our_temp_files_only_under_the_node_lock(tmp_path: Path) -> None:
    state_dir = tmp_path / "plugin"
    state_dir.mkdir()
    (tmp_path / "cdi").mkdir()
    left = [
        tmp_path / "cdi" / ".k8s.gpu.dra.dev-claim_d502e626-1aad.json.tyx394v0.tmp",
        state_dir / ".checkpoint.json.ab12cd34.tmp",
    ]
    kept = [
        tmp_path / "cdi" / ".other.vendor-x_1.json.tmp",
        tmp_path / "cdi" / "other.vendor-x_1.json",
    ]
    for path in left + kept:
        path.write_text("{")
    # While another agent of the node holds the lock (it may be writing), nothing is swept.
    started = threading.Event()
    with hold_file_lock(state_dir / LOCK_FILE_NAME):
        starting = threading.Thread(target=lambda: (started.set(), _state(tmp_path)))
        starting.start()
        started.wait()
        starting.join(timeout=0.3)
        assert starting.is_alive() and [p.exists() for p in left] == [True, True]
    starting.join()
    assert [p.exists() for p in left] == [False, False]
    assert [p.exists() for p in kept] == [True, True]


# --- one claim of a batch fails on the node, or raises --------------------------------------
#
# The node service merges several pods' prepares into one batch. A claim's step that fails
# must fail that claim alone, the others recorded PrepareCompleted in the batch's own final
# write; and should anything escape, no claim may be left PrepareCompleted in memory but
# PrepareStarted in the file: the kubelet's retry would be answered from memory, its pod would
# run, and the next start-up would undo the claim (stop its MPS daemon, delete its CDI spec)
# under the running pod, as it undoes every record not PrepareCompleted.

MPS = list(CONFIGS["mps"])
MIG_1G = "gpu-0-mig-1g10gb-19-0"


def _sharing_state(tmp_path: Path) -> DeviceState:
    return _state(tmp_path, sharing=SimulatedSharing(tmp_path / "sim.json"))


class FailingSharing(SimulatedSharing):
    """Simulated sharing whose start of the daemon ``daemon`` raises ``error`` and whose stop
    of it raises ``stop_error`` (each when given): a full disk under the backend, or a bug."""

    def __init__(
        self, path: Path, daemon: str, error: OSError | None, stop_error: Exception | None = None
    ) -> None:
        super().__init__(path)
        self.daemon, self.error, self.stop_error = daemon, error, stop_error

    def start_mps(self, daemon: MpsDaemon) -> None:
        if daemon.daemon_id == self.daemon and self.error is not None:
            raise self.error
        super().start_mps(daemon)

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        if daemon_id == self.daemon and self.stop_error is not None:
            raise self.stop_error
        super().stop_mps(daemon_id, pipe_dir)


def _daemon_oserror(tmp_path: Path) -> SimulatedSharing:
    # What HostSharing.start_mps's mkdir of the daemon's directories raised on a full disk.
    return FailingSharing(
        tmp_path / "sim.json", "b", OSError(errno.ENOSPC, "No space left on device", "/x/b/pipe")
    )


def _backend_write(tmp_path: Path) -> SimulatedSharing:
    # The backend's own state file cannot be written, nor can the undo's write.
    error = DurableWriteError(
        errno.ENOSPC, f"cannot write {tmp_path / 'sim.json'}: No space left on device"
    )
    return FailingSharing(tmp_path / "sim.json", "b", error, stop_error=error)


def _blocked_mps_directory(tmp_path: Path) -> SimulatedSharing:
    # SharingManager's own mkdir of b's daemon directories fails.
    (tmp_path / "plugin" / "mps").mkdir(parents=True)
    (tmp_path / "plugin" / "mps" / "b").write_text("a file where b's daemon directory goes")
    return SimulatedSharing(tmp_path / "sim.json")


SHARING_FAILURES = [
    pytest.param(_daemon_oserror, "No space left on device", id="daemon-oserror"),
    pytest.param(_backend_write, "cannot write", id="backend-state-write"),
    pytest.param(_blocked_mps_directory, "MPS daemon b: cannot create", id="mps-directory"),
]


def _stored_states(tmp_path: Path) -> dict[str, str]:
    return {
        uid: rec["state"]
        for uid, rec in checkpoint.stored_claims(tmp_path / "plugin" / "checkpoint.json").items()
    }


@pytest.mark.parametrize(("failing", "message"), SHARING_FAILURES)
def test_a_claim_whose_sharing_step_fails_on_the_node_fails_alone(
    tmp_path: Path, failing: Callable[[Path], SimulatedSharing], message: str
) -> None:
    sharing = failing(tmp_path)
    state = _state(tmp_path, sharing=sharing)
    # Two pods' prepares merged into one batch by the node service.
    out = state.prepare([_claim("a", "gpu-2", config=MPS), _claim("b", "gpu-3", config=MPS)])
    assert isinstance(out["a"], list)
    assert (
        isinstance(out["b"], ClaimError)
        and message in str(out["b"])
        and "claim ns/claim-b" in str(out["b"])
    )
    # A is recorded prepared by the batch's own final write; B, undone, not at all.
    assert _stored_states(tmp_path) == {"a": "PrepareCompleted"}
    assert state.spec_path("a").exists() and not state.spec_path("b").exists()
    assert {d: m.state for d, m in sharing.read().mps.items()} == {"a": "running"}
    # Pod B is deleted: its claim is unprepared; A stays recorded prepared.
    assert state.unprepare([ClaimRef("ns", "claim-b", "b")]) == {"b": None}
    assert _stored_states(tmp_path) == {"a": "PrepareCompleted"}


def test_a_claim_whose_daemon_cannot_be_stopped_on_the_node_fails_its_unprepare_alone(
    tmp_path: Path,
) -> None:
    """The stop of B's daemon fails on the node (a full disk under its record): B's unprepare
    fails, says why, and keeps B recorded for the kubelet's retry; A in the same batch goes."""
    error = OSError(errno.ENOSPC, "No space left on device", "/x/mps-daemons/b.json")
    sharing = FailingSharing(tmp_path / "sim.json", "b", None, stop_error=error)
    state = _state(tmp_path, sharing=sharing)
    out = state.prepare([_claim("a", "gpu-2", config=MPS), _claim("b", "gpu-3", config=MPS)])
    assert isinstance(out["a"], list) and isinstance(out["b"], list)
    done = state.unprepare([ClaimRef("ns", "claim-a", "a"), ClaimRef("ns", "claim-b", "b")])
    assert done["a"] is None
    assert isinstance(done["b"], ClaimError) and "No space left on device" in str(done["b"])
    assert _stored_states(tmp_path) == {"b": "PrepareCompleted"}
    sharing.stop_error = None  # the disk has room again: the kubelet's retry goes through
    assert state.unprepare([ClaimRef("ns", "claim-b", "b")]) == {"b": None}
    assert _stored_states(tmp_path) == {}


def test_a_restart_after_a_batch_with_a_failed_claim_keeps_the_claims_pods_use(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path, sharing=_daemon_oserror(tmp_path))
    state.prepare([_claim("a", "gpu-2", config=MPS), _claim("b", "gpu-3", config=MPS)])
    # The kubelet asks again for pod A's claim (it may not have seen the first answer): pod A runs.
    assert isinstance(state.prepare([_claim("a", "gpu-2", config=MPS)])["a"], list)
    # The agent restarts (a rolling update) while pod A runs: its CDI spec and MPS daemon stay.
    sharing = SimulatedSharing(tmp_path / "sim.json")
    restarted = _state(tmp_path, sharing=sharing)
    assert restarted.prepared_claims()["a"].state is ClaimState.PREPARE_COMPLETED
    assert restarted.spec_path("a").exists() and sharing.read().mps["a"].state == "running"


def test_a_start_up_that_cannot_make_a_dead_daemons_directories_goes_on(tmp_path: Path) -> None:
    """HostSharing.start_mps makes the daemon's directories itself: a failure is a SharingError,
    which start-up's restart of a dead daemon logs, not an OSError that ends the start-up."""
    prepared = _sharing_state(tmp_path).prepare([_claim("a", "gpu-2", config=MPS)])
    assert isinstance(prepared["a"], list)
    # The daemon is gone, and its directory cannot be made again.
    shutil.rmtree(tmp_path / "plugin" / "mps" / "a")
    (tmp_path / "plugin" / "mps" / "a").write_text("a file where a's daemon directory goes")
    restarted = _state(
        tmp_path, sharing=HostSharing(tmp_path / "plugin" / "mps", tmp_path / "no-driver-root")
    )
    assert restarted.prepared_claims()["a"].state is ClaimState.PREPARE_COMPLETED


class MigDiskFull(SimulatedMig):
    """Creating a 1g MIG device fails writing the backend's state file, as on a full disk."""

    def create(self, gpu: Gpu, profile: MigProfile, start: int) -> MigDevice:
        if profile.name.startswith("1g"):
            raise DurableWriteError(
                errno.ENOSPC, f"cannot write {self.path}: No space left on device"
            )
        return super().create(gpu, profile, start)


def _dynamic(tmp_path: Path, mig: type[SimulatedMig] = SimulatedMig) -> DeviceState:
    return DeviceState(
        inventory=_h100(),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        mig=mig(tmp_path / "plugin" / SIMULATED_STATE_FILE, _h100()),
        evidence=NOTHING_IN_USE,
    )


#: A batch whose second claim raises what no step of it handles: the agent, the batch, and
#: how to restart the agent once the fault is gone.
Escape = tuple[DeviceState, list[ClaimToPrepare], Callable[[], DeviceState]]


def _bug_after_the_second_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Escape:
    """A bug (no step handles a RuntimeError) once the second claim's CDI spec is written."""
    passes: list[str] = []

    def hook(name: str) -> None:
        if name == "prepare.cdi-written":
            passes.append(name)
            if len(passes) == 2:
                raise RuntimeError("a bug")

    monkeypatch.setattr(faults, "point", hook)
    batch = [_claim("a", "gpu-2", config=MPS), _claim("b", "gpu-3", config=MPS)]
    return _sharing_state(tmp_path), batch, lambda: _sharing_state(tmp_path)


def _mig_state_unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Escape:
    """The MIG backend's OSError, which the carve step does not handle, for the second claim."""
    return (
        _dynamic(tmp_path, MigDiskFull),
        [_claim("a", MIG_3G), _claim("b", MIG_1G)],
        lambda: _dynamic(tmp_path),
    )


def _bug_undoing_a_forgotten_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Escape:
    """The second claim's CDI spec cannot be written, which forgets the claim in memory; then
    a bug undoing its sharing: memory no longer holds the record the file holds."""
    state = _state(
        tmp_path,
        sharing=FailingSharing(tmp_path / "sim.json", "b", None, stop_error=RuntimeError("a bug")),
    )
    state.spec_path("b").mkdir(parents=True)  # a directory where b's CDI spec goes

    def restart() -> DeviceState:
        state.spec_path("b").rmdir()
        return _sharing_state(tmp_path)

    return state, [_claim("a", "gpu-2", config=MPS), _claim("b", "gpu-3", config=MPS)], restart


@pytest.mark.parametrize(
    ("escaping", "error"),
    [
        pytest.param(_bug_after_the_second_spec, RuntimeError, id="bug-after-cdi-spec"),
        pytest.param(_mig_state_unwritable, DurableWriteError, id="mig-backend-oserror"),
        pytest.param(_bug_undoing_a_forgotten_claim, RuntimeError, id="bug-in-undo"),
    ],
)
def test_an_error_escaping_a_batch_leaves_no_claim_prepared_in_memory_only(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    escaping: Callable[[Path, pytest.MonkeyPatch], Escape],
    error: type[Exception],
) -> None:
    state, claims, restart = escaping(tmp_path, monkeypatch)
    with pytest.raises(error):
        state.prepare(claims)  # the node service answers every claim of the batch with it
    stored = _stored_states(tmp_path)
    assert stored == {"a": "PrepareStarted", "b": "PrepareStarted"}
    # Memory is never ahead of the file: no claim is PrepareCompleted in memory only.
    assert [
        u
        for u, r in state.prepared_claims().items()
        if r.state is ClaimState.PREPARE_COMPLETED and stored.get(u) != "PrepareCompleted"
    ] == []
    # The kubelet's retry of A prepares it again and records it before answering. B's record
    # stays, as the file holds it: it names what B's prepare made, for a restart to undo.
    assert isinstance(state.prepare(claims[:1])["a"], list)
    assert _stored_states(tmp_path) == {"a": "PrepareCompleted", "b": "PrepareStarted"}
    # A restart keeps A (its pod runs) and undoes B (never answered prepared).
    restarted = restart()
    assert list(restarted.prepared_claims()) == ["a"] and restarted.spec_path("a").exists()
    assert not restarted.spec_path("b").exists()


@pytest.mark.parametrize(("cut", "kept"), [(1, []), (40, []), (-1, ["x"])])
def test_a_batch_after_another_agents_cut_batch_is_not_lost(
    tmp_path: Path, cut: int, kept: list[str]
) -> None:
    """A surge update: the first agent dies in the middle of appending a batch (a cut line at
    the journal's end, or a whole line without its newline); the second agent's next batch
    must not land behind it, where every later read stops before it."""
    from dra_driver.gpu.state.journal import Change, encode

    first = _state(tmp_path)
    second = _state(tmp_path)
    assert isinstance(first.prepare([_claim("a", "gpu-2")])["a"], list)
    assert isinstance(second.prepare([_claim("b", "gpu-3")])["b"], list)  # its snapshot
    # The first agent dies while appending a batch it never acknowledged.
    cut_line = encode([Change("x", {"state": "PrepareCompleted", "namespace": "ns", "name": "x"})])
    with (tmp_path / "plugin" / "checkpoint.json.journal").open("ab") as f:
        f.write(cut_line[:cut])
    assert isinstance(second.prepare([_claim("c", "gpu-1-mig-4g40gb-5-0")])["c"], list)
    assert second.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    # What the second agent answered is what a restart finds (and a whole cut line, which
    # the journal keeps as a record of something done).
    assert sorted(_state(tmp_path).prepared_claims()) == ["b", "c", *kept]


def test_a_snapshot_found_corrupt_while_running_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent keeps its records when its refresh finds the snapshot corrupt (and moved
    aside); its next write must be a snapshot of them, not a journal batch on top of a
    snapshot that is no longer there, which a later read takes for all there is."""
    import os

    assert isinstance(_state(tmp_path).prepare([_claim("a", "gpu-2")])["a"], list)
    state = _state(tmp_path)
    assert isinstance(state.prepare([_claim("d", "gpu-1-mig-4g40gb-5-0")])["d"], list)
    path = tmp_path / "plugin" / "checkpoint.json"
    assert "a" in json.loads(path.read_text())["data"]["claims"]  # in the snapshot only
    path.write_text("{not json")  # damaged while the agent runs
    assert isinstance(state.prepare([_claim("b", "gpu-3")])["b"], list)
    assert sorted(checkpoint.stored_claims(path)) == ["a", "b", "d"]
    # A failed write makes the agent read the files again: claim A must still hold gpu-2.
    real = os.fdatasync

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", no_space)
    assert isinstance(state.unprepare([ClaimRef("ns", "claim-b", "b")])["b"], ClaimError)
    monkeypatch.setattr(os, "fdatasync", real)
    out = state.prepare([_claim("c", "gpu-2")])
    assert isinstance(out["c"], ClaimError) and "claim-a" in str(out["c"])


def test_a_snapshot_found_corrupt_is_rewritten_before_another_agent_reads_it(
    tmp_path: Path,
) -> None:
    """A surge update: the agent that finds the snapshot corrupt moves it aside; the other
    agent must not then read the journal alone as all the node's records, and the snapshot
    written again keeps what the other agent journaled since the first last read."""
    assert isinstance(_state(tmp_path).prepare([_claim("a", "gpu-2")])["a"], list)
    first = _state(tmp_path)
    assert isinstance(first.prepare([_claim("d", "gpu-1-mig-4g40gb-5-0")])["d"], list)
    second = _state(tmp_path)
    assert isinstance(second.prepare([_claim("f", "gpu-0-mig-3g40gb-9-0")])["f"], list)
    assert isinstance(first.prepare([_claim("g", "gpu-0-mig-1g10gb-19-6")])["g"], list)
    # The other agent journals a batch the first has not read.
    assert isinstance(second.prepare([_claim("e", "gpu-3")])["e"], list)
    path = tmp_path / "plugin" / "checkpoint.json"
    path.write_text("{not json")  # damaged while the agents run
    # A batch that writes nothing (A is prepared already) still finds it corrupt.
    assert isinstance(first.prepare([_claim("a", "gpu-2")])["a"], list)
    out = second.prepare([_claim("c", "gpu-2")])
    assert isinstance(out["c"], ClaimError) and "claim-a" in str(out["c"])
    assert sorted(checkpoint.stored_claims(path)) == ["a", "d", "e", "f", "g"]
    assert sorted(_state(tmp_path).prepared_claims()) == ["a", "d", "e", "f", "g"]
