"""The objects the controller makes for a domain, as pure functions of the domain.

- the workload's channel ResourceClaimTemplate, in the domain's namespace under the name the
  user gave (``spec.channel.resourceClaimTemplate.name``): one request for the node's IMEX
  channel device, with the domain's UID, channel and allocation mode as opaque config;
- the daemons' claim template and DaemonSet in the driver's namespace: one IMEX daemon pod
  on each node labelled into the domain, holding the node's IMEX daemon device.

Each body carries the digest of its own content, so the controller writes an object only
when what it should be has changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dra_driver import resourceapi
from dra_driver.computedomain.api import (
    CHANNEL_CONFIG_KIND,
    CONFIG_API_VERSION,
    DAEMON_CONFIG_KIND,
    MAX_CHANNELS,
    ApiNames,
    Domain,
)

JSON = dict[str, Any]

#: The annotation holding a made object's digest.
DIGEST_ANNOTATION = "gpu.dra.dev/digest"
#: The IMEX daemon's server port (the real daemon's default).
IMEX_PORT = 50000


@dataclass(frozen=True)
class DaemonSettings:
    """How the controller runs the IMEX daemons: where, with which image and driver root."""

    namespace: str
    image: str
    service_account: str = "dra-driver-imex-daemon"
    driver_root: str = "/"
    pull_policy: str = "IfNotPresent"
    #: Secrets (in ``namespace``) for pulling ``image`` from a private registry.
    pull_secrets: tuple[str, ...] = ()
    log_format: str = "json"
    compat: str = ""


def _pull_secrets(settings: DaemonSettings) -> JSON:
    # Absent when there are none, so the daemons of a release without any keep their digest.
    if not settings.pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": name} for name in settings.pull_secrets]}


def daemon_name(domain: Domain) -> str:
    """The name of a domain's DaemonSet and daemon claim template (unique per domain)."""
    return f"imex-{domain.uid}"


def _with_digest(body: JSON) -> JSON:
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    meta = body["metadata"]
    meta["annotations"] = {**meta.get("annotations", {}), DIGEST_ANNOTATION: digest}
    return body


def digest_of(obj: JSON | None) -> str:
    """The digest a made object carries ("" when none)."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(DIGEST_ANNOTATION, ""))


def channel_of(obj: JSON | None) -> int | None:
    """The channel a made workload template gives (None: none, or not one the controller
    wrote). Read from any template of the domain's name, a user's too: nothing is assumed
    of its shape (an exception would end the controller)."""
    node: Any = obj
    for key in ("spec", "spec", "devices", "config"):
        node = node.get(key) if isinstance(node, dict) else None
    for config in node if isinstance(node, list) else []:
        opaque = config.get("opaque") if isinstance(config, dict) else None
        parameters = opaque.get("parameters") if isinstance(opaque, dict) else None
        if isinstance(parameters, dict) and parameters.get("kind") == CHANNEL_CONFIG_KIND:
            channel = parameters.get("channel")
            return channel if type(channel) is int and 0 <= channel < MAX_CHANNELS else None
    return None


def _claim_template(
    meta: JSON, request: str, device_class: str, driver: str, parameters: JSON
) -> JSON:
    return {
        "apiVersion": resourceapi.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {"driver": driver, "parameters": parameters},
                        }
                    ],
                }
            }
        },
    }


def workload_template(domain: Domain, channel: int, names: ApiNames) -> JSON:
    """The channel claim template the domain's pods reference."""
    assert domain.spec is not None
    parameters = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CHANNEL_CONFIG_KIND,
        "domainID": domain.uid,
        "allocationMode": domain.spec.channel.allocation_mode,
        "channel": channel,
    }
    meta = {
        "name": domain.spec.channel.resource_claim_template.name,
        "namespace": domain.namespace,
        "labels": {names.domain_label: domain.uid},
    }
    return _with_digest(
        _claim_template(meta, "channel", names.channel_class, names.driver, parameters)
    )


def daemon_template(domain: Domain, names: ApiNames, settings: DaemonSettings) -> JSON:
    """The claim template of the domain's daemon pods: the node's IMEX daemon device."""
    parameters = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": DAEMON_CONFIG_KIND,
        "domainID": domain.uid,
    }
    meta = {
        "name": daemon_name(domain),
        "namespace": settings.namespace,
        "labels": {names.domain_label: domain.uid},
    }
    return _with_digest(
        _claim_template(meta, "daemon", names.daemon_class, names.driver, parameters)
    )


def daemon_set(domain: Domain, names: ApiNames, settings: DaemonSettings) -> JSON:
    """The DaemonSet running the domain's IMEX daemon on each node labelled into it."""
    labels = {names.domain_label: domain.uid}
    env = [
        {"name": "DRA_DOMAIN_UID", "value": domain.uid},
        {"name": "DRA_DOMAIN", "value": domain.key},
        {"name": "DRA_LOG_FORMAT", "value": settings.log_format},
        {"name": "DRA_COMPAT", "value": settings.compat},
        {"name": "DRA_DRIVER_ROOT", "value": "/driver-root"},
        {"name": "DRA_IMEX_PORT", "value": str(IMEX_PORT)},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    check = {"exec": {"command": ["dra-driver", "imex-daemon", "--check"]}}
    container = {
        "name": "imex-daemon",
        "image": settings.image,
        "imagePullPolicy": settings.pull_policy,
        "command": ["dra-driver", "imex-daemon"],
        "env": env,
        "ports": [{"name": "imex", "containerPort": IMEX_PORT}],
        "resources": {"claims": [{"name": "imex-daemon"}]},
        # Ready only while the daemon is connected to all of its peers; started within 20 min.
        "startupProbe": {
            **check,
            "periodSeconds": 1,
            "failureThreshold": 1200,
            "timeoutSeconds": 10,
        },
        "readinessProbe": {
            **check,
            "periodSeconds": 2,
            "failureThreshold": 1,
            "timeoutSeconds": 10,
        },
        "volumeMounts": [
            {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True},
            # The daemon's config, nodes config and log: written, on any root filesystem.
            {"name": "imex", "mountPath": "/run/imex"},
        ],
    }
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemon_name(domain),
            "namespace": settings.namespace,
            "labels": labels,
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": settings.service_account,
                    **_pull_secrets(settings),
                    "nodeSelector": labels,
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "driver-root",
                            "hostPath": {"path": settings.driver_root, "type": "Directory"},
                        },
                        {"name": "imex", "emptyDir": {}},
                    ],
                    "resourceClaims": [
                        {"name": "imex-daemon", "resourceClaimTemplateName": daemon_name(domain)}
                    ],
                    # A daemon must run wherever the domain's pods do, tainted or not.
                    "tolerations": [{"operator": "Exists"}],
                },
            },
        },
    }
    return _with_digest(body)
