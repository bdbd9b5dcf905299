"""Which pool a node publishes: static devices, dynamic MIG placements, or a fallback.

Some of what the node publishes needs an optional feature of the API server: dynamic MIG
needs DRAPartitionableDevices (``sharedCounters``, ``consumesCounters``), GPUs shared by memory
need DRAConsumableCapacity (``allowMultipleAllocations``, a capacity's ``requestPolicy``) and
health taints need DRADeviceTaints. Where a feature is off, or the server predates it, the
server accepts the slices but silently drops those fields, which the slice publisher notices.
The node then gives the feature up, says so once, and publishes what works without it
(:data:`WITHOUT`): never overlapping placements with nothing to stop the scheduler from
handing out both, never an unhealthy GPU offered as healthy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import structlog

from dra_driver.gpu.inventory import Inventory, MigState
from dra_driver.gpu.mig.backend import MigBackend, live_inventory
from dra_driver.gpu.publish.catalog import CAPACITY, PLACEMENTS, build_catalog
from dra_driver.gpu.publish.overhead import overhead_fields
from dra_driver.resourceslice.pool import DesiredPool

log = structlog.get_logger(__name__)

PARTITIONABLE = "DRAPartitionableDevices"
CONSUMABLE = "DRAConsumableCapacity"
TAINTS = "DRADeviceTaints"
BINDING = "DRADeviceBindingConditions"
NODE_ALLOCATABLE = "DRANodeAllocatableResources"
LIST_ATTRIBUTES = "DRAListTypeAttributes"

#: What the node does without each optional feature it publishes with.
WITHOUT: Mapping[str, str] = {
    PARTITIONABLE: "no dynamic MIG: publishing whole GPUs and the MIG devices that exist",
    CONSUMABLE: "no sharing by memory: the shared GPUs are published as whole GPUs",
    TAINTS: "unhealthy GPUs are withdrawn from the slices instead of tainted",
    BINDING: "MIG devices are created when the kubelet prepares the claim, after binding",
    NODE_ALLOCATABLE: "the host resources a GPU costs the node (--node-overhead) are not "
    "declared; the scheduler does not count them",
    LIST_ATTRIBUTES: "the MIG profiles each GPU supports (migProfiles, --list-attributes) "
    "are not published",
}
#: For fields of another feature: the publisher stops sending them back and goes on.
OTHER_FIELDS = "publishing without the dropped fields"


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


class NodePublishing:
    """Chooses the catalogue to publish and falls back when the cluster lacks a feature."""

    def __init__(
        self,
        backend: MigBackend | None,
        inventory: Inventory,
        shared: frozenset[str] = frozenset(),
        binding: bool = False,
        overhead: Mapping[str, str] | None = None,
        list_attributes: bool = False,
        legacy_nvidia: bool = False,
        mig_layout: str = PLACEMENTS,
    ) -> None:
        """``shared``: UUIDs of the GPUs published as shared GPUs (sharing by memory);
        ``binding``: MIG placements carry binding conditions (dynamic MIG only);
        ``overhead``: node resource -> what each pod using a device costs the node;
        ``list_attributes``: whole GPUs carry list-type attributes (their MIG profiles);
        ``legacy_nvidia``: devices carry older NVIDIA DRA driver attributes (compat mode);
        ``mig_layout``: how dynamic MIG is published (placements or capacity)."""
        self.backend = backend
        self._binding = binding
        self._list_attributes = list_attributes
        self._legacy_nvidia = legacy_nvidia
        self._overhead = dict(overhead or {})
        self._inventory = inventory
        self._layout = mig_layout
        self.shared = shared
        self.catalog = build_catalog(
            inventory, dynamic=backend is not None, shared=shared, layout=mig_layout
        )
        self.fallback: Inventory | None = None  # set once dynamic MIG had to be given up
        self.given_up: set[str] = set()  # feature gates found off, each handled once

    @property
    def dynamic(self) -> bool:
        """Whether MIG placements with counters are being published."""
        return self.backend is not None and self.fallback is None

    @property
    def binding(self) -> bool:
        """Whether MIG placements are published with binding conditions."""
        return self._binding and self.dynamic and BINDING not in self.given_up

    @property
    def taints_supported(self) -> bool:
        """Whether unhealthy devices are published with taints (else withdrawn)."""
        return TAINTS not in self.given_up

    def pool(
        self,
        node_name: str,
        driver: str,
        taints: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    ) -> DesiredPool:
        """The pool to publish now."""
        return self.catalog.pool(
            node_name,
            driver,
            taints,
            withdraw_tainted=not self.taints_supported,
            bind_placements=self.binding,
            device_fields=None
            if NODE_ALLOCATABLE in self.given_up
            else overhead_fields(self._overhead),
            list_attributes=self._list_attributes and LIST_ATTRIBUTES not in self.given_up,
            legacy_nvidia=self._legacy_nvidia,
        )

    async def on_dropped(self, gates: Iterable[str]) -> dict[str, str]:
        """Handle the publisher's dropped-fields report: give up each newly missing feature.

        Returns feature gate -> what the node does without it, for the gates not handled
        before (empty: nothing changed, no need to republish). Logs one line per gate.
        """
        new = sorted(set(gates) - self.given_up)
        if not new:
            return {}
        self.given_up.update(new)
        # The placements need counters, the capacity layout multiple allocations.
        needs = CONSUMABLE if self._layout == CAPACITY else PARTITIONABLE
        if needs in new and self.backend is not None:
            self.fallback = await asyncio.to_thread(
                fallback_inventory, self._inventory, self.backend
            )
        if CONSUMABLE in new:
            self.shared = frozenset()
        if PARTITIONABLE in new or CONSUMABLE in new:
            self.catalog = build_catalog(
                self.fallback or self._inventory,
                dynamic=self.dynamic,
                shared=self.shared,
                layout=self._layout,
            )
        out = {gate: WITHOUT.get(gate, OTHER_FIELDS) for gate in new}
        if needs in out and self.backend is not None and needs == CONSUMABLE:
            out[CONSUMABLE] = f"{WITHOUT[PARTITIONABLE]}; {WITHOUT[CONSUMABLE]}"
        for gate, consequence in out.items():
            log.warning(
                f"the API server does not support {gate}; {consequence}",
                feature_gate=gate,
            )
        return out
