"""The ComputeDomain controller against the real control plane.

The CRD is installed as the chart installs it; the controller runs in the test's process.
Its daemons are real DaemonSet pods: the scheduler allocates each one the node's IMEX daemon
device (published here by the test DRA plugin, under a driver name of the test's own) and
the node's kubelet prepares it and runs the pod, so a domain's readiness follows what the
kubelet reports, as on a real node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dra_driver.computedomain.api import OWN, ApiNames, read_domain
from dra_driver.computedomain.controller import DomainController
from dra_driver.computedomain.crd import crd
from dra_driver.computedomain.objects import DaemonSettings, daemon_name
from dra_driver.kube import KubeClient, server_side_apply
from dra_driver.resourceapi import RESOURCE_CLAIM_TEMPLATES
from dra_driver.resourceapi import path as rpath

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
DRIVER = "imex.e2e.dev"
NAMES = ApiNames(
    group=OWN.group,
    version=OWN.version,
    driver=DRIVER,
    channel_class="imex-channel.e2e.dev",
    daemon_class="imex-daemon.e2e.dev",
)
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def _get(client: KubeClient, path: str) -> JSON | None:
    response = await client.request("GET", path)
    if response.status == 404:
        return None
    assert response.ok, f"GET {path}: {response.status} {response.body[:200]!r}"
    data: JSON = response.json()
    return data


async def _until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:  # noqa: ASYNC109
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.3)


async def _ok(response: Any) -> None:
    assert response.ok, f"{response.status} {response.body[:300]!r}"


async def _install(client: KubeClient, names: ApiNames, selectors: dict[str, str]) -> None:
    """The CRD of ``names`` and DeviceClasses (name -> CEL selector), as the chart installs
    them."""
    body = crd(names)
    path = f"{CRDS}/{body['metadata']['name']}"
    await _ok(await server_side_apply(client, path, body, field_manager="e2e"))

    async def established() -> bool:
        got = await _get(client, path)
        conditions = ((got or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    await _until("the CRD established", established)
    for name, expression in selectors.items():
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        await _ok(
            await server_side_apply(
                client, rpath("deviceclasses", name), device_class, field_manager="e2e"
            )
        )


@pytest.fixture
async def installed(kube_client: KubeClient) -> None:
    """The CRD, and device classes for the test plugin's devices."""
    every = f"device.driver == '{DRIVER}'"
    await _install(kube_client, NAMES, {NAMES.channel_class: every, NAMES.daemon_class: every})


@contextlib.asynccontextmanager
async def _running(
    client: KubeClient, names: ApiNames, namespace: str
) -> AsyncIterator[DomainController]:
    """The controller, running its daemons in ``namespace``."""
    settings = DaemonSettings(namespace=namespace, image="localhost/dra-driver:e2e")
    # The chart makes the daemons' service account in the driver's namespace.
    account = {"metadata": {"name": settings.service_account}}
    await _ok(
        await client.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body=account
        )
    )
    running = DomainController(client, names, settings, resync=5.0)
    task = asyncio.create_task(running.run())
    try:
        yield running
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def controller(
    kube_client: KubeClient, installed: None, namespace: str
) -> AsyncIterator[DomainController]:
    async with _running(kube_client, NAMES, namespace) as running:
        yield running


def _domain(name: str, template: str, num_nodes: int = 1) -> JSON:
    return {
        "apiVersion": NAMES.api_version,
        "kind": "ComputeDomain",
        "metadata": {"name": name},
        "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": template}}},
    }


async def _create_domain(client: KubeClient, namespace: str, body: JSON) -> JSON:
    response = await client.request("POST", NAMES.path(namespace), body=body)
    await _ok(response)
    created: JSON = response.json()
    return created


async def _events(client: KubeClient, namespace: str, name: str) -> list[str]:
    listing = await _get(client, f"/api/v1/namespaces/{namespace}/events")
    return [
        f"{e['reason']}: {e['message']}"
        for e in (listing or {}).get("items", [])
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "ComputeDomain"
    ]


async def _label(
    client: KubeClient, node: str, value: str | None, key: str = NAMES.domain_label
) -> None:
    patch = {"metadata": {"labels": {key: value}}}
    response = await client.request(
        "PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json"
    )
    await _ok(response)


