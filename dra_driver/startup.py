"""What the node agent checks before it changes anything on the node.

A wrong setting or a missing kubeconfig must end the agent before it destroys a MIG device,
writes the checkpoint or creates a directory: a crash-looping pod would otherwise repeat those
changes on every restart. These checks only read.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import quote

import aiohttp
import structlog

from dra_driver.gpu.publish.overhead import OverheadError, parse_overhead
from dra_driver.gpu.publish.profiles import ProfileListError, parse_profiles
from dra_driver.gpu.sharing.shared_gpus import SelectionError, parse_selection
from dra_driver.gpu.state.device_state import CHECKPOINT_FILE
from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import KubeConfigError
from dra_driver.settings import Settings, SettingsError, flag_name

log = structlog.get_logger(__name__)

#: How long a starting agent keeps trying to reach the API server before it gives up.
API_WAIT = 60.0
API_REQUEST_TIMEOUT = 10.0


class ApiUnreachableError(KubeConfigError):
    """The configured API server cannot be used (unreachable, or it refuses the credentials);
    a kind of unusable kubeconfig, reported as one line like the others."""


def state_dir(settings: Settings) -> Path:
    """Where the node's checkpoint and the driver's own files live."""
    return settings.plugins_dir / settings.driver_name


def check_settings(settings: Settings) -> None:
    """Check what the settings model cannot: the node name and the directories (read only)."""
    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")
    for field in ("cdi_root", "plugins_dir", "registry_dir"):
        _check_directory(getattr(settings, field), flag_name(field))
    try:
        parse_selection(settings.shared_gpus)
        parse_profiles(settings.mig_profiles)
        parse_overhead(settings.node_overhead)
    except (SelectionError, ProfileListError, OverheadError) as exc:
        raise SettingsError(str(exc)) from None
    checkpoint = state_dir(settings) / CHECKPOINT_FILE
    if checkpoint.is_dir():
        raise SettingsError(f"checkpoint {checkpoint} is a directory; move it away")


def _check_directory(path: Path, flag: str) -> None:
    """The directory exists, or can be created: its nearest existing ancestor is a directory."""
    if not path.is_absolute():
        raise SettingsError(f"{flag}: {path} is not an absolute path")
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():
            raise SettingsError(f"{flag}: {existing} is a dangling symlink")
        existing = existing.parent
    if not existing.is_dir():
        raise SettingsError(f"{flag}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SettingsError(f"{flag}: {existing} is not writable")


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
