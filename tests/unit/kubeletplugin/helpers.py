"""Fakes and helpers for the kubelet plugin tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver.kubeletplugin import (
    ClaimRef,
    ClaimToPrepare,
    DeviceHealth,
    PluginConfig,
    PreparedDevice,
)
from dra_driver.kubeletplugin.threads import OTHER_CALLS

DRIVER = "gpu.dra.dev"
NODE = "node-a"


def make_claim(
    uid: str,
    name: str | None = None,
    namespace: str = "default",
    *,
    allocated: bool = True,
    results: Sequence[dict[str, Any]] | None = None,
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim JSON dict, allocated with one device of our driver by default."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {},
    }
    if allocated:
        if results is None:
            results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{uid}"}]
        claim["status"]["allocation"] = {
            "devices": {"results": list(results), "config": list(config)}
        }
    return claim


class FakeFetcher:
    """Serves claims from a dict keyed by (namespace, name)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: dict[tuple[str, str], Exception] = {}
        self.calls = 0

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        await asyncio.sleep(0)
        if (namespace, name) in self.errors:
            raise self.errors[(namespace, name)]
        return self.claims.get((namespace, name))


@dataclass
class FakeDriver:
    """Records calls, checks that no two calls overlap, and is idempotent."""

    delay: float = 0.0
    fail: set[str] = field(default_factory=set)
    prepared: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    active: int = 0
    overlaps: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    #: ``OTHER_CALLS`` as each call saw it: the kubelet's calls in progress besides its batch.
    others: list[int] = field(default_factory=list)

    async def _enter(self, op: str, uids: tuple[str, ...]) -> None:
        self.active += 1
        if self.active > 1:
            self.overlaps += 1
        self.calls.append((op, uids))
        self.others.append(OTHER_CALLS.get())
        self.started.set()
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        except BaseException:
            self.active -= 1
            raise

    async def prepare(
        self, claims: Sequence[ClaimToPrepare]
    ) -> Mapping[str, Sequence[PreparedDevice] | Exception]:
        await self._enter("prepare", tuple(c.ref.uid for c in claims))
        try:
            out: dict[str, Sequence[PreparedDevice] | Exception] = {}
            for c in claims:
                if c.ref.uid in self.fail:
                    out[c.ref.uid] = RuntimeError(f"boom for {c.ref.name}")
                    continue
                devices = self.prepared.get(c.ref.uid)
                if devices is None:
                    devices = tuple(
                        PreparedDevice(
                            request_names=(r["request"],),
                            pool_name=r["pool"],
                            device_name=r["device"],
                            cdi_device_ids=(f"k8s.gpu.dra.dev/claim={c.ref.uid}-{r['device']}",),
                            share_id=r.get("shareID"),
                        )
                        for r in c.results
                    )
                    self.prepared[c.ref.uid] = devices
                out[c.ref.uid] = devices
            return out
        finally:
            self.active -= 1

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        await self._enter("unprepare", tuple(c.uid for c in claims))
        try:
            for c in claims:
                self.prepared.pop(c.uid, None)  # unknown claims are fine: idempotent
            return dict.fromkeys((c.uid for c in claims), None)
        finally:
            self.active -= 1


class ListHealthSource:
    """Yields the given device lists in order, then waits until cancelled."""

    def __init__(self, updates: Sequence[Sequence[DeviceHealth]]) -> None:
        self.updates = updates

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        for update in self.updates:
            yield update
        await asyncio.Event().wait()


def config_for(base: Path, **kwargs: Any) -> PluginConfig:
    """Plugin settings rooted in ``base``."""
    return PluginConfig(
        driver_name=DRIVER,
        node_name=NODE,
        registry_dir=base / "registry",
        plugins_dir=base / "plugins",
        watch_interval=0.1,
        stop_grace=0.5,
        **kwargs,
    )


def channel(path: Path) -> grpc.aio.Channel:
    """A client channel to a unix socket."""
    return grpc.aio.insecure_channel(f"unix:{path}")


def prepare_request(pb2: Any, *refs: ClaimRef) -> Any:
    """A NodePrepareResourcesRequest for ``refs`` in the message module ``pb2``."""
    return pb2.NodePrepareResourcesRequest(
        claims=[pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    )


def unprepare_request(pb2: Any, *refs: ClaimRef) -> Any:
    """A NodeUnprepareResourcesRequest for ``refs`` in the message module ``pb2``."""
    return pb2.NodeUnprepareResourcesRequest(
        claims=[pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    )
