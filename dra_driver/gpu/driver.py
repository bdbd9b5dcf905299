"""The GPU driver as the kubelet plugin sees it: an async face on the blocking node state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.gpu.state import DeviceState
from dra_driver.kubeletplugin import run_blocking
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PrepareResult,
    UnprepareResult,
)


class GpuDriver:
    """Implements the kubelet plugin's ``Driver`` protocol over a :class:`DeviceState`.

    Prepare and unprepare fsync files, so they run in a worker thread, never on the loop; a
    cancelled call still waits for its thread, so the node lock is never released early.
    """

    def __init__(self, state: DeviceState) -> None:
        self.state = state

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """Prepare a batch of claims."""
        return await run_blocking(self.state.prepare, claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Unprepare a batch of claims."""
        return await run_blocking(self.state.unprepare, claims)
