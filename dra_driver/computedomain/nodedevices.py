"""The node's IMEX devices, as published in its pool (pure).

Each node with the compute domain plugin publishes two devices under the IMEX driver name:

- ``channel-0`` (``type: channel``): an IMEX channel for one workload pod of a domain. The
  channel a container gets is the domain's (the controller gives each domain its own and
  writes it into the claim's config), so one device per node is enough; like the NVIDIA
  driver, a node serves one workload claim of one domain at a time.
- ``daemon-0`` (``type: daemon``): the node's IMEX daemon; a node runs the daemon of one
  domain at a time, which this single device enforces through the scheduler.

With binding conditions, a pod whose channel is allocated is bound only once the domain's
daemon on the node is ready (``IMEXDaemonReady``), and sent elsewhere when it cannot
become ready (``IMEXDaemonFailed``).
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

CHANNEL = "channel"
DAEMON = "daemon"
CHANNEL_DEVICE = f"{CHANNEL}-0"
DAEMON_DEVICE = f"{DAEMON}-0"
DAEMON_READY = "IMEXDaemonReady"
DAEMON_FAILED = "IMEXDaemonFailed"


def _device(name: str, kind: str, driver: str, clique: str | None) -> JSON:
    attributes: JSON = {"type": {"string": kind}, "id": {"int": 0}}
    if clique:
        attributes["cliqueId"] = {"string": clique}
    return {"name": name, "attributes": attributes}


def imex_devices(driver: str, clique: str | None, *, binding: bool) -> list[JSON]:
    """The node's channel and daemon devices (``clique``: its NVLink clique, if any)."""
    channel = _device(CHANNEL_DEVICE, CHANNEL, driver, clique)
    if binding:
        channel["bindingConditions"] = [DAEMON_READY]
        channel["bindingFailureConditions"] = [DAEMON_FAILED]
    return [channel, _device(DAEMON_DEVICE, DAEMON, driver, clique)]
