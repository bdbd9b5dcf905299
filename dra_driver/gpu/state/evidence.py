"""What start-up may take apart: proof of use from the API server and the CDI specs on disk.

The checkpoint is one witness of what is in use; it can be lost, corrupt, or written by an
agent that crashed. Destroying a MIG device or stopping an MPS daemon on its word alone can
pull a device from under a running pod, so start-up asks two more witnesses: the
ResourceClaims the API server says are allocated from this node's pool, and the claims' CDI
specs, which exist exactly while a claim is prepared. Something is taken apart only when all
three agree it is unused; when the API server cannot be asked, nothing is. The same
witnesses rebuild a corrupt or lost checkpoint (:mod:`.recovery`).

Everything here is pure but :func:`read_specs`, which only reads files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver.kubeletplugin.uid import valid_uid

log = structlog.get_logger(__name__)

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES="


@dataclass(frozen=True)
class Allocated:
    """One allocation result of this driver in this node's pool."""

    request: str
    device: str
    share_id: str | None = None
    admin: bool = False


@dataclass(frozen=True)
class ClaimInUse:
    """A claim the API server says holds devices of this node's pool."""

    uid: str
    namespace: str
    name: str
    results: tuple[Allocated, ...]
    reserved: bool  # reserved for at least one pod

    @property
    def devices(self) -> frozenset[str]:
        """The device names the claim holds."""
        return frozenset(r.device for r in self.results)


def claims_in_use(
    items: Iterable[Mapping[str, Any]], *, driver: str, pool: str
) -> dict[str, ClaimInUse]:
    """The claims among ``items`` (ResourceClaim JSON) allocated devices of ``driver`` in
    ``pool``, by UID. Malformed entries are skipped: this is evidence, not input to act on."""
    found: dict[str, ClaimInUse] = {}
    for claim in items:
        if not isinstance(claim, Mapping):
            continue
        meta = claim.get("metadata")
        status = claim.get("status")
        if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
            continue
        allocation = status.get("allocation")
        devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
        results = devices.get("results") if isinstance(devices, Mapping) else None
        if not isinstance(results, list):
            continue
        mine = tuple(
            Allocated(
                request=str(r.get("request", "")),
                device=str(r["device"]),
                share_id=str(r["shareID"]) if r.get("shareID") else None,
                admin=r.get("adminAccess") is True,
            )
            for r in results
            if isinstance(r, Mapping)
            and r.get("driver") == driver
            and r.get("pool") == pool
            and isinstance(r.get("device"), str)
        )
        uid = meta.get("uid")
        if not mine or not valid_uid(uid):
            continue
        found[uid] = ClaimInUse(
            uid=uid,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            results=mine,
            reserved=bool(status.get("reservedFor")),
        )
    return found


@dataclass(frozen=True)
class SpecOnDisk:
    """What a claim's CDI spec says about the claim."""

    uid: str
    cdi_names: tuple[str, ...]  # the CDI device names, ``<uid>-<device>[-<shareID>]``
    uuids: tuple[str, ...]  # NVIDIA_VISIBLE_DEVICES, one per device
    host_paths: tuple[str, ...]  # mounted host paths (the MPS pipe and shm directories)
    #: (CDI device name, host paths its own edits mount): the MPS clients among the devices.
    device_mounts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def mounting(self, host_path: str) -> frozenset[str] | None:
        """The CDI devices whose own edits mount ``host_path``; None when the claim's edits
        mount it (specs of older versions mounted MPS directories claim-wide)."""
        devices = frozenset(name for name, paths in self.device_mounts if host_path in paths)
        return devices or None


def read_specs(cdi_root: Path, prefix: str) -> dict[str, SpecOnDisk]:
    """The claims' CDI specs under ``cdi_root`` (files ``<prefix><uid>.json``), by claim UID.

    A spec that cannot be read or parsed still proves its claim was prepared: it is returned
    with what could be learnt (its UID), so the claim is kept. A file whose name holds no
    claim UID was never written by the driver (which refuses such UIDs): it is logged and
    left alone, as its UID would name paths (``..`` makes ``<state>/mps/<uid>`` the state
    directory itself) that start-up removes.
    """
    found: dict[str, SpecOnDisk] = {}
    try:
        paths = sorted(cdi_root.glob(f"{prefix}*.json"))
    except OSError:
        return found
    for path in paths:
        uid = path.name[len(prefix) : -len(".json")]
        if not valid_uid(uid):
            log.warning("CDI spec file not named after a claim UID: ignored", path=str(path))
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("unreadable CDI spec kept as evidence", path=str(path), error=str(exc))
            found[uid] = SpecOnDisk(uid=uid, cdi_names=(), uuids=(), host_paths=())
            continue
        found[uid] = parse_spec(uid, doc)
    return found


