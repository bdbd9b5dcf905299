"""Which pool a node publishes: static devices, dynamic MIG placements, or the fallback.

Dynamic MIG needs the API server's DRAPartitionableDevices feature. Where it is off the
server silently drops ``sharedCounters`` and ``consumesCounters``; the slices would then offer
overlapping placements with nothing to stop the scheduler from handing out both. So when the
publisher reports those fields dropped, the node says so once, loudly, and publishes what a
node without dynamic MIG would: whole GPUs and the MIG devices that exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import structlog

from dra_driver.gpu.inventory import Inventory, MigState
from dra_driver.gpu.mig.backend import MigBackend, live_inventory
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.resourceslice.pool import DesiredPool

log = structlog.get_logger(__name__)

FEATURE_GATE = "DRAPartitionableDevices"


def fallback_inventory(inventory: Inventory, backend: MigBackend) -> Inventory:
    """The node as static publishing sees it: existing MIG devices, else the whole GPU.

    A GPU that dynamic MIG left in MIG mode without instances is offered whole (preparing it
    turns MIG mode off) instead of disappearing from the node.
    """
    live = live_inventory(inventory, backend)
    gpus = tuple(
        g.model_copy(update={"mig": MigState(capable=True)})
        if g.mig_enabled and not g.mig_devices
        else g
        for g in live.gpus
    )
    return live.model_copy(update={"gpus": gpus})


class MigPublishing:
    """Chooses the catalogue to publish and falls back when the cluster lacks partitionable
    devices."""

    def __init__(
        self,
        backend: MigBackend | None,
        inventory: Inventory,
        shared: frozenset[str] = frozenset(),
    ) -> None:
        """``shared``: UUIDs of the GPUs published as shared GPUs (sharing by memory)."""
        self.backend = backend
        self._inventory = inventory
        self.shared = shared
        self.catalog = build_catalog(inventory, dynamic=backend is not None, shared=shared)
        self.fallback: Inventory | None = None  # set once dynamic MIG had to be given up

    @property
    def dynamic(self) -> bool:
        """Whether MIG placements with counters are being published."""
        return self.backend is not None and self.fallback is None

    def pool(
        self,
        node_name: str,
        driver: str,
        taints: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    ) -> DesiredPool:
        """The pool to publish now."""
        return self.catalog.pool(node_name, driver, taints)

    async def on_dropped(self, gates: Iterable[str]) -> bool:
        """Handle the publisher's dropped-fields report; True if the pool must be republished."""
        if not self.dynamic or FEATURE_GATE not in set(gates):
            return False
        assert self.backend is not None
        log.error(
            "dynamic MIG is not possible on this cluster: the API server drops sharedCounters "
            "and consumesCounters (feature gate DRAPartitionableDevices is off); publishing "
            "whole GPUs and existing MIG devices instead",
            feature_gate=FEATURE_GATE,
        )
        self.fallback = await asyncio.to_thread(fallback_inventory, self._inventory, self.backend)
        self.catalog = build_catalog(self.fallback, shared=self.shared)
        return True
