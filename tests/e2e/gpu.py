"""Shared pieces of the driver's end-to-end tests: GPU nodes, the DeviceClass, pods.

The fixtures are registered through conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode, start_gpu_node
from tests.e2e.conftest import raw, wait_until

DRIVER = "gpu.dra.dev"


@pytest.fixture
def gpu_node(
    cluster: LocalCluster, kube_api: Any, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., GpuNode]]:
    """``gpu_node(profile, prefix="gpu", extra=..., env=...)``: kubelet-dra + the driver for a
    fresh node (``start_gpu_node`` keywords); removed after the test."""
    from kubernetes import client as k

    made: list[GpuNode] = []

    def make(profile: str, prefix: str = "gpu", **kw: Any) -> GpuNode:
        name = unique_name(prefix)
        node = start_gpu_node(cluster, name, profile, labels={"e2e-node": name}, **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        cluster.stop_process(f"driver-{node.name}")
        cluster.stop_node(node.name)
        try:
            k.CoreV1Api(kube_api).delete_node(node.name)
        except Exception as exc:
            print(f"deleting node {node.name}: {exc}")


def node_slices(kube_api: Any, node: str) -> list[dict[str, Any]]:
    from kubernetes import client as k

    body = raw(
        k.ResourceV1Api(kube_api).list_resource_slice, field_selector=f"spec.nodeName={node}"
    )
    return list(body["items"])


def published_devices(kube_api: Any, node: str) -> list[str]:
    return [d["name"] for s in node_slices(kube_api, node) for d in s["spec"].get("devices", [])]


def apply(kube_api: Any, namespace: str, docs: str) -> None:
    """Create every object of a YAML stream (namespaced ones in ``namespace``)."""
    from kubernetes import dynamic

    client = dynamic.DynamicClient(kube_api)
    for doc in yaml.safe_load_all(docs):
        if not doc:
            continue
        api = client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        if api.namespaced:
            api.create(body=doc, namespace=namespace)
        else:
            api.create(body=doc)


def template_pod(name: str, node: str, devices: str, template: str = "") -> str:
    """A ResourceClaimTemplate (named ``template``, else ``name``) whose ``spec.devices`` is
    the YAML flow mapping ``devices``, and a pod ``name`` on ``node`` with one claim from it."""
    template = template or name
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {template}}}
spec:
  spec:
    devices: {devices}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{e2e-node: {node}}}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {{name: devs, resourceClaimTemplateName: {template}}}
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources: {{claims: [{{name: devs}}]}}
"""


def one_request(device_class: str, selector: str = "") -> str:
    """``spec.devices`` of a claim for one device of ``device_class`` (flow YAML)."""
    selectors = f", selectors: [{{cel: {{expression: '{selector}'}}}}]" if selector else ""
    return f"{{requests: [{{name: dev, exactly: {{deviceClassName: {device_class}{selectors}}}}}]}}"


#: A claim's config that makes its prepare more than a CDI spec (a time-slice on the GPU).
TIME_SLICED = f"""
      config:
      - opaque:
          driver: {DRIVER}
          parameters:
            apiVersion: {DRIVER}/v1alpha1
            kind: GpuConfig
            sharing: {{strategy: TimeSlicing, timeSlicingConfig: {{interval: Long}}}}"""


def gpu_pod(name: str, node: str, claim_template: str, selector: str = "", config: str = "") -> str:
    """A pod on ``node`` with one GPU claim from a template; ``config`` is YAML appended to
    the claim's ``devices`` (see :data:`TIME_SLICED`)."""
    sel = (
        f"\n          selectors:\n          - cel:\n              expression: '{selector}'"
        if selector
        else ""
    )
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {claim_template}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {DRIVER}{sel}{config}
---{claim_pod(name, node, f"resourceClaimTemplateName: {claim_template}")}"""


def claim_pod(name: str, node: str, claim: str) -> str:
    """A pod ``name`` on ``node`` with one claim ``gpu``, whose source is ``claim``
    (``resourceClaimName: c`` or ``resourceClaimTemplateName: t``)."""
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{e2e-node: {node}}}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {{name: gpu, {claim}}}
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources: {{claims: [{{name: gpu}}]}}
"""


@pytest.fixture(scope="module")
def gpu_class(kube_api: Any) -> Iterator[str]:
    """The DeviceClass ``gpu.dra.dev`` (whole GPUs of this driver)."""
    from kubernetes import client as k

    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
                    }
                }
            ]
        },
    }
    api = k.ResourceV1Api(kube_api)
    try:
        api.create_device_class(body)
    except k.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    yield DRIVER


