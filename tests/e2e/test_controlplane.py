"""The local control plane itself: API validation, scheduling and the kubelet DRA path.

These run against the real kube-apiserver, kube-scheduler, kube-controller-manager and
the kubelet's DRA manager (``testenv kubelet-dra``) with the trivial ``testenv
testplugin`` as the DRA driver, before any Python driver is involved.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from devenv.localcluster import LocalCluster

pytestmark = pytest.mark.e2e

Wait = Callable[..., Any]


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a typed client method and return the JSON body (no model classes)."""
    resp = call(*args, _preload_content=False, **kwargs)
    return json.loads(resp.data)


def status_of(call: Callable[..., Any], *args: Any) -> int:
    try:
        call(*args, _preload_content=False)
    except ApiException as e:
        return int(e.status)
    return 200


def slice_body(name: str, driver: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_serves_resource_v1(cluster: LocalCluster, kube_api: Any) -> None:
    groups = raw(k.ApisApi(kube_api).get_api_versions)
    resource = next(g for g in groups["groups"] if g["name"] == "resource.k8s.io")
    versions = {v["version"] for v in resource["versions"]}
    assert "v1" in versions
    assert resource["preferredVersion"]["version"] == "v1"
    version = raw(k.VersionApi(kube_api).get_code)
    assert version["gitVersion"] == cluster.version


def test_resourceslice_validation(kube_api: Any, unique_name: Callable[[str], str]) -> None:
    api = k.ResourceV1Api(kube_api)
    driver = f"{unique_name('v')}.example.com"
    node = unique_name("node")

    good = slice_body(
        unique_name("slice"),
        driver,
        node,
        [
            {
                "name": "gpu-0",
                "attributes": {
                    "model": {"string": "A100"},
                    "index": {"int": 0},
                    "driverVersion": {"version": "550.54.15"},
                },
                "capacity": {"memory": {"value": "40Gi"}},
            }
        ],
    )
    created = raw(api.create_resource_slice, good)
    try:
        back = raw(api.read_resource_slice, created["metadata"]["name"])
        dev = back["spec"]["devices"][0]
        assert back["spec"]["driver"] == driver
        assert back["spec"]["nodeName"] == node
        assert dev["attributes"]["model"] == {"string": "A100"}
        assert dev["attributes"]["driverVersion"] == {"version": "550.54.15"}
        assert dev["capacity"]["memory"]["value"] == "40Gi"
    finally:
        api.delete_resource_slice(created["metadata"]["name"])

    too_many = slice_body(
        unique_name("slice"), driver, node, [{"name": f"dev-{i}"} for i in range(129)]
    )
    with pytest.raises(ApiException) as exc:
        api.create_resource_slice(too_many)
    assert exc.value.status == 422
    assert "128" in str(exc.value.body)

    bad_name = slice_body(unique_name("slice"), driver, node, [{"name": "Not_A_DNS_Label"}])
    with pytest.raises(ApiException) as exc:
        api.create_resource_slice(bad_name)
    assert exc.value.status == 422
    assert "spec.devices[0].name" in str(exc.value.body)


def test_kubelet_dra_prepares_and_unprepares(
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
    unique_name: Callable[[str], str],
    wait_until: Wait,
) -> None:
    core = k.CoreV1Api(kube_api)
    resource = k.ResourceV1Api(kube_api)
    node = make_node(labels={"e2e.dra.dev/role": "test"})
    driver = f"{unique_name('t')}.dra.test"
    plugin = start_testplugin(node, driver, 2)

    # The plugin registers with kubelet-dra and publishes its devices.
    def node_slices() -> list[dict[str, Any]]:
        body = raw(
            resource.list_resource_slice,
            field_selector=f"spec.driver={driver},spec.nodeName={node.name}",
        )
        return list(body["items"])

    slices = wait_until(node_slices, 60, f"ResourceSlices of {driver}")
    assert sorted(d["name"] for s in slices for d in s["spec"]["devices"]) == ["dev-0", "dev-1"]

    device_class = unique_name("class")
    resource.create_device_class(
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )
    try:
        resource.create_namespaced_resource_claim_template(
            namespace,
            {
                "metadata": {"name": "one-dev"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "dev", "exactly": {"deviceClassName": device_class}}
                            ]
                        }
                    }
                },
            },
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "consumer"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node.name},
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-dev"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "dev"}]},
                        },
                        {"name": "sidecar", "image": "registry.k8s.io/pause:3.10"},
                    ],
                },
            },
        )

        def running() -> dict[str, Any] | None:
            pod = raw(core.read_namespaced_pod, "consumer", namespace)
            return pod if pod["status"].get("phase") == "Running" else None

        pod = wait_until(running, 90, "pod consumer Running")
        assert pod["spec"]["nodeName"] == node.name
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True"

        # (c) the ResourceClaim controller generated the claim from the template
        statuses = pod["status"]["resourceClaimStatuses"]
        assert [s["name"] for s in statuses] == ["dev"]
        claim_name = statuses[0]["resourceClaimName"]
        claim = raw(resource.read_namespaced_resource_claim, claim_name, namespace)
        owner = claim["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Pod",
            "consumer",
            pod["metadata"]["uid"],
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1
        assert results[0]["driver"] == driver
        assert results[0]["pool"] == node.name
        device = results[0]["device"]
        assert device in ("dev-0", "dev-1")
        assert {"resource": "pods", "name": "consumer", "uid": pod["metadata"]["uid"]}.items() <= (
            claim["status"]["reservedFor"][0].items()
        )
        claim_uid = claim["metadata"]["uid"]

        # the kubelet's prepare path reached the plugin, and CDI resolved the IDs
        prepares = [c for c in plugin.calls() if c["method"] == "prepare"]
        assert [c["claimUID"] for c in prepares] == [claim_uid]
        assert plugin.cdi_spec_path(claim_uid).is_file()

        record = node.wait_pod_record(namespace, "consumer")
        assert record["uid"] == pod["metadata"]["uid"]
        assert "prepareError" not in record
        main = record["containers"]["main"]
        assert main["cdiDevices"] == [f"{driver}/claim={claim_uid}-{device}"]
        env_name = "TESTPLUGIN_" + device.upper().replace("-", "_")
        assert f"{env_name}={device}" in main["env"]
        assert f"TESTPLUGIN_CLAIM={namespace}/{claim_name}" in main["env"]
        assert main["deviceNodes"] == [f"/dev/testplugin-{device}"]
        sidecar = record["containers"]["sidecar"]
        assert sidecar["cdiDevices"] == [] and sidecar["env"] == []

        # deleting the pod unprepares, then the pod disappears
        core.delete_namespaced_pod("consumer", namespace)
        wait_until(
            lambda: status_of(core.read_namespaced_pod, "consumer", namespace) == 404,
            60,
            "pod consumer gone",
        )
        unprepares = [c for c in plugin.calls() if c["method"] == "unprepare"]
        assert [c["claimUID"] for c in unprepares] == [claim_uid]
        assert not plugin.cdi_spec_path(claim_uid).exists()
        assert node.pod_record(namespace, "consumer") is None

        # (c) the garbage collector removes the generated claim after the pod is gone
        wait_until(
            lambda: (
                status_of(resource.read_namespaced_resource_claim, claim_name, namespace) == 404
            ),
            60,
            f"claim {claim_name} garbage-collected",
        )
    finally:
        resource.delete_device_class(device_class)


def test_prepare_error_is_reported_and_retried(
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
    unique_name: Callable[[str], str],
    wait_until: Wait,
) -> None:
    """A claim allocated for a driver that is not registered on the node yet: kubelet-dra
    records the error (record + pod Event) and retries until the plugin shows up."""
    core = k.CoreV1Api(kube_api)
    resource = k.ResourceV1Api(kube_api)
    node = make_node()
    driver = f"{unique_name('late')}.dra.test"
    # Publish devices from outside so the scheduler can allocate while no plugin runs.
    # A node selector instead of nodeName keeps the slice out of the kubelet's wiping.
    slice_name = unique_name("slice")
    body = slice_body(slice_name, driver, node.name, [{"name": "dev-0"}, {"name": "dev-1"}])
    del body["spec"]["nodeName"]
    body["spec"]["pool"]["name"] = "external"
    body["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
        ]
    }
    resource.create_resource_slice(body)
    device_class = unique_name("class")
    resource.create_device_class(
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )
    try:
        resource.create_namespaced_resource_claim(
            namespace,
            {
                "metadata": {"name": "shared"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]
                    }
                },
            },
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "early"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node.name},
                    "resourceClaims": [{"name": "dev", "resourceClaimName": "shared"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "dev"}]},
                        }
                    ],
                },
            },
        )
        record = node.wait_pod_record(namespace, "early", lambda r: "prepareError" in r, 60)
        assert driver in record["prepareError"]

        def failed_event() -> bool:
            events = raw(
                core.list_namespaced_event,
                namespace,
                field_selector="involvedObject.name=early",
            )
            return any(e["reason"] == "FailedPrepareDynamicResources" for e in events["items"])

        wait_until(failed_event, 30, "FailedPrepareDynamicResources event")

        # The plugin comes up; the retry succeeds without touching the pod.
        plugin = start_testplugin(node, driver, 2)
        wait_until(
            lambda: (
                raw(core.read_namespaced_pod, "early", namespace)["status"].get("phase")
                == "Running"
            ),
            90,
            "pod early Running after the plugin registered",
        )
        record = node.wait_pod_record(namespace, "early", lambda r: "prepareError" not in r, 10)
        assert record["containers"]["main"]["cdiDevices"]
        assert [c["method"] for c in plugin.calls()] == ["prepare"]

        # Force deletion (no graceful path): kubelet-dra must still unprepare.
        core.delete_namespaced_pod("early", namespace, grace_period_seconds=0)
        wait_until(
            lambda: [c["method"] for c in plugin.calls()] == ["prepare", "unprepare"],
            60,
            "unprepare after force deletion",
        )
        wait_until(lambda: node.pod_record(namespace, "early") is None, 10, "record removed")
    finally:
        resource.delete_device_class(device_class)
        with contextlib.suppress(ApiException):
            resource.delete_resource_slice(slice_name)


