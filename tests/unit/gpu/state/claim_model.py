"""A model of the kubelet and the node around the real claim state, for stateful tests.

:class:`NodeModel` is a hypothesis state machine. It drives the real :class:`GpuDriver` over
real :class:`DeviceState` agents (simulated discovery, MIG and sharing backends, files in a
temp directory) the way the kubelet and the node do: prepare and unprepare batches of claims
of every kind (whole GPUs, static and dynamic MIG, shares of a shared GPU, time-slicing and
MPS configs, admin access, invalid configs and UIDs, duplicate and overlapping requests),
with a filesystem fault or a crash at a named point armed for a step, restarts with and
without the API server's word, a second agent beside the first, and reboots.

The model keeps what the kubelet was told and what the API server holds, and checks after
every step:

- every claim answered prepared is recorded PrepareCompleted and has a valid CDI spec naming
  the devices it was given;
- no device is in two records unless both are shares or one has admin access, and (dynamic
  MIG) no two records hold overlapping placements or a GPU and a MIG device on it;
- no MIG device or MPS daemon is gone while a claim a pod uses or a CDI spec names it;
- a simple claim that nothing holds is prepared, and an unprepare without a fault succeeds;
- at the end, once everything is unprepared and the agent restarted with the API server
  saying no claim is left: no spec, daemon, MIG device, time-slice, MPS directory or temp
  file remains.

A crash is the process dying: :class:`Crash` (a ``BaseException`` nothing in the driver
catches) is raised at the armed point, and from then on every write of that agent raises it
too, so no cleanup of a dead process reaches the disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dra_driver import faults
from dra_driver.cdi import writer
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig import simulated as sim_mig
from dra_driver.gpu.mig.simulated import SimulatedMig
from dra_driver.gpu.publish.catalog import Catalog, build_catalog
from dra_driver.gpu.sharing import simulated as sim_sharing
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.state import journal
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.device_state import CHECKPOINT_FILE, SPEC_PREFIX, DeviceState
from dra_driver.gpu.state.evidence import Allocated, ClaimInUse, Evidence
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.cdi_schema import schema_errors
from tests.unit.faultfs import KINDS, OPERATIONS, FaultFS

NODE = "node-1"
DRIVER = "gpu.dra.dev"
API = "gpu.dra.dev/v1alpha1"
PROFILE = "mixed"  # two GPUs in MIG mode, an H100 and an L4
SHARED_MINOR = 3  # the L4 is published as a shared GPU

#: Every named crash point prepare, unprepare and start-up pass.
CRASH_POINTS = (
    "prepare.started-recorded",
    "prepare.mig-disabled",
    "prepare.mig-enabled",
    "prepare.mig-created",
    "prepare.mps-started",
    "prepare.timeslice-set",
    "prepare.cdi-written",
    "prepare.completed-recorded",
    "cdi.before-rename",
    "checkpoint.before-rename",
    "journal.before-sync",
    "mig.gi-created",
    "mig.ci-destroyed",
    "unprepare.started-recorded",
    "unprepare.sharing-released",
    "unprepare.cdi-removed",
    "unprepare.mig-destroyed",
    "unprepare.recorded",
)


def _config(kind: str, **fields: Any) -> dict[str, Any]:
    params = {"apiVersion": API, "kind": kind, **fields}
    return {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}


MPS = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}
#: Configs by name; the ``bad-`` ones are refused with a message naming the field.
CONFIGS: dict[str, tuple[dict[str, Any], ...]] = {
    "none": (),
    "timeslice": (
        _config(
            "GpuConfig",
            sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        ),
    ),
    "mps": (_config("GpuConfig", sharing=MPS),),
    "mig-mps": (_config("MigDeviceConfig", sharing=MPS),),
    "bad-percentage": (
        _config(
            "GpuConfig",
            sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 500}},
        ),
    ),
    "bad-mixed": (
        _config(
            "GpuConfig",
            sharing={"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 5}},
        ),
    ),
    "bad-key": (_config("GpuConfig", sharingg={"strategy": "MPS"}),),
}
INVALID_UIDS = ("..", "a/../b", "")
SHARE_MEMORY = ("4Gi", "8Gi", "16Gi")


class Crash(BaseException):
    """The agent process died here (nothing in the driver catches a ``BaseException``)."""


@dataclass
class CrashingFS(FaultFS):
    """A :class:`FaultFS` that, once the process has "died", refuses every further write."""

    dead: bool = False

    def _due(self, op: str) -> Any:
        if self.dead:
            raise Crash(f"{op} after the crash")
        return super()._due(op)


def _hardware_write(path: Path, data: dict[str, Any], **_: Any) -> None:
    """The simulated backends' state stands for the hardware: neither the file faults nor a
    crash of the agent touch it."""
    tmp = path.with_name(f"{path.name}.hw")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@dataclass(frozen=True)
class Node:
    """The node's fixed parts: the inventory, the catalogue the agents publish, its devices
    by kind, and whether MIG devices are made on demand."""

    inventory: Inventory
    dynamic: bool
    catalog: Catalog
    whole: tuple[str, ...]
    mig: tuple[str, ...]
    shared: str

    @classmethod
    def build(cls, dynamic: bool) -> Node:
        """The mixed profile, with dynamic MIG or with its static MIG devices."""
        inventory = SimulatedDiscovery(PROFILE, NODE).discover()
        shared = next(g for g in inventory.gpus if g.minor == SHARED_MINOR)
        catalog = build_catalog(inventory, dynamic=dynamic, shared=frozenset({shared.uuid}))
        names = [str(d["name"]) for d in catalog.published()]
        kinds = {n: catalog.entries[n] for n in names}
        return cls(
            inventory=inventory,
            dynamic=dynamic,
            catalog=catalog,
            whole=tuple(n for n, e in kinds.items() if e.kind == "gpu" and not e.shared),
            mig=tuple(n for n, e in kinds.items() if e.kind == "mig"),
            shared=next(n for n, e in kinds.items() if e.shared),
        )

    def gpu_of(self, device: str) -> str:
        """The UUID of the GPU a device is (on)."""
        return self.catalog.entries[device].gpu.uuid


@dataclass
class Model:
    """What the kubelet and the API server know."""

    claims: dict[str, ClaimToPrepare] = field(default_factory=dict)  # every claim sent
    answered: dict[str, tuple[str, ...]] = field(default_factory=dict)  # UID -> CDI ids
    next_uid: int = 1


def _result(request: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **extra}


class NodeModel(RuleBasedStateMachine):
    """The kubelet, the API server and the node around real agents (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="claim-model-"))
        self.cdi = self.base / "cdi"
        self.state_dir = self.base / "plugin"
        self.model = Model()
        self.agents: list[GpuDriver] = []
        self.boot = 1
        self.fs = CrashingFS()
        self.crash: list[tuple[str, int]] = []  # the armed point and hits left
        self._undo = self._patch()
        self.node = Node.build(dynamic=False)

    # --- set-up and tear-down -------------------------------------------------------------

    def _patch(self) -> Callable[[], None]:
        """Install the fault layer, the crash points and the hardware writer; returns what
        undoes that."""
        saved: list[tuple[Any, str, Any]] = []

        def put(module: Any, name: str, value: Any) -> None:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)

        put(writer, "os", self.fs.os_module())
        put(journal, "os", self.fs.os_module())
        put(faults, "point", self._point)
        put(sim_mig, "write_atomic", _hardware_write)
        put(sim_sharing, "write_atomic", _hardware_write)

        def undo() -> None:
            for module, name, value in reversed(saved):
                setattr(module, name, value)

        return undo

    def _point(self, name: str) -> None:
        if self.crash and self.crash[0][0] == name:
            point, left = self.crash[0]
            self.crash[0] = (point, left - 1)
            if left <= 1:
                self.crash.clear()
                self.fs.dead = True
                raise Crash(name)

    @initialize(dynamic=st.booleans())
    def start(self, dynamic: bool) -> None:
        """A node with static or dynamic MIG, and its first agent."""
        self.node = Node.build(dynamic)
        self.agents.append(self._agent(self._api()))

    def teardown(self) -> None:
        try:
            self._unprepare_everything()
        finally:
            self._undo()
            shutil.rmtree(self.base, ignore_errors=True)

    # --- the node's parts -----------------------------------------------------------------

    @property
    def mig_file(self) -> Path:
        return self.state_dir / sim_mig.SIMULATED_STATE_FILE

    @property
    def sharing_file(self) -> Path:
        return self.state_dir / sim_sharing.SIMULATED_STATE_FILE

    def _agent(self, api: Mapping[str, ClaimInUse] | None) -> GpuDriver:
        """Start an agent (start-up runs here); a crash armed for it propagates."""
        inventory = self.node.inventory
        state = DeviceState(
            inventory=inventory,
            driver_name=DRIVER,
            node_name=NODE,
            cdi_root=self.cdi,
            state_dir=self.state_dir,
            boot_id=f"boot-{self.boot}",
            mig=SimulatedMig(self.mig_file, inventory) if self.node.dynamic else None,
            sharing=SimulatedSharing(self.sharing_file),
            shared_gpus=frozenset({self.node.gpu_of(self.node.shared)}),
            evidence=Evidence(specs={}, api=api),
        )
        return GpuDriver(state)

    def _api(self) -> dict[str, ClaimInUse]:
        """The API server's claims allocated on this node: every claim sent and not yet
        unprepared (a claim is deleted once its pod is gone and it is unprepared)."""
        return {
            uid: ClaimInUse(
                uid=uid,
                namespace=claim.ref.namespace,
                name=claim.ref.name,
                results=tuple(
                    Allocated(
                        request=str(r["request"]),
                        device=str(r["device"]),
                        share_id=r.get("shareID"),
                        admin=bool(r.get("adminAccess")),
                    )
                    for r in claim.results
                ),
                reserved=True,
            )
            for uid, claim in self.model.claims.items()
        }

    def _died(self, agent: GpuDriver) -> None:
        """The agent's process is gone; a new one writes again."""
        if agent in self.agents:
            self.agents.remove(agent)
        self.fs.dead = False
        self.fs.clear()
        self.crash.clear()

    # --- drawing claims -------------------------------------------------------------------

    def _uid(self) -> str:
        n = self.model.next_uid
        self.model.next_uid += 1
        return f"{n:08x}-0000-4000-8000-{n:012x}"

    def _new_claim(self, data: st.DataObject) -> ClaimToPrepare:
        node = self.node
        kind = data.draw(
            st.sampled_from(["whole", "mig", "share", "admin", "two", "duplicate", "bad-uid"]),
            label="kind",
        )
        uid = self._uid()
        if kind == "bad-uid":
            uid = data.draw(st.sampled_from(INVALID_UIDS), label="uid")
        config = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
        if kind == "share":
            memory = data.draw(st.sampled_from(SHARE_MEMORY), label="memory")
            capacity = {"memory": memory, "compute": "0", "multiprocessors": "0"}
            results = [
                _result("gpu", node.shared, shareID=f"share-{uid}", consumedCapacity=capacity)
            ]
        else:
            pick = st.sampled_from(node.whole + node.mig + (node.shared,))
            device = data.draw(st.sampled_from(node.mig) if kind == "mig" else pick, label="device")
            extra = {"adminAccess": True} if kind == "admin" else {}
            results = [_result("req0", device, **extra)]
            if kind == "two":
                results.append(_result("req1", data.draw(pick, label="second")))
            elif kind == "duplicate":
                results.append(_result("req1", device))
        name = f"claim-{self.model.next_uid}"
        return ClaimToPrepare(
            ref=ClaimRef("ns", name, uid),
            claim={},
            results=tuple(results),
            config=CONFIGS[config],
        )

    def _draw_fault(self, data: st.DataObject) -> None:
        """Arm a filesystem fault or a crash point for the next step, or neither."""
        what = data.draw(st.sampled_from(["none", "none", "fs", "crash"]), label="fault")
        if what == "fs":
            op = data.draw(st.sampled_from(OPERATIONS), label="op")
            kind = data.draw(st.sampled_from(KINDS), label="kind")
            if op != "write" and kind == "short":
                kind = "EIO"
            self.fs.arm(op, data.draw(st.integers(1, 6), label="nth"), kind)
        elif what == "crash":
            point = data.draw(st.sampled_from(CRASH_POINTS), label="point")
            self.crash = [(point, data.draw(st.integers(1, 2), label="at"))]

    def _run(self, agent: GpuDriver, call: Any) -> Any:
        """Run one call of the agent; ``None`` when the agent crashed in it."""
        try:
            return asyncio.run(call)
        except Crash:
            self._died(agent)
            return None
        finally:
            self.fs.clear()
            self.crash.clear()

    # --- rules ----------------------------------------------------------------------------

    @precondition(lambda self: bool(self.agents))
    @rule(data=st.data())
    def prepare(self, data: st.DataObject) -> None:
        """The kubelet prepares a batch: new claims, retries of claims it sent, duplicates."""
        batch: list[ClaimToPrepare] = []
        for _ in range(data.draw(st.integers(1, 3), label="size")):
            sent = sorted(self.model.claims)
            if sent and data.draw(st.booleans(), label="again"):
                batch.append(self.model.claims[data.draw(st.sampled_from(sent), label="uid")])
            else:
                batch.append(self._new_claim(data))
        if data.draw(st.booleans(), label="repeat") and batch:
            batch.append(batch[0])
        agent = data.draw(st.sampled_from(self.agents), label="agent")
        self._draw_fault(data)
        faulted = bool(self.fs.faults or self.crash)
        must_succeed = None if faulted or len(batch) != 1 else self._free_and_simple(batch[0])
        for claim in batch:
            self.model.claims.setdefault(claim.ref.uid, claim)
        results = self._run(agent, agent.prepare(batch))
        if results is None:
            return  # no answer: the kubelet retries, or unprepares once the pod is gone
        assert {c.ref.uid for c in batch} <= set(results)
        for claim in batch:
            outcome = results[claim.ref.uid]
            if isinstance(outcome, Exception):
                # A batch's claims with one UID (invalid ones) are answered for the first.
                assert any(str(c.ref) in str(outcome) for c in batch if c.ref.uid == claim.ref.uid)
                assert claim.ref.uid != must_succeed, f"{claim.ref} refused: {outcome}"
                self.model.answered.pop(claim.ref.uid, None)
                continue
            assert outcome is not None
            devices = {d.device_name for d in outcome}
            assert devices == {str(r["device"]) for r in claim.results}, outcome
            ids = tuple(i for d in outcome for i in d.cdi_device_ids)
            if claim.ref.uid in self.model.answered:
                assert self.model.answered[claim.ref.uid] == ids, "a repeat changed the answer"
            self.model.answered[claim.ref.uid] = ids

    def _free_and_simple(self, claim: ClaimToPrepare) -> str | None:
        """The claim's UID if it must be prepared: one whole GPU or static MIG device without
        config, nothing recorded on its GPU, nothing made there on demand."""
        if len(claim.results) != 1 or claim.config or claim.ref.uid in INVALID_UIDS:
            return None
        device = str(claim.results[0]["device"])
        if device == self.node.shared or claim.results[0].get("adminAccess"):
            return None
        if self.node.dynamic and device in self.node.mig:
            return None
        gpu = self.node.gpu_of(device)
        for rec in stored_claims(self.state_dir / CHECKPOINT_FILE).values():
            for d in rec.get("devices", []):
                name = d["deviceName"]
                if name == device or (self.node.dynamic and self.node.gpu_of(name) == gpu):
                    return None
        if self.node.dynamic and self._instances().get(gpu):
            return None
        return claim.ref.uid

    @precondition(lambda self: bool(self.agents) and bool(self.model.claims))
    @rule(data=st.data())
    def unprepare(self, data: st.DataObject) -> None:
        """The kubelet unprepares a batch of claims it sent (and perhaps one it never did)."""
        sent = sorted(self.model.claims)
        uids = data.draw(st.lists(st.sampled_from(sent), min_size=1, max_size=3), label="uids")
        refs = [self.model.claims[u].ref for u in uids]
        if data.draw(st.booleans(), label="unknown"):
            refs.append(ClaimRef("ns", "never-sent", self._uid()))
        agent = data.draw(st.sampled_from(self.agents), label="agent")
        self._draw_fault(data)
        faulted = bool(self.fs.faults or self.crash)
        for ref in refs:
            # The pod is gone: whatever the answer, the claim is no longer in use.
            self.model.answered.pop(ref.uid, None)
        results = self._run(agent, agent.unprepare(refs))
        if results is None:
            return
        for ref in refs:
            outcome = results[ref.uid]
            if outcome is None:
                self.model.claims.pop(ref.uid, None)
            else:
                assert faulted, f"unprepare of {ref} failed without a fault: {outcome}"
                assert str(ref) in str(outcome), outcome

    @precondition(lambda self: len(self.agents) < 2)
    @rule(with_api=st.booleans(), data=st.data())
    def start_agent(self, with_api: bool, data: st.DataObject) -> None:
        """An agent starts beside the running one (a surge update), or after it died; with or
        without an answer from the API server."""
        self._draw_fault(data)
        try:
            self.agents.append(self._agent(self._api() if with_api else None))
        except Crash:
            self.fs.dead = False
        except OSError as exc:
            # A start-up that cannot record what it found exits (and is restarted).
            assert self.fs.injected, exc
            assert "cannot write" in str(exc) or "cannot sync directory" in str(exc), exc
        finally:
            self.fs.clear()
            self.crash.clear()

    @precondition(lambda self: bool(self.agents))
    @rule(data=st.data())
    def agent_exits(self, data: st.DataObject) -> None:
        """An agent is killed between calls (an update finished, an OOM kill)."""
        self._died(data.draw(st.sampled_from(self.agents), label="agent"))

    @rule(with_api=st.booleans())
    def reboot(self, with_api: bool) -> None:
        """The node reboots: processes, MIG devices and MPS daemons are gone; files stay.
        Its pods start again, so the kubelet prepares their claims anew."""
        self.agents.clear()
        self.fs.dead = False
        self.boot += 1
        self.model.answered.clear()
        if self.mig_file.exists():
            state = json.loads(self.mig_file.read_text())
            for gpu in state["gpus"].values():
                gpu["instances"] = []
            _hardware_write(self.mig_file, state)
        if self.sharing_file.exists():
            state = json.loads(self.sharing_file.read_text())
            for daemon in state["mps"].values():
                daemon["state"] = "stopped"
            for gpu in state["gpus"].values():
                gpu["timeslice"] = "Default"
            _hardware_write(self.sharing_file, state)
        self.agents.append(self._agent(self._api() if with_api else None))

    # --- invariants -----------------------------------------------------------------------

    def _stored(self) -> dict[str, dict[str, Any]]:
        return stored_claims(self.state_dir / CHECKPOINT_FILE)

    def _specs(self) -> dict[str, dict[str, Any]]:
        if not self.cdi.exists():
            return {}
        return {
            p.name.removeprefix(SPEC_PREFIX).removesuffix(".json"): json.loads(p.read_text())
            for p in self.cdi.iterdir()
            if p.name.startswith(SPEC_PREFIX) and p.name.endswith(".json")
        }

    def _instances(self) -> dict[str, list[dict[str, Any]]]:
        if not self.mig_file.exists():
            return {}
        state = json.loads(self.mig_file.read_text())
        return {uuid: gpu["instances"] for uuid, gpu in state["gpus"].items()}

    def _daemons(self) -> dict[str, str]:
        if not self.sharing_file.exists():
            return {}
        state = json.loads(self.sharing_file.read_text())
        return {d: rec["state"] for d, rec in state["mps"].items()}

    @invariant()
    def answered_claims_are_recorded_with_their_specs(self) -> None:
        stored, specs = self._stored(), self._specs()
        for uid, ids in self.model.answered.items():
            assert stored.get(uid, {}).get("state") == "PrepareCompleted", (uid, stored.get(uid))
            assert uid in specs, f"claim {uid} answered prepared has no CDI spec"
            assert schema_errors(specs[uid]) == []
            names = {f"k8s.{DRIVER}/claim={d['name']}" for d in specs[uid]["devices"]}
            assert set(ids) <= names, (ids, names)

    @invariant()
    def no_device_is_held_twice(self) -> None:
        held: dict[str, str] = {}
        slices: dict[str, list[tuple[int, int, str]]] = {}
        whole: dict[str, str] = {}
        for uid, rec in self._stored().items():
            for d in rec.get("devices", []):
                if d.get("sharing") == "admin" or d.get("shareID"):
                    continue
                name = d["deviceName"]
                assert held.setdefault(name, uid) == uid, f"{name} held by {held[name]} and {uid}"
                if not self.node.dynamic:
                    continue
                gpu = self.node.gpu_of(name)
                mig = d.get("mig")
                if mig is None:
                    whole[gpu] = uid
                else:
                    slices.setdefault(gpu, []).append((mig["start"], mig["size"], uid))
        for gpu, taken in slices.items():
            assert gpu not in whole, f"GPU {gpu} held whole by {whole[gpu]} and in MIG pieces"
            cells = [(s + i, uid) for s, size, uid in taken for i in range(size)]
            assert len({c for c, _ in cells}) == len(cells), f"placements overlap on {gpu}"

    @invariant()
    def nothing_in_use_is_destroyed(self) -> None:
        daemons = self._daemons()
        existing = {i["uuid"] for g in self._instances().values() for i in g if i.get("uuid")}
        named: set[str] = set()
        for uid, rec in self._stored().items():
            if uid not in self.model.answered:
                continue  # no pod uses it: its prepare failed, or its unprepare began
            own = rec.get("mps")
            for mps in [own, *(d.get("mps") for d in rec.get("devices", []))]:
                if mps is not None:
                    assert daemons.get(mps["daemon"]) == "running", (uid, mps["daemon"], daemons)
            named |= {d["uuid"] for d in rec.get("devices", []) if d.get("mig")}
        if self.node.dynamic:
            for spec in self._specs().values():
                env = [e for e in spec["containerEdits"].get("env", [])]
                for e in env:
                    if e.startswith("NVIDIA_VISIBLE_DEVICES="):
                        named |= {u for u in e.split("=", 1)[1].split(",") if u.startswith("MIG-")}
            assert named <= existing, f"MIG devices in use were destroyed: {named - existing}"

    # --- the end --------------------------------------------------------------------------

    def _unprepare_everything(self) -> None:
        """Every claim is unprepared and deleted; an agent that hears so from the API server
        starts; nothing may be left."""
        self.fs.dead = False
        self.fs.clear()
        self.crash.clear()
        if not self.agents:
            self.agents.append(self._agent(self._api()))
        agent = self.agents[-1]
        refs = [c.ref for c in self.model.claims.values()]
        if refs:
            results = asyncio.run(agent.unprepare(refs))
            failed = {u: r for u, r in results.items() if r is not None}
            assert not failed, f"unprepare without faults failed: {failed}"
        self.model.claims.clear()
        self.model.answered.clear()
        self.agents = [self._agent({})]
        leftovers = {
            "specs": sorted(self._specs()),
            "records": sorted(self._stored()),
            "daemons": sorted(d for d, s in self._daemons().items() if s == "running"),
            "mps dirs": sorted(p.name for p in (self.state_dir / "mps").glob("*")),
            "temp files": sorted(
                p.name
                for d in (self.cdi, self.state_dir)
                if d.exists()
                for p in d.iterdir()
                if writer.is_temp_file(p.name)
            ),
        }
        if self.node.dynamic:
            leftovers["MIG devices"] = sorted(str(i) for g in self._instances().values() for i in g)
        if self.sharing_file.exists():
            slices = json.loads(self.sharing_file.read_text())["gpus"]
            leftovers["time-slices"] = sorted(
                u for u, g in slices.items() if g["timeslice"] != "Default"
            )
        assert not any(leftovers.values()), leftovers


def run_model(settings: Any) -> None:
    """Run :class:`NodeModel` under ``settings`` (for the fuzz target)."""
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(NodeModel, settings=settings)


__all__: Sequence[str] = ("NodeModel", "run_model")
