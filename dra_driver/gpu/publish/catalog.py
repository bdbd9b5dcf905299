"""The device catalogue: every device the node publishes, and what backs each one.

Built once per inventory and mode (dynamic MIG on or off, which GPUs are shared GPUs), it is
the one answer to "what is published and what can be prepared": the agent publishes
:meth:`Catalog.pool`, ``dra-driver slices`` prints it, ``match --profile`` matches against
:meth:`Catalog.published`, and prepare looks every allocated device up with :meth:`Catalog.get`.

With dynamic MIG a catalogue also knows devices it does not publish (``Entry.device is None``):
the MIG devices that existed when the agent started, so that a claim prepared for one of them
before dynamic MIG was turned on is still understood at restart and unprepare.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice
from dra_driver.gpu.publish.devices import (
    DEFAULT_DRIVER_NAME,
    devices_for_gpu,
    gpu_device,
    gpu_device_name,
    legacy_nvidia_attributes,
)
from dra_driver.gpu.publish.devices import list_attributes as gpu_lists
from dra_driver.gpu.publish.mig_capacity import capacity_device
from dra_driver.gpu.publish.partitions import PlacementSpec, dynamic_layout, placements
from dra_driver.gpu.sharing.shared_gpus import shared_device
from dra_driver.resourceslice.pool import DesiredPool, contents_for

JSON = dict[str, Any]

#: The binding conditions of a MIG placement (dynamic MIG with binding conditions): the
#: scheduler binds the pod once the node agent created the MIG device and set the first True
#: in the claim's device status, and schedules it again when the agent sets the second.
MIG_READY = "MIGDeviceReady"
MIG_FAILED = "MIGDeviceFailed"
BINDING_FIELDS: JSON = {"bindingConditions": [MIG_READY], "bindingFailureConditions": [MIG_FAILED]}


@dataclass(frozen=True)
class Entry:
    """One device of the catalogue and what backs it."""

    gpu: Gpu
    device: JSON | None  # the published device; None: known but not published
    mig: MigDevice | None = None  # a MIG device that exists
    placement: PlacementSpec | None = None  # dynamic MIG: the MIG device prepare creates
    shared: bool = False  # a shared GPU: several claims each hold a share of it
    partitioned: bool = False  # dynamic MIG by capacity: claims share it by MIG slices

    @property
    def kind(self) -> str:
        """``mig`` for MIG devices (existing or to be created), ``gpu`` for whole GPUs."""
        return "mig" if self.mig is not None or self.placement is not None else "gpu"


@dataclass(frozen=True)
class Catalog:
    """The node's devices by name, and how the published ones are packed into slices."""

    entries: Mapping[str, Entry]
    counter_sets: tuple[JSON, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()  # device names published together, per GPU
    plain: tuple[str, ...] = ()  # the other published devices, in inventory order

    def get(self, name: str) -> Entry | None:
        """The entry for a device name, published or only known."""
        return self.entries.get(name)

    def published(self) -> list[JSON]:
        """Every published device (without taints), plain devices first, then the groups."""
        return [self._device(n) for n in (*self.plain, *(n for g in self.groups for n in g))]

    def placements(self) -> Iterator[PlacementSpec]:
        """The dynamic MIG placements the catalogue knows."""
        return (e.placement for e in self.entries.values() if e.placement is not None)

    def pool(
        self,
        node_name: str,
        driver: str = DEFAULT_DRIVER_NAME,
        taints: Mapping[str, Sequence[JSON]] | None = None,
        *,
        withdraw_tainted: bool = False,
        bind_placements: bool = False,
        device_fields: JSON | None = None,
        list_attributes: bool = False,
        legacy_nvidia: bool = False,
    ) -> DesiredPool:
        """The pool to publish: pool name = node name, slices packed by API limits.

        ``taints`` (device name -> device taints) marks unhealthy devices. A placement
        (or MIG device) without taints of its own carries those of its whole GPU: they
        share its health.
        ``withdraw_tainted``: leave the devices that would carry taints out instead, for an
        API server without device taints (nothing else keeps the scheduler off them).
        ``bind_placements``: MIG placements (and GPUs published by MIG capacity) carry binding
        conditions (:data:`BINDING_FIELDS`), so their MIG devices are made before the pod is
        bound. ``device_fields`` are added to
        every device (e.g. the node overhead it costs). ``list_attributes``: whole GPUs carry
        their list-type attributes (:func:`~dra_driver.gpu.publish.devices.list_attributes`).
        ``legacy_nvidia``: devices also carry the attributes older NVIDIA DRA driver releases
        published (:func:`~dra_driver.gpu.publish.devices.legacy_nvidia_attributes`).
        """
        taints = taints or {}

        def own_taints(name: str, inherit: bool) -> list[JSON]:
            own = list(taints.get(name, ()))
            if not own and inherit:
                own = list(taints.get(gpu_device_name(self.entries[name].gpu), ()))
            return own

        def tainted(names: Sequence[str], inherit: bool) -> list[JSON]:
            out = []
            for name in names:
                device, own = self._device(name), own_taints(name, inherit)
                if own and withdraw_tainted:
                    continue
                entry = self.entries[name]
                if bind_placements and (entry.placement is not None or entry.partitioned):
                    device = {**device, **BINDING_FIELDS}
                if list_attributes and entry.kind == "gpu" and (lists := gpu_lists(entry.gpu)):
                    device = {**device, "attributes": {**device["attributes"], **lists}}
                if legacy_nvidia:
                    legacy = legacy_nvidia_attributes(entry.gpu, entry.kind == "gpu")
                    device = {**device, "attributes": {**device["attributes"], **legacy}}
                if device_fields:
                    device = {**device, **device_fields}
                out.append({**device, "taints": own} if own else device)
            return out

        return DesiredPool(
            driver=driver,
            pool_name=node_name,
            node_name=node_name,
            slices=contents_for(
                # Plain MIG devices inherit too: ones made after the tracker was built
                # (dynamic MIG given up since) are unknown to it, their GPU's name is not.
                tainted(self.plain, True),
                self.counter_sets,
                [tainted(group, True) for group in self.groups],
            ),
        )

    def _device(self, name: str) -> JSON:
        device = self.entries[name].device
        assert device is not None, f"{name} is not published"
        return device


def _published(gpu: Gpu, device: JSON, shared: Collection[str]) -> tuple[JSON, bool]:
    is_shared = gpu.uuid in shared and device["name"] == gpu_device_name(gpu)
    return (shared_device(device) if is_shared else device), is_shared


def _static_entries(inventory: Inventory, shared: Collection[str]) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for gpu in inventory.gpus:
        migs: Sequence[MigDevice | None] = gpu.mig_devices if gpu.mig_enabled else [None]
        for device, mig in zip(devices_for_gpu(gpu, inventory), migs, strict=True):
            published, is_shared = _published(gpu, device, shared)
            entries[device["name"]] = Entry(gpu, published, mig=mig, shared=is_shared)
    return entries


#: ``--mig-layout`` values: how dynamic MIG is published.
PLACEMENTS = "placements"  # every placement a device, with shared counters (partitions.py)
CAPACITY = "capacity"  # one device per GPU, shared by MIG slices (mig_capacity.py)
MIG_LAYOUTS = (PLACEMENTS, CAPACITY)


def build_catalog(
    inventory: Inventory,
    *,
    dynamic: bool = False,
    shared: Collection[str] = (),
    layout: str = PLACEMENTS,
) -> Catalog:
    """The catalogue of ``inventory``.

    ``dynamic``: MIG devices are made on demand (dynamic MIG), published as ``layout`` says:
    every placement of MIG-capable GPUs, with counters, or each such GPU by its MIG slices;
    ``shared``: UUIDs of the GPUs published as shared GPUs (see
    :mod:`dra_driver.gpu.sharing.shared_gpus`).
    """
    entries = _static_entries(inventory, shared)
    if not dynamic:
        return Catalog(entries, plain=tuple(entries))
    # Existing MIG devices stay known but are not published; whole GPUs and placements are.
    entries = {n: Entry(e.gpu, None, mig=e.mig) if e.mig else e for n, e in entries.items()}
    for gpu in inventory.gpus:
        if gpu.mig.capable:
            entries[gpu_device_name(gpu)] = Entry(gpu, None)
            entries.update((s.device_name, Entry(gpu, None, placement=s)) for s in placements(gpu))
    if layout == CAPACITY:
        return _capacity_catalog(inventory, entries, shared)
    placed = dynamic_layout(inventory, shared=shared)
    plain: list[str] = []
    for device in placed.devices:
        entry = entries[device["name"]]
        published, is_shared = _published(entry.gpu, device, shared)
        entries[device["name"]] = Entry(entry.gpu, published, shared=is_shared)
        plain.append(device["name"])
    groups: list[tuple[str, ...]] = []
    for group in placed.groups:
        for device in group:
            entry = entries[device["name"]]
            entries[device["name"]] = Entry(entry.gpu, device, placement=entry.placement)
        groups.append(tuple(d["name"] for d in group))
    return Catalog(entries, placed.counter_sets, tuple(groups), tuple(plain))


def _capacity_catalog(
    inventory: Inventory, entries: dict[str, Entry], shared: Collection[str]
) -> Catalog:
    """Dynamic MIG by capacity: MIG-capable GPUs published as their MIG slices; placements
    stay known (unpublished), so MIG devices made for claims are recognised at restart."""
    plain: list[str] = []
    for gpu in inventory.gpus:
        name = gpu_device_name(gpu)
        device = gpu_device(gpu, inventory)
        if gpu.mig.capable and gpu.mig_profiles and gpu.uuid not in shared:
            entries[name] = Entry(gpu, capacity_device(device, gpu), partitioned=True)
        else:
            published, is_shared = _published(gpu, device, shared)
            entries[name] = Entry(gpu, published, shared=is_shared)
        plain.append(name)
    return Catalog(entries, plain=tuple(plain))


def simulated_devices(profile: str, node_name: str) -> list[JSON]:
    """The devices a simulated node with ``profile`` publishes (no dynamic MIG, no sharing)."""
    # Here, not at the top: the agent on a real node loads no simulated profiles.
    from dra_driver.gpu.discovery.simulated import SimulatedDiscovery

    return build_catalog(SimulatedDiscovery(profile, node_name).discover()).published()
