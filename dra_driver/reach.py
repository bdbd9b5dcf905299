"""Reaching the API server at start-up: the agent changes nothing on the node before it has."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import aiohttp
import structlog

from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import KubeConfigError

log = structlog.get_logger(__name__)

#: How long a starting agent keeps trying to reach the API server before it gives up.
API_WAIT = 60.0
API_REQUEST_TIMEOUT = 10.0


class ApiUnreachableError(KubeConfigError):
    """The configured API server cannot be used (unreachable, or it refuses the credentials);
    a kind of unusable kubeconfig, reported as one line like the others."""


async def reach_api_server(client: KubeClient, node: str, wait: float = API_WAIT) -> None:
    """Read this node's Node object: proves the server is reachable and the credentials work.

    Connection failures are retried for ``wait`` seconds (the API server may be starting
    too); a refusal of the credentials ends the start at once. A missing Node is only
    logged: the agent can serve the kubelet without it.
    """
    path = f"/api/v1/nodes/{quote(node, safe='')}"
    deadline = asyncio.get_running_loop().time() + wait
    delay = 0.5
    while True:
        try:
            response = await client.request("GET", path, timeout=API_REQUEST_TIMEOUT)
            break
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            left = deadline - asyncio.get_running_loop().time()
            reason = str(exc) or type(exc).__name__
            if left <= 0:
                raise ApiUnreachableError(
                    f"cannot reach the API server at {client.server}: {reason}"
                ) from None
            log.warning("API server not reachable yet", server=client.server, error=reason)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 8.0)
    if response.status == 401:
        raise ApiUnreachableError(
            f"the API server at {client.server} refused the credentials (HTTP 401)"
        )
    if response.status == 404:
        log.warning("this node has no Node object", node=node)
    elif response.status != 200:
        log.warning("cannot read this node's Node object", node=node, status=response.status)
