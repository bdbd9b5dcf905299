"""The node's domain label as both sides remove it: only while it still names the domain."""

from __future__ import annotations

from urllib.parse import quote

from dra_driver.kube import KubeClient
from dra_driver.resourceslice.rawapi import raise_for_status


def node_path(node: str) -> str:
    """The API path of Node ``node``."""
    return f"/api/v1/nodes/{quote(node, safe='')}"


async def remove_domain_label(client: KubeClient, label: str, node: str, uid: str) -> None:
    """Remove ``label`` from ``node`` if it still names domain ``uid``.

    A JSON patch test guards the removal: the other side may have given the node to another
    domain meanwhile. A node that is gone, or whose label names another domain, is left as
    it is; any other refusal raises :class:`ApiError`.
    """
    pointer = "/metadata/labels/" + label.replace("~", "~0").replace("/", "~1")
    patch = [{"op": "test", "path": pointer, "value": uid}, {"op": "remove", "path": pointer}]
    response = await client.request(
        "PATCH", node_path(node), body=patch, content_type="application/json-patch+json"
    )
    if response.status not in (404, 422):  # gone, or the test failed: not this domain's
        raise_for_status(response, verb="patch", resource="nodes", name=node)
