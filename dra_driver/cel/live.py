"""Read DeviceClasses, ResourceSlices and ResourceClaims from a cluster as plain JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dra_driver import resourceapi
from dra_driver.errors import DriverError
from dra_driver.kube import KubeClient

JSON = dict[str, Any]


class LiveError(DriverError):
    """The API server answered with an error (the message says which request)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        #: The HTTP status of the answer (404: not found); 0 when there was none.
        self.status = status


async def get_json(
    client: KubeClient, path: str, query: list[tuple[str, str]] | None = None
) -> JSON:
    """GET ``path`` and decode the JSON body; :class:`LiveError` on a non-2xx answer."""
    response = await client.request("GET", path, query=query)
    if not response.ok:
        try:
            message = json.loads(response.body).get("message", "")
        except (ValueError, AttributeError):
            message = response.body.decode("utf-8", "replace")[:300]
        raise LiveError(f"GET {path}: {response.status} {message}", response.status)
    data = response.json()
    return data if isinstance(data, dict) else {}


async def list_all(client: KubeClient, path: str, kind: str) -> list[JSON]:
    """Every object of a collection (following ``continue`` tokens), each with ``kind`` set."""
    items: list[JSON] = []
    token = ""
    while True:
        query = [("limit", "500")] + ([("continue", token)] if token else [])
        page = await get_json(client, path, query)
        items += [{"kind": kind, **item} for item in page.get("items") or []]
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def split_key(key: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name); a bare name is in ``default``."""
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else ("default", key)


async def get_class(client: KubeClient, name: str) -> JSON:
    """One DeviceClass."""
    try:
        obj = await get_json(client, resourceapi.path(resourceapi.DEVICE_CLASSES, name))
    except LiveError as exc:
        if exc.status == 404:
            raise LiveError(f'DeviceClass "{name}" not found', 404) from None
        raise
    return {"kind": "DeviceClass", **obj}


async def get_claim(client: KubeClient, key: str) -> JSON:
    """A ResourceClaim by ``namespace/name``, or else a ResourceClaimTemplate of that name."""
    namespace, name = split_key(key)
    try:
        obj = await get_json(
            client, resourceapi.path(resourceapi.RESOURCE_CLAIMS, name, namespace=namespace)
        )
        return {"kind": "ResourceClaim", **obj}
    except LiveError as claim_error:
        try:
            obj = await get_json(
                client,
                resourceapi.path(resourceapi.RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace),
            )
        except LiveError:
            if claim_error.status == 404:
                raise LiveError(
                    f'ResourceClaim "{name}" not found in namespace "{namespace}" '
                    "(nor a ResourceClaimTemplate of that name)",
                    404,
                ) from None
            raise claim_error from None
        return {"kind": "ResourceClaimTemplate", **obj}


@dataclass
class ClusterState:
    """What explain-claim needs from the cluster."""

    classes: list[JSON] = field(default_factory=list)
    slices: list[JSON] = field(default_factory=list)
    claims: list[JSON] = field(default_factory=list)


async def cluster_state(client: KubeClient) -> ClusterState:
    """All DeviceClasses, ResourceSlices and ResourceClaims."""
    return ClusterState(
        classes=await list_all(client, resourceapi.path(resourceapi.DEVICE_CLASSES), "DeviceClass"),
        slices=await list_all(
            client, resourceapi.path(resourceapi.RESOURCE_SLICES), "ResourceSlice"
        ),
        claims=await list_all(
            client, resourceapi.path(resourceapi.RESOURCE_CLAIMS), "ResourceClaim"
        ),
    )