def parse_spec(uid: str, doc: Any) -> SpecOnDisk:
    """Pick a claim's devices, UUIDs and mounts out of its CDI spec JSON."""
    doc = doc if isinstance(doc, Mapping) else {}
    devices = [d for d in doc.get("devices") or () if isinstance(d, Mapping)]
    names = tuple(str(d.get("name")) for d in devices)
    edits = doc.get("containerEdits")
    edits = edits if isinstance(edits, Mapping) else {}
    uuids: tuple[str, ...] = ()
    for env in edits.get("env") or ():
        if isinstance(env, str) and env.startswith(VISIBLE_DEVICES):
            uuids = tuple(u for u in env[len(VISIBLE_DEVICES) :].split(",") if u)
    # MPS directories are mounted by the devices that use the daemon (claim-wide in specs
    # of older versions): every mount of the spec counts, each host path once.
    device_mounts = tuple((str(d.get("name")), _mounted(d.get("containerEdits"))) for d in devices)
    mounts = tuple(dict.fromkeys(p for _, paths in device_mounts for p in paths))
    return SpecOnDisk(
        uid=uid,
        cdi_names=names,
        uuids=uuids,
        host_paths=tuple(dict.fromkeys((*_mounted(edits), *mounts))),
        device_mounts=tuple((name, paths) for name, paths in device_mounts if paths),
    )


def _mounted(edits: Any) -> tuple[str, ...]:
    """The host paths a CDI ``containerEdits`` object mounts."""
    if not isinstance(edits, Mapping):
        return ()
    return tuple(
        str(m.get("hostPath"))
        for m in edits.get("mounts") or ()
        if isinstance(m, Mapping) and m.get("hostPath")
    )


def device_of(cdi_name: str, uid: str, known: Iterable[str]) -> tuple[str, str | None] | None:
    """(device name, share ID) behind a CDI device name ``<uid>-<device>[-<shareID>]``.

    Device names contain dashes, so the longest published name that fits wins.
    """
    rest = cdi_name.removeprefix(f"{uid}-")
    if rest == cdi_name:
        return None
    best = ""
    for name in known:
        if (rest == name or rest.startswith(f"{name}-")) and len(name) > len(best):
            best = name
    if not best:
        return None
    share = rest[len(best) + 1 :] or None
    return best, share


@dataclass(frozen=True)
class Evidence:
    """What start-up knows beside the checkpoint.

    ``api`` is ``None`` when the API server could not be asked: then nothing is provably
    unused, and nothing is destroyed.
    """

    specs: Mapping[str, SpecOnDisk]
    api: Mapping[str, ClaimInUse] | None

    def with_specs(self, specs: Mapping[str, SpecOnDisk]) -> Evidence:
        """The same API answer with the CDI specs found on disk."""
        return Evidence(specs=specs, api=self.api)

    def without(self, uids: Iterable[str]) -> Evidence:
        """The same evidence less the specs of claims start-up has just dropped."""
        gone = set(uids)
        specs = {uid: spec for uid, spec in self.specs.items() if uid not in gone}
        return Evidence(specs=specs, api=self.api)

    def claim_gone(self, uid: str) -> bool:
        """Whether the API server proves the claim no longer holds devices of this node."""
        return self.api is not None and uid not in self.api

    def devices_in_use(self) -> frozenset[str]:
        """Device names any claim of the API server holds on this node."""
        if self.api is None:
            return frozenset()
        return frozenset(d for claim in self.api.values() for d in claim.devices)

    def uuids_in_specs(self) -> frozenset[str]:
        """Every device UUID some claim's CDI spec hands to containers."""
        return frozenset(u for spec in self.specs.values() for u in spec.uuids)

    def paths_in_specs(self) -> frozenset[str]:
        """Every host path some claim's CDI spec mounts into containers."""
        return frozenset(p for spec in self.specs.values() for p in spec.host_paths)

    def may_destroy(self, device_name: str, uuid: str | None) -> bool:
        """Whether a MIG device no checkpoint record holds is provably unused: the API server
        answered, no claim there holds its placement, and no CDI spec hands out its UUID."""
        if self.api is None:
            return False
        if device_name and device_name in self.devices_in_use():
            return False
        return not (uuid and uuid in self.uuids_in_specs())


NO_EVIDENCE = Evidence(specs={}, api=None)