def claim_of(kube_api: Any, namespace: str, pod: str) -> dict[str, Any]:
    from kubernetes import client as k

    claims = raw(k.ResourceV1Api(kube_api).list_namespaced_resource_claim, namespace)["items"]
    mine = [
        c
        for c in claims
        if any(o.get("name") == pod for o in c["metadata"].get("ownerReferences", []))
    ]
    assert len(mine) == 1, claims
    return dict(mine[0])


def pod_story(kube_api: Any, namespace: str, pod: str) -> str:
    """What a pod that does not get going went through: phase, conditions, container states
    and its Events, for a failure message."""
    from kubernetes import client as k

    core = k.CoreV1Api(kube_api)
    try:
        status = raw(core.read_namespaced_pod, pod, namespace).get("status", {})
    except k.exceptions.ApiException as exc:
        return f"pod {namespace}/{pod}: {exc.status} {exc.reason}"
    lines = [f"pod {namespace}/{pod}: phase {status.get('phase')}"]
    lines += [
        f"  {c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".rstrip()
        for c in status.get("conditions", [])
    ]
    lines += [
        f"  container {c['name']}: {c.get('state')}" for c in status.get("containerStatuses", [])
    ]
    events = raw(core.list_namespaced_event, namespace)["items"]
    lines += [
        f"  event {e.get('reason')}: {e.get('message', '')}"
        for e in events
        if e["involvedObject"].get("name") == pod
    ]
    return "\n".join(lines)


def wait_running(kube_api: Any, namespace: str, pod: str, timeout: float) -> None:
    """Wait until the pod runs; on timeout fail with its story (:func:`pod_story`)."""
    from kubernetes import client as k

    def running() -> bool:
        body = raw(k.CoreV1Api(kube_api).read_namespaced_pod, pod, namespace)
        return body["status"].get("phase") == "Running"

    try:
        wait_until(running, timeout, f"{pod} Running")
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{pod_story(kube_api, namespace, pod)}", pytrace=False)


def node_events(kube_api: Any, node: str, reason: str) -> list[str]:
    """Messages of the Events with ``reason`` posted on Node ``node``."""
    from kubernetes import client as k

    events = raw(k.CoreV1Api(kube_api).list_namespaced_event, "default")["items"]
    return [
        str(e.get("message", ""))
        for e in events
        if e["involvedObject"].get("name") == node and e.get("reason") == reason
    ]


def resourceapi_path(resource: str, namespace: str) -> str:
    """The collection path of a resource.k8s.io/v1 resource in ``namespace``."""
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/{resource}"


def post_json(kube_api: Any, path: str, body: str) -> None:
    """POST a JSON text as it is (Python's JSON encoders stop near a thousand levels deep)."""
    method, url, headers, _, _ = kube_api.param_serialize(
        method="POST",
        resource_path=path,
        header_params={"Content-Type": "application/json"},
        auth_settings=["BearerToken"],
    )
    # Past the client's own encoding: straight to its connection pool (TLS and all).
    response = kube_api.rest_client.pool_manager.request(
        method, url, body=body.encode(), headers=headers
    )
    assert 200 <= response.status < 300, response.data[:300]


def deep_claim(kind: str, name: str, depth: int = 4000) -> str:
    """A ResourceClaim or ResourceClaimTemplate (``kind``) of one GPU whose opaque parameters
    nest ``depth`` lists deep (4000: 8 KB, within the API server's 10 KiB bound, beyond what
    Python's JSON decoder reads by default), as JSON text."""
    devices = (
        f'{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"{DRIVER}"}}}}],'
        f'"config":[{{"requests":["gpu"],"opaque":{{"driver":"{DRIVER}",'
        '"parameters":{"apiVersion":"gpu.dra.dev/v1alpha1","kind":"GpuConfig","x":'
        + "[" * depth
        + "]" * depth
        + "}}}]}"
    )
    spec = f'{{"devices":{devices}}}'
    if kind == "ResourceClaimTemplate":
        spec = f'{{"spec":{spec}}}'
    return (
        f'{{"apiVersion":"resource.k8s.io/v1","kind":"{kind}",'
        f'"metadata":{{"name":"{name}"}},"spec":{spec}}}'
    )