async def test_a_domain_gets_its_template_daemons_and_status_and_is_cleaned_up(
    kube_client: KubeClient,
    controller: DomainController,
    namespace: str,
    make_node: Callable[..., Any],
    start_testplugin: Callable[..., Any],
) -> None:
    client = kube_client
    node = make_node()
    start_testplugin(node, DRIVER, 1)
    domain = await _create_domain(client, namespace, _domain("job", "job-channel"))
    uid = domain["metadata"]["uid"]
    path = NAMES.path(namespace, "job")

    async def made() -> JSON | None:
        got = await _get(client, path)
        meta = (got or {}).get("metadata") or {}
        if NAMES.finalizer in (meta.get("finalizers") or []) and (got or {}).get("status"):
            return got
        return None

    got = await _until("the finalizer and a status", made)
    assert got["status"] == {"status": "NotReady", "nodes": []}
    channel = int(got["metadata"]["annotations"][NAMES.channel_annotation])
    template = await _until(
        "the channel template",
        lambda: _get(client, rpath(RESOURCE_CLAIM_TEMPLATES, "job-channel", namespace=namespace)),
    )
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {
                "deviceClassName": NAMES.channel_class,
                "allocationMode": "ExactCount",
                "count": 1,
            },
        }
    ]
    assert devices["config"][0]["opaque"]["parameters"] == {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": uid,
        "allocationMode": "Single",
        "channel": channel,
    }
    ds_path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/imex-{uid}"
    assert await _until("the daemon set", lambda: _get(client, ds_path))

    # The node joins the domain: its daemon pod is allocated the node's daemon device, the
    # kubelet prepares it and starts the pod, and the domain is Ready.
    await _label(client, node.name, uid)

    async def ready() -> JSON | None:
        got = await _get(client, path)
        status = (got or {}).get("status") or {}
        return status if status.get("status") == "Ready" else None

    status = await _until("the domain Ready", ready, timeout=90)
    [entry] = status["nodes"]
    assert entry["name"] == node.name and entry["status"] == "Ready" and entry["ipAddress"]
    assert any(e.startswith("DomainReady") for e in await _events(client, namespace, "job"))

    # Its daemon goes away: NotReady with an Event, then Ready again with the new pod.
    pods = await _get(
        client,
        f"/api/v1/namespaces/{namespace}/pods?labelSelector={NAMES.domain_label}%3D{uid}",
    )
    [pod] = (pods or {}).get("items", [])
    response = await client.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
        query=[("gracePeriodSeconds", "0")],
    )
    await _ok(response)

    async def noticed() -> list[str]:
        events = await _events(client, namespace, "job")
        return [e for e in events if e.startswith("DomainNotReady")]

    await _until("the DomainNotReady event", noticed, timeout=60)
    await _until("the domain Ready again", ready, timeout=90)

    # Deleted: its templates and daemons go, the node leaves it, then the domain is gone.
    await _ok(await client.request("DELETE", path))
    assert await _until("the domain gone", lambda: _gone(client, path), timeout=90)
    assert await _get(client, ds_path) is None
    for name in ("job-channel", daemon_name(read_domain(domain, NAMES))):
        assert (
            await _get(client, rpath(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)) is None
        )
    labels = ((await _get(client, f"/api/v1/nodes/{node.name}")) or {})["metadata"]["labels"]
    assert NAMES.domain_label not in labels


async def _gone(client: KubeClient, path: str) -> bool:
    return await _get(client, path) is None


async def test_domains_get_distinct_channels_and_never_take_a_users_template(
    kube_client: KubeClient, controller: DomainController, namespace: str
) -> None:
    client = kube_client
    user_template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mine", "labels": {"owner": "me"}},
        "spec": {"spec": {"devices": {"requests": []}}},
    }
    response = await client.request(
        "POST", rpath(RESOURCE_CLAIM_TEMPLATES, namespace=namespace), body=user_template
    )
    await _ok(response)
    first = await _create_domain(client, namespace, _domain("a", "a-channel"))
    second = await _create_domain(client, namespace, _domain("b", "mine"))

    async def channels() -> list[int] | None:
        found = []
        for name in ("a", "b"):
            got = await _get(client, NAMES.path(namespace, name))
            value = (
                ((got or {}).get("metadata") or {})
                .get("annotations", {})
                .get(NAMES.channel_annotation)
            )
            if value is None:
                return None
            found.append(int(value))
        return found

    a, b = await _until("both channels", channels)
    assert a != b

    async def conflict() -> list[str]:
        return [
            e for e in await _events(client, namespace, "b") if e.startswith("TemplateConflict")
        ]

    [event] = await _until("the conflict event", conflict)
    assert f"{namespace}/mine" in event
    kept = await _get(client, rpath(RESOURCE_CLAIM_TEMPLATES, "mine", namespace=namespace))
    assert kept is not None and kept["metadata"]["labels"] == {"owner": "me"}
    assert not kept["spec"]["spec"]["devices"].get("config")
    assert daemon_name(read_domain(first, NAMES)) != daemon_name(read_domain(second, NAMES))
    # Deleting the domain that never got its template leaves the user's template alone.
    await _ok(await client.request("DELETE", NAMES.path(namespace, "b")))
    await _until("domain b gone", lambda: _gone(client, NAMES.path(namespace, "b")), timeout=60)
    assert await _get(client, rpath(RESOURCE_CLAIM_TEMPLATES, "mine", namespace=namespace))


