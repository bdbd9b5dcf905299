"""The ComputeDomain CustomResourceDefinition, for either API group.

The chart installs the one of its mode (``hack/gen_crds.py`` writes both into the chart;
a unit test keeps them current). The schema states the same rules as
:class:`~dra_driver.computedomain.api.DomainSpec`, so the API server refuses at ``kubectl
apply`` what the controller would refuse later; the controller's check stays the last word.

Versions: one version is served and stored per group today (``v1alpha1`` for the driver's
own group, ``v1beta1`` for the NVIDIA driver's). docs/compute-domains.md has the plan for
the next version (served beside this one, conversion without a webhook while the two shapes
stay equal).
"""

from __future__ import annotations

from typing import Any

from dra_driver.computedomain.api import KIND, PLURAL, ApiNames
from dra_driver.resourceapi import DNS_SUBDOMAIN

JSON = dict[str, Any]


def _status_schema() -> JSON:
    node = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "ipAddress": {"type": "string"},
            "cliqueID": {"type": "string"},
            "index": {"type": "integer", "minimum": 0},
            "status": {"type": "string", "enum": ["Ready", "NotReady"]},
            "message": {
                "type": "string",
                "description": "Why the node's IMEX daemon does not run, when its pod says.",
            },
        },
    }
    return {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["Ready", "NotReady"]},
            "nodes": {
                "type": "array",
                "items": node,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        },
    }


def _spec_schema() -> JSON:
    return {
        "type": "object",
        "required": ["channel"],
        "properties": {
            "numNodes": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Nodes the domain spans: it is Ready when this many IMEX "
                "daemons are (0: whenever every daemon there is is ready).",
            },
            "channel": {
                "type": "object",
                "required": ["resourceClaimTemplate"],
                "properties": {
                    "resourceClaimTemplate": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 253,
                                "pattern": DNS_SUBDOMAIN,
                                "description": "Name of the ResourceClaimTemplate the "
                                "controller makes in the domain's namespace (an object name: "
                                "a lowercase RFC 1123 subdomain); the job's pods reference it.",
                            }
                        },
                    },
                    "allocationMode": {
                        "type": "string",
                        "enum": ["Single", "All"],
                        "default": "Single",
                        "description": "Single: the domain's IMEX channel; All: every "
                        "channel of the node.",
                    },
                },
            },
        },
    }


def crd(names: ApiNames) -> JSON:
    """The CustomResourceDefinition of ComputeDomains in ``names``' group."""
    columns = [
        {"name": "Status", "type": "string", "jsonPath": ".status.status"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                **_spec_schema(),
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "a ComputeDomain's spec is immutable"}
                ],
            },
            "status": _status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{names.group}"},
        "spec": {
            "group": names.group,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["cd"],
            },
            "versions": [
                {
                    "name": names.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }
