"""Current health of every published device: pure bookkeeping of conditions, no I/O.

A condition comes from an event (an Xid, a lost GPU) about a source: a GPU or MIG UUID, or on
simulated nodes a device name. It lasts until a re-check of that source finds it healthy
(:mod:`dra_driver.gpu.health.recheck`): Xid events say something happened, never that it is
over.

An event on a GPU reaches every device name the GPU may be published under, whichever way
the catalogue (:mod:`dra_driver.gpu.publish.catalog`) publishes it: the GPU's own name
``gpu-N`` and its MIG devices that exist; dynamic MIG placements share ``gpu-N``'s health.
An event on a MIG device reaches that device only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.publish.devices import devices_for_gpu, gpu_device_name
from dra_driver.gpu.publish.partitions import placements
from dra_driver.kubeletplugin.interfaces import DeviceHealth, HealthStatus
from dra_driver.resourceapi import api_time

log = structlog.get_logger(__name__)

#: Xids caused by applications (bad memory access, user-triggered resets, ...): no taint.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: ``mig-failed``: creating a MIG device on the GPU failed; not a health problem of the
#: devices already in use, but no new claim should be placed there for a while.
#: ``mig-fragmented``: a share of the GPU's MIG slices fit by count but no placement was
#: free; the scheduler, which counts, would pick the GPU again, so it is kept off for a
#: short while (:data:`FRAGMENTED_HOLD`).
Problem = Literal["xid", "gpu-lost", "mig-failed", "mig-fragmented"]
#: Seconds a ``mig-fragmented`` GPU stays tainted: long enough for the scheduler to place
#: the pod it could not take elsewhere, short enough not to idle the GPU's free slices.
FRAGMENTED_HOLD = 30.0
#: Problems of MIG device creation, not of the devices in use.
MIG_PROBLEMS = ("mig-failed", "mig-fragmented")


@dataclass(frozen=True)
class HealthEvent:
    """Something happened to a GPU (or MIG device) identified by UUID (or device name)."""

    uuid: str
    problem: Problem
    xid: int | None = None
    message: str = ""  # what failed (mig-failed, mig-fragmented)
    hold: float = 0.0  # seconds before a re-check may clear it, at least


@dataclass(frozen=True)
class _Condition:
    problem: Problem
    xid: int | None
    since: str  # wall clock, for the taint's timeAdded
    source: str  # the event's UUID or name: what a re-check probes
    at: float  # monotonic seconds of the latest event, for re-check timing
    message: str = ""
    hold: float = 0.0


def parse_xids(text: str) -> frozenset[int]:
    """``"13,31,43"`` -> {13, 31, 43}."""
    return frozenset(int(x) for x in text.split(",") if x.strip())


@dataclass(frozen=True)
class DeviceNames:
    """Which device names an event reaches, and which ones the kubelet hears about."""

    affects: Mapping[str, tuple[str, ...]]  # event source (UUID or name) -> names it marks
    inherits: Mapping[str, str]  # dynamic MIG placement -> its GPU's name, whose health it has
    devices: tuple[str, ...]  # every name the node may publish: the kubelet's list


def device_names(inventory: Inventory) -> DeviceNames:
    """The names of :class:`DeviceNames` for every way the catalogue may publish
    ``inventory`` (static or dynamic MIG, placements or capacity layout).

    A GPU's events reach its own name ``gpu-N`` even in MIG mode: with dynamic MIG that
    device is published (whole or by its MIG slices) and its placements carry its taints,
    while the GPU stays in MIG mode after dynamic MIG used it, often with no MIG device left
    to carry a taint. Where ``gpu-N`` is not published (static MIG) its taint goes unused.
    """
    affects: dict[str, tuple[str, ...]] = {}
    inherits: dict[str, str] = {}
    for gpu in inventory.gpus:
        own = gpu_device_name(gpu)
        # Static MIG devices: the GPU's published devices in MIG mode, one per MIG device.
        migs = (
            {
                m.uuid: d["name"]
                for m, d in zip(gpu.mig_devices, devices_for_gpu(gpu, inventory), strict=True)
            }
            if gpu.mig_enabled
            else {}
        )
        affects[gpu.uuid] = affects[own] = tuple(dict.fromkeys((own, *migs.values())))
        for uuid, name in migs.items():
            affects[uuid] = affects[name] = (name,)
        if gpu.mig.capable:  # as the catalogue: only MIG-capable GPUs get placements
            inherits.update((p.device_name, own) for p in placements(gpu))
    devices = (*(n for names in affects.values() for n in names), *inherits)
    return DeviceNames(affects, inherits, tuple(dict.fromkeys(devices)))


class HealthTracker:
    """Which published devices are unhealthy, why, and since when."""

    def __init__(
        self,
        inventory: Inventory,
        driver_name: str,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
    ) -> None:
        self.driver_name = driver_name
        self.ignored_xids = frozenset(ignored_xids)
        # Device names are sources too, so a simulated node can be poked by name.
        self._names = device_names(inventory)
        self._conditions: dict[str, _Condition] = {}

    def apply(self, event: HealthEvent, now: float) -> bool:
        """Record an event seen at monotonic time ``now``; True if any device's health changed.

        A repeat of a device's current problem changes nothing but postpones its re-check.
        """
        names = self._names.affects.get(event.uuid)
        if names is None:
            log.warning(
                "health event for an unknown device", uuid=event.uuid, problem=event.problem
            )
            return False
        if event.problem == "xid" and event.xid in self.ignored_xids:
            return False
        changed = False
        for name in names:
            old = self._conditions.get(name)
            if (
                old is not None
                and event.problem in MIG_PROBLEMS
                and old.problem not in MIG_PROBLEMS
            ):
                # One condition a device: a MIG creation problem must not replace a health
                # problem, which would then read healthy to the kubelet and be cleared
                # without a probe (mig-fragmented after its hold).
                continue
            new = _Condition(
                event.problem, event.xid, api_time(), event.uuid, now, event.message, event.hold
            )
            if old is not None and (old.problem, old.xid) == (event.problem, event.xid):
                new = dataclasses.replace(new, since=old.since)
            else:
                changed = True
            self._conditions[name] = new
        return changed

    def saved(self) -> dict[str, dict[str, Any]]:
        """The health conditions as JSON, to outlive the agent (NVML does not report an
        event again to the next one). MIG creation problems are holds, not kept."""
        return {
            name: {"problem": c.problem, "xid": c.xid, "since": c.since, "source": c.source}
            for name, c in self._conditions.items()
            if c.problem not in MIG_PROBLEMS
        }

    def restore(self, saved: Mapping[str, Any], now: float) -> None:
        """Take back conditions :meth:`saved` wrote, as of monotonic ``now`` (a re-check is
        due an interval later). A device its source no longer reaches (GPUs renumbered or
        gone, MIG devices changed) is left healthy."""
        for name, entry in saved.items():
            try:
                problem, source = entry["problem"], entry["source"]
                xid, since = entry["xid"], str(entry["since"])
            except (KeyError, TypeError):
                continue
            if problem not in ("xid", "gpu-lost") or name not in self._names.affects.get(
                source, ()
            ):
                continue
            xid = int(xid) if isinstance(xid, int) else None
            self._conditions.setdefault(name, _Condition(problem, xid, since, source, now))

    def due(self, now: float, interval: float) -> list[str]:
        """The sources whose conditions are at least ``interval`` seconds old (and past their
        hold): re-check them."""
        return sorted(
            {c.source for c in self._conditions.values() if now - c.at >= max(interval, c.hold)}
        )

    def recover(self, source: str, *, before: float = math.inf) -> dict[str, str]:
        """A re-check found ``source`` healthy: clear what it caused; device -> former reason.

        ``before`` is the monotonic time the probe started: a condition whose latest event
        came at or after it is newer than the probe's answer and stays.
        """
        cleared = {
            n: c for n, c in self._conditions.items() if c.source == source and c.at < before
        }
        for name in cleared:
            del self._conditions[name]
        return {name: self._reason(c) for name, c in cleared.items()}

    def clear(self, source: str, problem: Problem) -> dict[str, str]:
        """Clear ``problem`` where ``source`` caused it, leaving any other problem of the
        devices; device -> former reason."""
        cleared = {
            n: c for n, c in self._conditions.items() if c.source == source and c.problem == problem
        }
        for name in cleared:
            del self._conditions[name]
        return {name: self._reason(c) for name, c in cleared.items()}

    def unhealthy(self) -> dict[str, str]:
        """Device name -> why it is tainted."""
        return {name: self._reason(c) for name, c in self._conditions.items()}

    @staticmethod
    def _reason(condition: _Condition) -> str:
        if condition.problem == "gpu-lost":
            return "GPU is lost (fell off the bus or stopped answering)"
        if condition.problem == "mig-failed":
            return f"creating a MIG device failed: {condition.message}"
        if condition.problem == "mig-fragmented":
            return f"no MIG placement free: {condition.message}"
        return f"critical Xid {condition.xid} error"

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        """Device name -> the taints to publish on it."""
        out: dict[str, list[dict[str, Any]]] = {}
        for name, c in self._conditions.items():
            taint: dict[str, Any] = {"effect": "NoSchedule", "timeAdded": c.since}
            if c.problem in ("gpu-lost", *MIG_PROBLEMS):
                taint["key"] = f"{self.driver_name}/{c.problem}"
            else:
                taint["key"] = f"{self.driver_name}/xid"
                taint["value"] = str(c.xid)
            out[name] = [taint]
        return out

    def device_health(self, pool_name: str) -> list[DeviceHealth]:
        """The complete device list as the kubelet's health stream carries it (a failed MIG
        creation is no health problem of the devices in use)."""
        bad = {
            name: self._reason(c)
            for name in self._names.devices
            if (c := self._health_condition(name)) is not None and c.problem not in MIG_PROBLEMS
        }
        return [
            DeviceHealth(
                pool_name=pool_name,
                device_name=name,
                status=HealthStatus.UNHEALTHY if name in bad else HealthStatus.HEALTHY,
                message=bad.get(name, ""),
            )
            for name in self._names.devices
        ]

    def _health_condition(self, name: str) -> _Condition | None:
        """The condition ``name`` has: its own, else (a placement) its GPU's, as the
        catalogue's taints of placements (a pod on a placement is hit by its GPU's loss)."""
        own = self._conditions.get(name)
        if own is None and (gpu := self._names.inherits.get(name)) is not None:
            return self._conditions.get(gpu)
        return own