async def test_the_api_server_refuses_an_invalid_or_changed_spec(
    kube_client: KubeClient, installed: None, namespace: str
) -> None:
    client = kube_client
    bad = _domain("bad", "t")
    bad["spec"]["channel"]["allocationMode"] = "Some"
    response = await client.request("POST", NAMES.path(namespace), body=bad)
    assert response.status == 422 and b"allocationMode" in response.body
    await _create_domain(client, namespace, _domain("fixed", "t"))
    patch = {"spec": {"numNodes": 3}}
    response = await client.request(
        "PATCH",
        NAMES.path(namespace, "fixed"),
        body=json.dumps(patch),
        content_type="application/merge-patch+json",
    )
    assert response.status == 422 and b"immutable" in response.body


async def test_the_controller_writes_only_to_the_domain_it_read(
    kube_client: KubeClient, installed: None, namespace: str
) -> None:
    """A domain deleted and made again under its name between the controller's read and its
    write is not written with what was planned for the old one (above all, the new domain's
    finalizer is not removed by the old one's teardown); a finalizer list that changed since
    the read is not replaced. Each is refused by the API server and retried on a fresh read."""
    from dra_driver.computedomain.planner import AddFinalizer, RemoveFinalizer, SetStatus
    from dra_driver.resourceslice.rawapi import ApiError

    client = kube_client
    settings = DaemonSettings(namespace=namespace, image="localhost/dra-driver:e2e")
    writer = DomainController(client, NAMES, settings)
    body = _domain("again", "t")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    old = read_domain(await _create_domain(client, namespace, body), NAMES)
    path = NAMES.path(namespace, "again")
    strip = {"metadata": {"finalizers": None}}
    await _ok(
        await client.request("PATCH", path, body=strip, content_type="application/merge-patch+json")
    )
    await _ok(await client.request("DELETE", path))
    await _until("the old domain gone", lambda: _gone(client, path))
    body["metadata"]["finalizers"] = [NAMES.finalizer]
    new = read_domain(await _create_domain(client, namespace, body), NAMES)
    assert new.uid != old.uid

    for action in (RemoveFinalizer(), SetStatus({"status": "Ready", "nodes": []})):
        with pytest.raises(ApiError) as refused:
            await writer._carry_out(old, action)
        assert refused.value.status == 409, refused.value
    got = await _get(client, path)
    assert got is not None and got["metadata"]["finalizers"] == [NAMES.finalizer]
    assert not (got.get("status") or {}).get("status")

    # Someone else's finalizer added after the read is not dropped by replacing the list.
    other = {"metadata": {"finalizers": [NAMES.finalizer, "example.com/other"]}}
    await _ok(
        await client.request("PATCH", path, body=other, content_type="application/merge-patch+json")
    )
    with pytest.raises(ApiError) as conflict:
        await writer._carry_out(new, RemoveFinalizer())
    assert conflict.value.status == 409
    fresh = read_domain(await _get(client, path) or {}, NAMES)
    await writer._carry_out(fresh, RemoveFinalizer())
    got = await _get(client, path)
    assert got is not None and got["metadata"]["finalizers"] == ["example.com/other"]
    with pytest.raises(ApiError):
        await writer._carry_out(fresh, AddFinalizer())  # read before the removal above
    await writer._carry_out(read_domain(got, NAMES), AddFinalizer())
    got = await _get(client, path)
    assert got is not None
    assert got["metadata"]["finalizers"] == ["example.com/other", NAMES.finalizer]


# -- the node side: the compute domain plugin beside the kubelet ---------------------------

CLASSES = {
    OWN.channel_class: "channel",
    OWN.daemon_class: "daemon",
}