def _consumer_pod(name: str, node: str, template: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }


@pytest.fixture
def test_driver(kube_api: Any, namespace: str, unique_name: Callable[[str], str]) -> Any:
    """A unique driver name with a DeviceClass and a one-device claim template for it."""
    resource = k.ResourceV1Api(kube_api)
    driver = f"{unique_name('t')}.dra.test"
    device_class = unique_name("class")
    resource.create_device_class(
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )
    resource.create_namespaced_resource_claim_template(
        namespace,
        {
            "metadata": {"name": "one-dev"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]
                    }
                }
            },
        },
    )
    yield driver
    resource.delete_device_class(device_class)


def _wait_running(core: Any, namespace: str, name: str, wait_until: Wait) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = raw(core.read_namespaced_pod, name, namespace)
        return pod if pod["status"].get("phase") == "Running" else None

    result: dict[str, Any] = wait_until(running, 90, f"pod {name} Running")
    return result


def test_device_health_reaches_pod_status(
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
    test_driver: str,
    tmp_path: Any,
    wait_until: Wait,
) -> None:
    if cluster.minor < 37:
        pytest.skip(
            "the test plugin reports device health through the kubeletplugin health service "
            f"of Kubernetes 1.37; {cluster.version} lacks it"
        )
    core = k.CoreV1Api(kube_api)
    node = make_node()
    health_file = tmp_path / "unhealthy"
    health_file.write_text("")
    start_testplugin(node, test_driver, 1, f"--health-file={health_file}")
    core.create_namespaced_pod(namespace, _consumer_pod("watched", node.name, "one-dev"))
    _wait_running(core, namespace, "watched", wait_until)

    def health_of_pod() -> str | None:
        pod = raw(core.read_namespaced_pod, "watched", namespace)
        for cs in pod["status"].get("containerStatuses", []):
            for rs in cs.get("allocatedResourcesStatus") or []:
                for r in rs["resources"]:
                    return str(r["health"])
        return None

    wait_until(lambda: health_of_pod() == "Healthy", 60, "device Healthy in pod status")
    health_file.write_text("dev-0\n")
    wait_until(lambda: health_of_pod() == "Unhealthy", 60, "device Unhealthy in pod status")

    def recorded() -> bool:
        data = node.health()
        return bool(data) and any(
            e["pod"] == "watched" and e["health"] == "Unhealthy" and "dev-0" in e["resourceID"]
            for e in data["entries"]
        )

    wait_until(recorded, 10, "Unhealthy entry in health.json")


