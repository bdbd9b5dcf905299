"""Explicit removal of a node's slices (``dra-driver cleanup``)."""

from __future__ import annotations

import structlog

from dra_driver.kube import KubeClient
from dra_driver.resourceslice.rawapi import RawApi
from dra_driver.resourceslice.store import field_selector, meta

log = structlog.get_logger(__name__)


async def delete_pool_slices(api: KubeClient | RawApi, node_name: str, driver: str) -> int:
    """Delete every ResourceSlice of ``driver`` on ``node_name``; return how many were deleted.

    For explicit cleanup (``dra-driver cleanup --node-name N``); a stopping controller never
    deletes its slices, so a restart does not make the node's devices vanish from the scheduler.
    """
    raw = RawApi(api)
    listing = await raw.list_slices(field_selector(node_name, driver))
    deleted = 0
    for obj in listing.get("items") or []:
        spec = obj.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != node_name:
            continue
        m = meta(obj)
        if await raw.delete_slice(str(m.get("name")), m.get("uid")):
            deleted += 1
            log.info("deleted slice", node=node_name, driver=driver, slice=m.get("name"))
    return deleted