@pytest.fixture
async def own_controller(
    kube_client: KubeClient, namespace: str
) -> AsyncIterator[DomainController]:
    """The CRD and IMEX DeviceClasses of the driver's own names (as the chart has them), and
    the controller."""
    selectors = {
        name: f"device.driver == '{OWN.driver}' && device.attributes['{OWN.driver}'].type == '{kind}'"
        for name, kind in CLASSES.items()
    }
    await _install(kube_client, OWN, selectors)
    async with _running(kube_client, OWN, namespace) as running:
        yield running


def _start_plugin(cluster: Any, node: Any, *extra: str) -> Any:
    """``dra-driver compute-domain-plugin`` for a simulated gb200 node, as the chart runs it."""
    import sys

    return cluster.spawn(
        f"imex-{node.name}",
        [
            sys.executable,
            "-m",
            "dra_driver.cli",
            "compute-domain-plugin",
            "--backend=simulated",
            "--profile=gb200",
            f"--node-name={node.name}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--registry-dir={node.registry_dir}",
            f"--plugins-dir={node.plugins_dir}",
            f"--cdi-root={node.cdi_dir}",
            "--log-format=json",
            *extra,
        ],
    )


def _workload(name: str, node: str, template: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "ctr",
                    "image": "busybox",
                    "resources": {"claims": [{"name": "channel"}]},
                }
            ],
            "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
        },
    }


@pytest.mark.parametrize("binding", [False, True], ids=["prepare-waits", "binding-conditions"])
async def test_a_pod_gets_its_domains_channel_once_the_daemon_on_its_node_is_ready(
    binding: bool,
    cluster: Any,
    kube_client: KubeClient,
    own_controller: DomainController,
    namespace: str,
    make_node: Callable[..., Any],
) -> None:
    if binding and (why := cluster.feature_off("DRADeviceBindingConditions")):
        pytest.skip(f"no binding conditions: {why}")
    client = kube_client
    node = make_node()
    _start_plugin(cluster, node, *(["--imex-binding-conditions=true"] if binding else []))
    try:
        domain = await _create_domain(client, namespace, _domain("train", "train-channel"))
        uid = domain["metadata"]["uid"]
        await _until(
            "the channel template",
            lambda: _get(
                client, rpath(RESOURCE_CLAIM_TEMPLATES, "train-channel", namespace=namespace)
            ),
        )
        response = await client.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            body=_workload("worker", node.name, "train-channel"),
        )
        await _ok(response)

        async def running_pod() -> JSON | None:
            pod = await _get(client, f"/api/v1/namespaces/{namespace}/pods/worker")
            return pod if (pod or {}).get("status", {}).get("phase") == "Running" else None

        pod = await _until("the workload pod Running", running_pod, timeout=120)
        # The node joined the domain, its daemon is ready, and the container's CDI spec has
        # the domain's channel.
        labels = ((await _get(client, f"/api/v1/nodes/{node.name}")) or {})["metadata"]["labels"]
        assert labels[OWN.domain_label] == uid
        assert labels["nvidia.com/gpu.clique"].endswith(".1")
        got = await _get(client, OWN.path(namespace, "train")) or {}
        assert got["status"]["status"] == "Ready"
        channel = int(got["metadata"]["annotations"][OWN.channel_annotation])
        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = await _get(client, rpath("resourceclaims", claim_name, namespace=namespace)) or {}
        spec_file = node.cdi_dir / f"k8s.{OWN.driver}-claim_{claim['metadata']['uid']}.json"
        spec = json.loads(spec_file.read_text())
        edits = spec["devices"][0]["containerEdits"]
        assert edits["deviceNodes"] == [
            {
                "path": f"/dev/nvidia-caps-imex-channels/channel{channel}",
                "type": "c",
                "major": 507,
                "minor": channel,
                "permissions": "rw",
            }
        ]
        assert f"COMPUTE_DOMAIN_UID={uid}" in edits["env"]
        assert f"COMPUTE_DOMAIN={namespace}/train" in edits["env"]
        if binding:
            conditions = {
                c["type"]: c["status"]
                for d in claim["status"].get("devices", [])
                for c in d.get("conditions", [])
            }
            assert conditions.get("IMEXDaemonReady") == "True"

        # The pod goes: the node leaves the domain, and its daemon with it.
        await _ok(
            await client.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/worker",
                query=[("gracePeriodSeconds", "0")],
            )
        )

        async def left() -> bool:
            node_obj = await _get(client, f"/api/v1/nodes/{node.name}") or {}
            return OWN.domain_label not in node_obj["metadata"].get("labels", {})

        await _until("the node out of the domain", left, timeout=60)
        assert not spec_file.exists()
    finally:
        cluster.stop_process(f"imex-{node.name}")


