"""A device as allocated to a claim: what backs it, its config, and its share of a shared GPU.

The planner (:mod:`dra_driver.gpu.state.planner`) resolves allocation results into these;
sharing strategies and the CDI spec read them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dra_driver.gpu.config import DeviceConfig
from dra_driver.gpu.inventory import Gpu, MigDevice


@dataclass(frozen=True)
class Share:
    """One claim's share of a shared GPU."""

    share_id: str
    memory_bytes: int
    compute_percent: int | None = None  # None or 0: no compute limit

    @property
    def thread_percentage(self) -> int | None:
        """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for the share's clients, if limited."""
        return self.compute_percent or None


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocated device of a claim, resolved against the inventory."""

    requests: tuple[str, ...]
    device_name: str
    gpu: Gpu
    mig: MigDevice | None = None
    config: DeviceConfig | None = None
    share: Share | None = None  # a share of a shared GPU (several claims on one GPU)
    # Dynamic MIG by capacity: the allocation's share of the GPU's MIG slices (its shareID).
    slices_share: str | None = None

    @property
    def share_id(self) -> str | None:
        """The allocation's shareID when it is one of several of its device (its CDI
        device is named after it)."""
        return self.share.share_id if self.share else self.slices_share

    @property
    def uuid(self) -> str:
        """The UUID CUDA sees: the MIG device's, or the GPU's."""
        return self.mig.uuid if self.mig else self.gpu.uuid

    @property
    def type(self) -> str:
        """``gpu`` or ``mig``."""
        return "mig" if self.mig else "gpu"

    @property
    def strategy(self) -> str | None:
        """The sharing strategy the device's config asks for (``TimeSlicing``, ``MPS``)."""
        sharing = self.config.sharing if self.config else None
        return sharing.strategy if sharing else None


def with_share(device: AllocatedDevice, share: Share | None) -> AllocatedDevice:
    """``device`` as a share of its GPU."""
    return dataclasses.replace(device, share=share)
