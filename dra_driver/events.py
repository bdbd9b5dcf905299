"""Kubernetes Events, so problems show up in ``kubectl describe`` and not only in logs."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import structlog

from dra_driver import resourceapi
from dra_driver.kube import KubeClient

log = structlog.get_logger(__name__)


#: An Event's name is a DNS subdomain: at most 253 characters.
_MAX_NAME = 253


def event_name(name: str) -> str:
    """A fresh Event name for an object named ``name``: the name, shortened when needed so a
    long one (up to 253 characters) still leaves room for the unique suffix."""
    suffix = uuid.uuid4().hex[:12]
    prefix = name[: _MAX_NAME - len(suffix) - 1].rstrip(".-")
    return f"{prefix}.{suffix}"


async def post_event(
    client: KubeClient,
    *,
    kind: str,
    name: str,
    reason: str,
    message: str,
    namespace: str = "",
    uid: str = "",
    event_type: str = "Warning",
    component: str = "dra-driver",
    api_version: str = "",
) -> bool:
    """Create a core/v1 Event about an object (of ``api_version``; by default a Node's or
    the resource API's); failures are logged, never raised."""
    now = resourceapi.api_time()
    if kind == "Node" and not uid:
        # `kubectl describe node` finds a Node's Events by involvedObject.uid, the node's
        # name by the kubelet's convention: one without a uid is never shown there.
        uid = name
    event_ns = namespace or "default"  # events about cluster-scoped objects live in default
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(name), "namespace": event_ns},
        "involvedObject": {
            "apiVersion": api_version or ("v1" if kind == "Node" else resourceapi.API_VERSION),
            "kind": kind,
            "name": name,
            **({"namespace": namespace} if namespace else {}),
            **({"uid": uid} if uid else {}),
        },
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        response = await client.request(
            "POST", f"/api/v1/namespaces/{quote(event_ns, safe='')}/events", body=body
        )
        ok = response.ok
    except Exception as exc:  # an event is best effort: never let it break the caller
        log.warning("posting event failed", reason=reason, object=f"{kind}/{name}", error=str(exc))
        return False
    if not ok:
        log.warning(
            "posting event refused", reason=reason, object=f"{kind}/{name}", status=response.status
        )
    return ok