async def test_a_pod_whose_node_cannot_join_its_domain_is_not_bound_and_goes_elsewhere(
    cluster: Any,
    kube_client: KubeClient,
    own_controller: DomainController,
    namespace: str,
    make_node: Callable[..., Any],
) -> None:
    if why := cluster.feature_off("DRADeviceBindingConditions"):
        pytest.skip(f"no binding conditions: {why}")
    client = kube_client
    first, second = (
        make_node(labels={"cd-test": namespace}),
        make_node(labels={"cd-test": namespace}),
    )
    # The first node is in another domain (its label): it cannot join this one.
    await _label(client, first.name, "another-domain-uid", OWN.domain_label)
    _start_plugin(cluster, first, "--imex-binding-conditions=true")
    try:
        await _create_domain(client, namespace, _domain("job", "job-channel"))
        await _until(
            "the channel template",
            lambda: _get(
                client, rpath(RESOURCE_CLAIM_TEMPLATES, "job-channel", namespace=namespace)
            ),
        )
        pod = _workload("worker", "", "job-channel")
        pod["spec"]["nodeSelector"] = {"cd-test": namespace}
        await _ok(await client.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod))

        async def claim_name() -> str | None:
            got = await _get(client, f"/api/v1/namespaces/{namespace}/pods/worker") or {}
            statuses = got.get("status", {}).get("resourceClaimStatuses") or []
            return statuses[0].get("resourceClaimName") if statuses else None

        name = await _until("the pod's claim", claim_name)

        async def failed() -> list[str]:
            listing = await _get(client, f"/api/v1/namespaces/{namespace}/events") or {}
            return [
                e["message"]
                for e in listing.get("items", [])
                if e["involvedObject"].get("name") == name and e["reason"] == "IMEXDaemonFailed"
            ]

        [message, *_] = await _until("the IMEXDaemonFailed event", failed, timeout=60)
        assert f"node {first.name} is in another compute domain" in message
        got = await _get(client, f"/api/v1/namespaces/{namespace}/pods/worker") or {}
        assert not got["spec"].get("nodeName"), "bound to a node that is not in its domain"

        # A node that can join appears: the pod is scheduled there and runs.
        _start_plugin(cluster, second, "--imex-binding-conditions=true")

        async def ran() -> JSON | None:
            got = await _get(client, f"/api/v1/namespaces/{namespace}/pods/worker") or {}
            return got if got.get("status", {}).get("phase") == "Running" else None

        # Both nodes stay candidates and the scheduler picks one of equals at random, so it
        # may try the first node again a few times (a round is its 5 s PreBind poll and a
        # deallocation, about 7 s; 1-5 rounds measured) before the second one's slice is
        # even up; 300 s leaves room for that on a loaded machine.
        got = await _until("the pod Running on the other node", ran, timeout=300)
        assert got["spec"]["nodeName"] == second.name
        labels = ((await _get(client, f"/api/v1/nodes/{first.name}")) or {})["metadata"]["labels"]
        assert labels[OWN.domain_label] == "another-domain-uid"  # left alone
    finally:
        for node in (first, second):
            cluster.stop_process(f"imex-{node.name}")


async def test_a_host_imex_service_is_reported_on_the_node(
    cluster: Any,
    kube_client: KubeClient,
    make_node: Callable[..., Any],
    tmp_path: Any,
) -> None:
    root = tmp_path / "driver-root"
    (root / "etc/nvidia-imex").mkdir(parents=True)
    (root / "etc/nvidia-imex/config.cfg").write_text("SERVER_PORT=50000\n")
    node = make_node()
    _start_plugin(cluster, node, f"--driver-root={root}")
    try:

        async def reported() -> list[str]:
            listing = await _get(kube_client, "/api/v1/namespaces/default/events") or {}
            return [
                e["message"]
                for e in listing.get("items", [])
                if e["involvedObject"].get("name") == node.name and e["reason"] == "HostIMEXService"
            ]

        [message] = await _until("the HostIMEXService event", reported)
        assert "/etc/nvidia-imex/config.cfg" in message and "systemctl disable" in message
    finally:
        cluster.stop_process(f"imex-{node.name}")