def test_restarts_keep_prepared_claims(
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
    test_driver: str,
    wait_until: Wait,
) -> None:
    """kubelet-dra restarts from its checkpoint; the API server restarts on the same port."""
    core = k.CoreV1Api(kube_api)
    node = make_node()
    plugin = start_testplugin(node, test_driver, 2)
    core.create_namespaced_pod(namespace, _consumer_pod("survivor", node.name, "one-dev"))
    _wait_running(core, namespace, "survivor", wait_until)
    assert [c["method"] for c in plugin.calls()] == ["prepare"]

    cluster.restart_apiserver()
    assert raw(core.read_namespaced_pod, "survivor", namespace)["status"]["phase"] == "Running"

    cluster.restart_node(node.name)
    # The restarted kubelet knows the claim is prepared (checkpoint) and does not prepare again.
    record = node.wait_pod_record(namespace, "survivor")
    assert record["containers"]["main"]["cdiDevices"]
    assert [c["method"] for c in plugin.calls()] == ["prepare"]

    # A new pod after both restarts still goes through the whole path.
    core.create_namespaced_pod(namespace, _consumer_pod("newcomer", node.name, "one-dev"))
    _wait_running(core, namespace, "newcomer", wait_until)

    core.delete_namespaced_pod("survivor", namespace)
    wait_until(
        lambda: [c["method"] for c in plugin.calls()].count("unprepare") == 1,
        60,
        "unprepare of the pod prepared before the restart",
    )


def test_plugin_reregistration_and_slice_wiping(
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
    test_driver: str,
    wait_until: Wait,
) -> None:
    """The kubelet's plugin manager: a plugin that comes back is used again; a plugin that
    stays away gets its node-local ResourceSlices wiped after 30 s."""
    core = k.CoreV1Api(kube_api)
    resource = k.ResourceV1Api(kube_api)
    node = make_node()
    selector = f"spec.driver={test_driver},spec.nodeName={node.name}"

    def slice_count() -> int:
        return len(raw(resource.list_resource_slice, field_selector=selector)["items"])

    plugin = start_testplugin(node, test_driver, 2)
    wait_until(lambda: slice_count() == 1, 60, "slices published")

    # Away briefly: the kubelet keeps the slices and uses the new registration.
    cluster.stop_process(plugin.process.name)
    plugin = start_testplugin(node, test_driver, 2)
    core.create_namespaced_pod(namespace, _consumer_pod("after-restart", node.name, "one-dev"))
    _wait_running(core, namespace, "after-restart", wait_until)
    assert slice_count() == 1

    # Away for good: wiped 30 s after the disconnect.
    cluster.stop_process(plugin.process.name)
    wait_until(lambda: slice_count() == 0, 60, "kubelet wiping the driver's slices")
