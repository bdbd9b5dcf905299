"""Which MIG profiles dynamic MIG publishes placements for (``--mig-profiles``).

Every placement is a device the scheduler looks at for every claim it allocates on the node:
an H100 has 25 of them. A cluster whose workloads ask for a few profiles can publish only
those; the allocations those workloads get are the same, and the scheduler has fewer devices
to go through (docs/performance.md, "The cluster at scale").
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import TYPE_CHECKING

import structlog

from dra_driver.errors import StartError

if TYPE_CHECKING:
    # Only a type here: start-up checks --mig-profiles before it loads the inventory's models.
    from dra_driver.gpu.inventory import Inventory

log = structlog.get_logger(__name__)

# NVML's GPU instance profile names: slices and memory, then options such as +me, -me,
# +me.all or +gfx (newer drivers and GPUs add such variants of each profile).
_PROFILE = re.compile(r"^\d+g\.\d+gb([+-][a-z0-9]+(\.[a-z0-9]+)*)*$")


class ProfileListError(StartError, ValueError):
    """The profile list is not a comma-separated list of MIG profile names."""


def parse_profiles(text: str) -> frozenset[str]:
    """The profile names of a ``--mig-profiles`` value; empty means every profile."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    bad = [n for n in names if not _PROFILE.match(n)]
    if bad:
        raise ProfileListError(
            f"--mig-profiles: {', '.join(bad)} is not a MIG profile name "
            "(like 1g.10gb, 3g.40gb or 1g.10gb+me)"
        )
    return frozenset(names)


def restrict_profiles(inventory: Inventory, names: Collection[str]) -> Inventory:
    """``inventory`` with each GPU's MIG profiles cut down to ``names`` (all when empty).

    Each MIG-capable GPU keeps the slice totals of its full profile list
    (:func:`~dra_driver.gpu.publish.mig_capacity.totals`): the chosen profiles need not span
    the GPU, and by MIG capacity a GPU is published with, and prepared against, all its slices.
    It keeps the profile spanning it too, whose engines bound every layout.

    Names no GPU of the node supports are logged, not refused: one DaemonSet setting serves
    nodes with different GPU models (an A100's 1g.5gb is an H100's 1g.10gb).
    """
    # Here, not at the top: start-up checks --mig-profiles before it loads the models.
    from dra_driver.gpu.publish.mig_capacity import totals
    from dra_driver.gpu.publish.partitions import full_profile

    if not names:
        return inventory
    supported = {p.name for gpu in inventory.gpus for p in gpu.mig_profiles}
    unknown = sorted(set(names) - supported)
    if unknown and supported:
        log.info("MIG profiles no GPU of this node supports", profiles=unknown)
    gpus = []
    for gpu in inventory.gpus:
        update: dict[str, object] = {
            "mig_profiles": tuple(p for p in gpu.mig_profiles if p.name in names)
        }
        if gpu.mig_profiles:
            whole = totals(gpu)
            update |= {
                "mig_compute_slices": whole.compute,
                "mig_memory_slices": whole.memory,
                "mig_full_profile": full_profile(gpu),
            }
        gpus.append(gpu.model_copy(update=update))
    return inventory.model_copy(update={"gpus": tuple(gpus)})


def published_inventory(inventory: Inventory, dynamic: bool, profiles: str) -> Inventory:
    """The inventory a catalogue is built from: with dynamic MIG, only the MIG profiles
    ``profiles`` (a ``--mig-profiles`` value) names; without it, ``inventory`` unchanged."""
    return restrict_profiles(inventory, parse_profiles(profiles)) if dynamic else inventory
