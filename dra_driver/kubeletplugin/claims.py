"""Fetching ResourceClaims for NodePrepareResources and picking out this driver's part.

The kubelet sends only namespace, name and UID; the allocation lives in the claim's status, so
each prepare reads the claim from the API server. Claims are handled as raw JSON dicts: the
driver needs a few fields, not a fully converted client model.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from dra_driver import resourceapi
from dra_driver.errors import PrepareError
from dra_driver.kubeletplugin.interfaces import JSON, ClaimRef, ClaimToPrepare

if TYPE_CHECKING:
    # Only a type here: the plugin binds its sockets before the agent loads the HTTP client.
    from dra_driver.kube import KubeClient

#: A claim read takes well under a second; the kubelet's own deadline (45 s) bounds the rest.
DEFAULT_FETCH_TIMEOUT = 10.0
#: Claims per page when listing them all.
LIST_PAGE = 500


class ClaimFetcher(Protocol):
    """Reads ResourceClaims by namespace and name."""

    async def get_claim(self, namespace: str, name: str) -> JSON | None:
        """Return the claim as ``resource.k8s.io/v1`` JSON, or ``None`` when it does not exist.

        Any other failure raises; the message becomes the claim's error.
        """
        ...


class KubeClaimFetcher:
    """A ``ClaimFetcher`` that reads claims from the API server."""

    def __init__(self, client: KubeClient, timeout: float = DEFAULT_FETCH_TIMEOUT) -> None:
        """``client`` is owned by the caller."""
        self._client = client
        self._timeout = timeout

    async def get_claim(self, namespace: str, name: str) -> JSON | None:
        """Read one claim as it is stored (no conversion, so unknown fields survive)."""
        response = await self._client.request(
            "GET",
            resourceapi.path(resourceapi.RESOURCE_CLAIMS, name, namespace=namespace),
            timeout=self._timeout,
        )
        if response.status == 404:
            return None
        if response.status != 200:
            raise PrepareError(
                f"reading ResourceClaim {namespace}/{name}: HTTP {response.status}: "
                f"{_api_message(response.body)}"
            )
        try:
            # Not Response.json(): that reads any depth, and a claim to prepare nested
            # deeper than Python's own limit is no driver config; it fails here, clearly.
            claim = json.loads(response.body)
        except RecursionError:
            # The API server accepts objects nested thousands deep in opaque parameters.
            raise PrepareError(
                f"ResourceClaim {namespace}/{name} is nested too deeply to read: its opaque "
                "parameters must be a driver config a few levels deep"
            ) from None
        if not isinstance(claim, dict):
            raise PrepareError(f"reading ResourceClaim {namespace}/{name}: unexpected response")
        return claim

    async def list_claims(self, page: int = LIST_PAGE) -> list[JSON]:
        """Every ResourceClaim of the cluster, read in pages (start-up's evidence of what is
        in use on the node). Raises on any failure: a partial list proves nothing."""
        claims: list[JSON] = []
        token = ""
        while True:
            query = {"limit": str(page)} | ({"continue": token} if token else {})
            response = await self._client.request(
                "GET",
                resourceapi.path(resourceapi.RESOURCE_CLAIMS),
                query=query,
                timeout=self._timeout,
            )
            if response.status != 200:
                raise PrepareError(
                    f"listing ResourceClaims: HTTP {response.status}: {_api_message(response.body)}"
                )
            body = response.json()
            items = body.get("items") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise PrepareError("listing ResourceClaims: unexpected response")
            claims += [c for c in items if isinstance(c, dict)]
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                return claims


def _api_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, or the body itself."""
    try:
        status = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:200]
    message = status.get("message") if isinstance(status, dict) else None
    if isinstance(message, str):
        return message
    return body.decode(errors="replace")[:200]


def claim_to_prepare(
    ref: ClaimRef, claim: JSON | None, driver_name: str, pool_name: str | None
) -> ClaimToPrepare:
    """Check a fetched claim against the kubelet's reference and select this driver's part.

    ``pool_name`` ``None`` accepts results from every pool of the driver. Raises
    ``PrepareError`` when the claim is gone, was replaced, is not allocated, or allocates
    nothing from this driver and pool.
    """
    if claim is None:
        raise PrepareError(f"ResourceClaim {ref} not found")
    uid = _field(ref, claim, "metadata").get("uid")
    if uid != ref.uid:
        # Same name, different object: the claim the kubelet means was deleted.
        raise PrepareError(
            f"ResourceClaim {ref} has UID {uid}, expected {ref.uid}: it was replaced"
        )
    allocation = _field(ref, _field(ref, claim, "status"), "allocation", "status.")
    if not allocation:
        raise PrepareError(f"ResourceClaim {ref} is not allocated")
    devices = _field(ref, allocation, "devices", "status.allocation.")
    results = tuple(
        r
        for r in _items(ref, devices, "results")
        if r.get("driver") == driver_name and (pool_name is None or r.get("pool") == pool_name)
    )
    if not results:
        where = f"driver {driver_name}" + (f" in pool {pool_name}" if pool_name else "")
        raise PrepareError(f"ResourceClaim {ref} has no devices allocated by {where}")
    config = tuple(
        c
        for c in _items(ref, devices, "config")
        if isinstance(c.get("opaque"), dict) and c["opaque"].get("driver") == driver_name
    )
    return ClaimToPrepare(ref=ref, claim=claim, results=results, config=config)


def _field(ref: ClaimRef, parent: JSON, name: str, path: str = "") -> JSON:
    """``parent[name]`` as an object (missing or null: empty); anything else is a PrepareError
    that says where, instead of an AttributeError deep in the driver."""
    value = parent.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PrepareError(
            f"ResourceClaim {ref}: {path}{name} is {type(value).__name__}, expected an object"
        )
    return value


def _items(ref: ClaimRef, devices: JSON, name: str) -> list[JSON]:
    """``status.allocation.devices.<name>`` as a list of objects (missing or null: empty)."""
    value = devices.get(name) or []
    where = f"ResourceClaim {ref}: status.allocation.devices.{name}"
    if not isinstance(value, list):
        raise PrepareError(f"{where} is {type(value).__name__}, expected a list")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise PrepareError(f"{where}[{index}] is {type(item).__name__}, expected an object")
    return value
