"""Claim device status for claims whose opaque parameters came in a spelling of their own.

The API server keeps a claim's opaque parameters as sent and refuses a status write that
changes them in the allocation; its server-side apply re-encodes them. A claim created with
indented parameters, ``kind`` first (a Go struct's order), or with a Python client's
``", "`` separators still gets the agent's device status, and the agent logs no refusal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from devenv.simnode import GpuNode
from tests.e2e.conftest import raw, wait_until
from tests.e2e.gpu import DRIVER, apply, claim_pod, post_json, resourceapi_path

pytestmark = pytest.mark.e2e

#: The parameters exactly as three kinds of client send them.
SPELLINGS = {
    "indented": '{\n  "apiVersion": "gpu.dra.dev/v1alpha1",\n  "kind": "GpuConfig",\n'
    '  "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}\n}',
    "kind-first": '{"kind":"GpuConfig","apiVersion":"gpu.dra.dev/v1alpha1",'
    '"sharing":{"timeSlicingConfig":{"interval":"Short"},"strategy":"TimeSlicing"}}',
    "python": json.dumps(
        {
            "apiVersion": "gpu.dra.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}},
        }
    ),
}


def _claim(name: str, parameters: str) -> str:
    config = {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": "PARAMETERS"}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                "config": [config],
            }
        },
    }
    # The parameters go in as written, past any JSON encoder.
    return json.dumps(claim).replace('"PARAMETERS"', parameters)


def test_status_of_claims_with_parameters_spelled_their_own_way(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    kube_api: Any,
    namespace: str,
) -> None:
    from kubernetes import client as k

    node = gpu_node("l4x4")
    api = k.ResourceV1Api(kube_api)
    for name, parameters in SPELLINGS.items():
        post_json(kube_api, resourceapi_path("resourceclaims", namespace), _claim(name, parameters))
        apply(
            kube_api, namespace, claim_pod(f"pod-{name}", node.name, f"resourceClaimName: {name}")
        )

    def devices(name: str) -> list[dict[str, Any]]:
        claim = raw(api.read_namespaced_resource_claim, name, namespace)
        return list(claim.get("status", {}).get("devices", []))

    for name in SPELLINGS:
        (entry,) = wait_until(lambda n=name: devices(n), 60, f"status.devices of claim {name}")
        assert (entry["driver"], entry["pool"]) == (DRIVER, node.name)
        assert entry["data"]["uuid"].startswith("GPU-")
        assert [c["type"] for c in entry["conditions"]] == ["Ready"]
    log = node.driver.log_path.read_text()
    assert "claim status rejected" not in log and "giving up on claim status" not in log
