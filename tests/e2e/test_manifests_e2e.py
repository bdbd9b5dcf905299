"""The install manifests and the examples against the real API server.

- Every object of the kustomize base and of every example is accepted by the API server
  (create with ``dryRun=All``: full validation and admission, nothing stored).
- The admission policy confines the driver's service account to ResourceSlices of its own
  node (impersonating the service account with a node-name claim).

``EXAMPLES`` records what each example does on the demo cluster (a dgx-h100 node and a
mixed node); the scheduling tests that run the examples with the real scheduler and the
driver build on it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

from devenv.localcluster import LocalCluster, repo_root
from tests.unit.test_manifests import slice_policy

pytestmark = pytest.mark.e2e

ROOT = repo_root()
BASE = ROOT / "manifests" / "base"
EXAMPLES_DIR = ROOT / "examples"
FIELD_MANAGER = "dra-driver-e2e"

DRIVER_NAMESPACE = "dra-driver"
DRIVER_USER = "system:serviceaccount:dra-driver:dra-driver"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POLICY_MESSAGE = "may only write ResourceSlices of that node"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------
# What each example does on the demo cluster
# ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """The outcome of applying an example to the demo cluster (nodes dgx-h100 and mixed).

    ``devices`` maps node profile -> regular expression that every allocated device of the
    example's claims matches on that node; a pod may land only on those profiles. ``count``
    is the number of devices per claim. A Pending example has no devices; ``message`` is
    part of the pod's FailedScheduling event. ``gates``: the DRA feature gates the example
    needs; where one is off the example is skipped, with the reason.
    """

    scheduled: bool = True
    devices: dict[str, str] = field(default_factory=dict)
    count: int | None = 1
    namespace_labels: dict[str, str] = field(default_factory=dict)
    message: str = ""
    gates: tuple[str, ...] = ()


ANY_WHOLE_GPU = {"dgx-h100": r"gpu-[0-7]", "mixed": r"gpu-[23]"}
ANY_H100 = {"dgx-h100": r"gpu-[0-7]", "mixed": r"gpu-2"}

EXAMPLES: dict[str, Expect] = {
    "single-gpu": Expect(devices=ANY_WHOLE_GPU),
    "gpu-min-memory": Expect(devices=ANY_H100),
    "gpu-by-model": Expect(devices=ANY_H100),
    "gpu-compute-capability": Expect(devices=ANY_WHOLE_GPU),
    "two-gpus-same-pcie-root": Expect(devices={"dgx-h100": r"gpu-[0-7]"}, count=2),
    "gpus-same-numa-node": Expect(devices={"dgx-h100": r"gpu-[0-3]|gpu-[4-7]"}, count=4),
    "prioritized-list": Expect(devices=ANY_H100, gates=("DRAPrioritizedList",)),
    "shared-claim": Expect(devices=ANY_WHOLE_GPU),
    "time-slicing": Expect(devices=ANY_WHOLE_GPU),
    "mps": Expect(devices=ANY_WHOLE_GPU),
    "mig-1g10gb": Expect(devices={"mixed": r"gpu-0-mig-1g10gb-19-6|gpu-1-mig-1g10gb-19-[45]"}),
    # Without --dynamic-mig (as here) the existing 3g.40gb and 4g.40gb devices serve it.
    "dynamic-mig": Expect(devices={"mixed": r"gpu-0-mig-3g40gb-9-0|gpu-1-mig-4g40gb-5-0"}),
    "mig-multiple-same-parent": Expect(devices={"mixed": r"gpu-1-mig-1g10gb-19-[45]"}, count=2),
    "admin-access": Expect(
        devices=ANY_WHOLE_GPU,
        count=None,
        namespace_labels={ADMIN_ACCESS_LABEL: "true"},
        gates=("DRAAdminAccess",),
    ),
    "all-gpus": Expect(devices=ANY_WHOLE_GPU, count=None),
    "selector-typo": Expect(
        scheduled=False, count=None, message="CEL runtime error: no such key: prodcutName"
    ),
    # The demo nodes share no GPU (no --shared-gpus): the shared class matches nothing there;
    # tests/e2e/test_shared_gpus.py runs it on a node that shares its GPU.
    # Without consumable capacity the API server would drop the capacity requests.
    "shared-gpu-memory": Expect(
        scheduled=False,
        count=None,
        message="cannot allocate all claims",
        gates=("DRAConsumableCapacity",),
    ),
}


def example_dirs() -> list[Path]:
    return sorted(p for p in EXAMPLES_DIR.iterdir() if p.is_dir())


def example_objects(directory: Path) -> list[Obj]:
    objects: list[Obj] = []
    for path in sorted(directory.glob("*.yaml")):
        with path.open() as f:
            objects += [d for d in yaml.safe_load_all(f) if d]
    return objects


def base_objects() -> list[Obj]:
    """The kustomize base's resources in the order listed (no kustomize needed here)."""
    with (BASE / "kustomization.yaml").open() as f:
        kustomization = yaml.safe_load(f)
    objects: list[Obj] = []
    for name in kustomization["resources"]:
        with (BASE / name).open() as f:
            objects += [d for d in yaml.safe_load_all(f) if d]
    for image in kustomization.get("images", []):
        for obj in objects:
            for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c["image"] == image["name"]:
                    c["image"] = f"{image['newName']}:{image['newTag']}"
    return objects


def create_example(dyn: DynamicClient, directory: Path, namespace: str) -> list[Obj]:
    """Create an example's objects for real in `namespace` (claims before pods).

    For the scheduling tests: apply, then check the pods against ``EXAMPLES[name]``.
    """
    objects = example_objects(directory)
    objects.sort(key=lambda o: o["kind"] == "Pod")
    return [dict(_resource(dyn, o).create(body=o, namespace=namespace).to_dict()) for o in objects]


def by_kind(objects: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objects if o["kind"] in kinds]


# ------------------------------------------------------------------------------------
# Generic API helpers (any kind, through discovery)
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dyn(kube_api: Any) -> DynamicClient:
    return DynamicClient(kube_api)


def _resource(dyn: DynamicClient, obj: Obj) -> Any:
    return dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])


def _namespace_for(dyn: DynamicClient, obj: Obj, namespace: str | None) -> str | None:
    if not _resource(dyn, obj).namespaced:
        return None
    return namespace or obj["metadata"].get("namespace")


def dry_run_create(dyn: DynamicClient, obj: Obj, namespace: str | None = None) -> Obj:
    """Create with dryRun=All: validation and admission run, nothing is stored.

    An object that exists already (another test installed the driver) is checked with a
    dry-run server-side apply instead, which validates the same way.
    """
    res = _resource(dyn, obj)
    ns = _namespace_for(dyn, obj, namespace)
    try:
        return dict(res.create(body=obj, namespace=ns, dry_run="All").to_dict())
    except DynamicApiError as e:
        if e.status != 409:
            raise
    return dict(
        res.server_side_apply(
            body=obj,
            namespace=ns,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            dry_run="All",
        ).to_dict()
    )


def apply(dyn: DynamicClient, obj: Obj) -> bool:
    """Server-side apply; True if the object did not exist before."""
    res = _resource(dyn, obj)
    ns = _namespace_for(dyn, obj, None)
    existed = True
    try:
        res.get(name=obj["metadata"]["name"], namespace=ns)
    except DynamicApiError as e:
        if e.status != 404:
            raise
        existed = False
    res.server_side_apply(body=obj, namespace=ns, field_manager=FIELD_MANAGER, force_conflicts=True)
    return not existed


def delete(dyn: DynamicClient, obj: Obj) -> None:
    res = _resource(dyn, obj)
    with contextlib.suppress(DynamicApiError):
        res.delete(name=obj["metadata"]["name"], namespace=_namespace_for(dyn, obj, None))


def error_text(e: DynamicApiError | ApiException) -> str:
    body = getattr(e, "body", None) or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        return str(json.loads(body).get("message", body))
    except ValueError:
        return str(body or e)


# ------------------------------------------------------------------------------------
# Manifests and examples are accepted
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver_namespace(dyn: DynamicClient) -> Iterator[str]:
    """The driver's namespace, created for real so namespaced objects can be dry-run in it.

    Deleted afterwards only if this module created it.
    """
    (ns,) = by_kind(base_objects(), "Namespace")
    dry_run_create(dyn, ns)  # the Namespace object itself is valid
    created = apply(dyn, ns)
    try:
        yield ns["metadata"]["name"]
    finally:
        if created:
            delete(dyn, ns)


def test_examples_catalogue_complete() -> None:
    assert {p.name for p in example_dirs()} == set(EXAMPLES)


@pytest.mark.parametrize(
    "obj",
    [o for o in base_objects() if o["kind"] != "Namespace"],
    ids=lambda o: f"{o['kind']}/{o['metadata']['name']}",
)
def test_base_object_accepted(dyn: DynamicClient, driver_namespace: str, obj: Obj) -> None:
    stored = dry_run_create(dyn, obj)
    assert stored["kind"] == obj["kind"]
    if obj["kind"] == "DaemonSet":
        # Fields of disabled features are dropped silently: compare what would be stored.
        sent = obj["spec"]["template"]["spec"]
        got = stored["spec"]["template"]["spec"]
        assert got["priorityClassName"] == sent["priorityClassName"]
        assert stored["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxSurge": 1,
            "maxUnavailable": 0,
        }
        assert got["containers"][0]["livenessProbe"]["grpc"]["port"] == 51515
    if obj["kind"] == "DeviceClass":
        assert stored["spec"].get("extendedResourceName") == obj["spec"].get("extendedResourceName")
        assert stored["spec"]["selectors"] == obj["spec"]["selectors"]


@pytest.mark.parametrize("directory", example_dirs(), ids=lambda p: p.name)
def test_example_accepted(
    dyn: DynamicClient, cluster: LocalCluster, kube_api: Any, namespace: str, directory: Path
) -> None:
    expect = EXAMPLES[directory.name]
    for gate in expect.gates:
        if why := cluster.feature_off(gate):
            pytest.skip(f"example {directory.name} needs {gate}: {why}")
    if expect.namespace_labels:
        k.CoreV1Api(kube_api).patch_namespace(
            namespace, {"metadata": {"labels": expect.namespace_labels}}
        )
    for obj in example_objects(directory):
        stored = dry_run_create(dyn, obj, namespace)
        assert stored["metadata"]["namespace"] == namespace
        if obj["kind"] != "Pod":
            # No field of the claim was dropped by a disabled feature.
            spec = obj["spec"] if obj["kind"] == "ResourceClaim" else obj["spec"]["spec"]
            got = stored["spec"] if obj["kind"] == "ResourceClaim" else stored["spec"]["spec"]
            assert got["devices"]["requests"] == _with_defaults(spec["devices"]["requests"])
            assert got["devices"].get("config", []) == _config_defaults(spec["devices"])


def _with_defaults(requests: list[Obj]) -> list[Obj]:
    """Requests as the API server stores them (allocationMode ExactCount, count 1 filled in)."""
    out = []
    for request in json.loads(json.dumps(requests)):
        exact = request.get("exactly")
        if exact is not None:
            exact.setdefault("allocationMode", "ExactCount")
            if exact["allocationMode"] == "ExactCount":
                exact.setdefault("count", 1)
        for sub in request.get("firstAvailable", []):
            sub.setdefault("allocationMode", "ExactCount")
            sub.setdefault("count", 1)
        out.append(request)
    return out


def _config_defaults(devices: Obj) -> list[Obj]:
    return list(devices.get("config", []))


def test_admin_access_needs_namespace_label(dyn: DynamicClient, namespace: str) -> None:
    (template,) = by_kind(example_objects(EXAMPLES_DIR / "admin-access"), "ResourceClaimTemplate")
    with pytest.raises(DynamicApiError) as info:
        dry_run_create(dyn, template, namespace)
    assert info.value.status in (403, 422)
    assert ADMIN_ACCESS_LABEL in error_text(info.value)


# ------------------------------------------------------------------------------------
# The admission policy
# ------------------------------------------------------------------------------------


def _slice(name: str, node: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.dra.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def _as_driver(node: str | None) -> dict[str, str]:
    headers = {"Impersonate-User": DRIVER_USER}
    if node is not None:
        headers["Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F")] = node
    return headers


@pytest.fixture(scope="module")
def policy_installed(dyn: DynamicClient) -> Iterator[None]:
    """The driver's namespace, ServiceAccount, RBAC and admission policy, applied for real.

    Only objects this fixture created are deleted afterwards.
    """
    objects = by_kind(
        base_objects(),
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    created = [o for o in objects if apply(dyn, o)]
    try:
        yield
    finally:
        for obj in reversed(created):
            delete(dyn, obj)


def _create_as(dyn: DynamicClient, obj: Obj, node: str | None, dry_run: bool = True) -> None:
    res = _resource(dyn, obj)
    kwargs: dict[str, Any] = {"header_params": _as_driver(node)}
    if dry_run:
        kwargs["dry_run"] = "All"
    res.create(body=obj, **kwargs)


def _denied(call: Callable[[], Any]) -> str | None:
    """The policy's denial message, or None if the call went through."""
    try:
        call()
    except DynamicApiError as e:
        if e.status == 403 and "ValidatingAdmissionPolicy" in error_text(e):
            return error_text(e)
        raise
    return None


def _wait_policy_active(dyn: DynamicClient, unique: str, timeout: float = 30.0) -> None:
    """Policies and bindings reach the admission plugin through informers: wait for it."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if _denied(lambda: _create_as(dyn, _slice(unique, "node-b"), "node-a")):
                return
        except DynamicApiError as e:  # RBAC not yet visible either
            last = e
        time.sleep(0.25)
    pytest.fail(f"admission policy not active after {timeout:.0f}s (last error: {last})")


def test_policy_type_checks(
    dyn: DynamicClient, cluster: LocalCluster, policy_installed: None
) -> None:
    """The API server finds no type errors in the policy's CEL (status.typeChecking)."""
    if "validatingadmissionpolicy-status-controller" not in cluster.controllers:
        pytest.skip(
            "kube-controller-manager runs without validatingadmissionpolicy-status-controller,"
            " which writes the policy's type-checking status"
        )
    policy, _ = slice_policy(base_objects())
    res = _resource(dyn, policy)
    deadline = time.monotonic() + 30
    while True:
        stored = res.get(name=policy["metadata"]["name"]).to_dict()
        status = stored.get("status") or {}
        if status.get("observedGeneration") == stored["metadata"]["generation"]:
            break
        assert time.monotonic() < deadline, "policy status never observed"
        time.sleep(0.25)
    warnings = (status.get("typeChecking") or {}).get("expressionWarnings") or []
    assert warnings == []


def _bumped(res: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """The stored slice ``obj`` names, read as the admin, with its pool generation bumped."""
    stored: dict[str, Any] = res.get(name=obj["metadata"]["name"]).to_dict()
    stored["spec"]["pool"]["generation"] += 1
    return stored


def test_policy_confines_driver_to_its_node(
    dyn: DynamicClient, policy_installed: None, unique_name: Callable[[str], str]
) -> None:
    _wait_policy_active(dyn, unique_name("slice"))

    # Its own node: allowed (dry run, and for real so update and delete can be checked).
    own = _slice(unique_name("slice"), "node-a")
    assert _denied(lambda: _create_as(dyn, own, "node-a")) is None
    _create_as(dyn, own, "node-a", dry_run=False)
    res = _resource(dyn, own)
    try:
        # An update as the agent makes it (a PUT: the driver's role has no patch).
        res.replace(body=_bumped(res, own), header_params=_as_driver("node-a"))
        res.delete(name=own["metadata"]["name"], header_params=_as_driver("node-a"))
    finally:
        with contextlib.suppress(DynamicApiError):
            res.delete(name=own["metadata"]["name"])

    # Another node: denied, with the node names in the message.
    other = _slice(unique_name("slice"), "node-b")
    message = _denied(lambda: _create_as(dyn, other, "node-a"))
    assert message and POLICY_MESSAGE in message and '"node-b"' in message

    # A token without a node claim: denied.
    message = _denied(lambda: _create_as(dyn, other, None))
    assert message and "bound to a pod on a node" in message

    # Updating or deleting another node's slice (created by the admin): denied.
    res.create(body=other)
    try:
        message = _denied(
            lambda: res.replace(body=_bumped(res, other), header_params=_as_driver("node-a"))
        )
        assert message and POLICY_MESSAGE in message
        message = _denied(
            lambda: res.delete(name=other["metadata"]["name"], header_params=_as_driver("node-a"))
        )
        assert message and POLICY_MESSAGE in message
    finally:
        res.delete(name=other["metadata"]["name"])


def test_policy_rejects_pool_and_driver_spoofing(
    dyn: DynamicClient, policy_installed: None, unique_name: Callable[[str], str]
) -> None:
    _wait_policy_active(dyn, unique_name("slice"))
    # The legitimate slice: its node, its pool, the driver's name.
    assert (
        _denied(lambda: _create_as(dyn, _slice(unique_name("slice"), "node-a"), "node-a")) is None
    )

    # Its node but another node's pool (a higher generation would hide node-b's GPUs).
    spoofed_pool = _slice(unique_name("slice"), "node-a")
    spoofed_pool["spec"]["pool"]["name"] = "node-b"
    spoofed_pool["spec"]["pool"]["generation"] = 99
    message = _denied(lambda: _create_as(dyn, spoofed_pool, "node-a"))
    assert message and 'not of pool "node-b"' in message

    # Its node and pool, another driver's name.
    spoofed_driver = _slice(unique_name("slice"), "node-a")
    spoofed_driver["spec"]["driver"] = "other.vendor.com"
    message = _denied(lambda: _create_as(dyn, spoofed_driver, "node-a"))
    assert message and 'not of driver "other.vendor.com"' in message

    # (Moving an own slice into another pool or driver by update needs no policy: the API
    # server keeps spec.pool.name and spec.driver immutable.)


def test_policy_leaves_other_users_alone(
    dyn: DynamicClient, policy_installed: None, unique_name: Callable[[str], str]
) -> None:
    _wait_policy_active(dyn, unique_name("slice"))
    # The admin writes slices of any node.
    dry_run_create(dyn, _slice(unique_name("slice"), "node-b"))
    # Another service account with the same RBAC and a node claim is not matched by the
    # policy (the RBAC grant is for the driver's account only, so bind it for this check).
    other_user = "system:serviceaccount:default:someone-else"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": unique_name("e2e-other-slices")},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "dra-driver",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "someone-else", "namespace": "default"}],
    }
    apply(dyn, binding)
    try:
        obj = _slice(unique_name("slice"), "node-b")
        headers = {
            "Impersonate-User": other_user,
            "Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F"): "node-a",
        }
        deadline = time.monotonic() + 30
        while True:
            try:
                _resource(dyn, obj).create(body=obj, dry_run="All", header_params=headers)
                break
            except DynamicApiError as e:
                # 403 from RBAC until the binding is visible; never the policy's denial.
                assert "ValidatingAdmissionPolicy" not in error_text(e), error_text(e)
                assert time.monotonic() < deadline, error_text(e)
                time.sleep(0.25)
    finally:
        delete(dyn, binding)


# ------------------------------------------------------------------------------------
# What the Helm chart renders, with every option on, passes strict validation
# ------------------------------------------------------------------------------------


def chart_values() -> dict[str, str]:
    """The administrators' values and every optional object turned on."""
    from tests.unit.test_helm_chart import ADMIN_VALUES

    return {
        **ADMIN_VALUES,
        "createNamespace": "false",
        "priorityClassName": "system-node-critical",
        "metrics.serviceMonitor.enabled": "true",
        "extendedResource.enabled": "true",
        "extendedResource.acknowledgeNoDevicePlugin": "true",
        "driverName": "e2e.gpu.example.com",
    }


def _strict_dry_run(dyn: DynamicClient, obj: Obj, namespace: str | None) -> Obj:
    """POST with dryRun=All and fieldValidation=Strict: an unknown or duplicate field fails."""
    path = _resource(dyn, obj).path(namespace=_namespace_for(dyn, obj, namespace))
    data = dyn.request("post", f"{path}?dryRun=All&fieldValidation=Strict", body=obj)
    return dict(data.to_dict())


def test_chart_objects_pass_strict_validation(dyn: DynamicClient, namespace: str) -> None:
    from tests.unit.test_helm_chart import template

    rendered = template("e2e", "--namespace", namespace, **chart_values())
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "ServiceAccount", "ClusterRole", "DeviceClass", "Service"} <= kinds
    checked = 0
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            continue  # the Prometheus Operator's CRD is not installed here
        try:
            stored = _strict_dry_run(dyn, obj, namespace)
        except DynamicApiError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {error_text(e)}")
        assert stored["metadata"]["name"] == obj["metadata"]["name"]
        checked += 1
    assert checked == len(objects) - 1
    # Strict validation is really on: an unknown field in the pod spec is an error.
    (ds,) = by_kind(objects, "DaemonSet")
    ds["spec"]["template"]["spec"]["nodeSelektor"] = {}
    with pytest.raises(DynamicApiError) as info:
        _strict_dry_run(dyn, ds, namespace)
    assert 'unknown field "spec.template.spec.nodeSelektor"' in error_text(info.value)


# ------------------------------------------------------------------------------------
# With ComputeDomains: the agent may change only its own Node's two labels
# ------------------------------------------------------------------------------------

COMPONENT = ROOT / "manifests" / "components" / "compute-domains"
DOMAIN_LABEL = "gpu.dra.dev/computeDomain"
CLIQUE_LABEL = "nvidia.com/gpu.clique"


def _node(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"team": "a"}, "annotations": {"note": "x"}},
    }


@pytest.fixture(scope="module")
def node_policy(dyn: DynamicClient, unique_name_module: str) -> Iterator[tuple[str, str]]:
    """The component's Node policy, two Nodes, and the driver's right to patch Nodes (which
    the component grants its ClusterRole); yields the two node names."""
    with (COMPONENT / "node-policy.yaml").open() as f:
        policy = [d for d in yaml.safe_load_all(f) if d]
    a, b = f"{unique_name_module}-a", f"{unique_name_module}-b"
    rights = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{unique_name_module}-patch-nodes"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{unique_name_module}-patch-nodes"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{unique_name_module}-patch-nodes",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "dra-driver", "namespace": "dra-driver"}
            ],
        },
    ]
    objects = [*policy, *rights, _node(a), _node(b)]
    created = [o for o in objects if apply(dyn, o)]
    try:
        yield a, b
    finally:
        for obj in reversed(created):
            delete(dyn, obj)


@pytest.fixture(scope="module")
def unique_name_module() -> str:
    return f"e2e-node-policy-{int(time.time() * 1000) % 10**8}"


def _patch_node_as(dyn: DynamicClient, name: str, patch: Obj, node: str | None) -> str | None:
    """Merge-patch Node ``name`` as the driver on ``node`` (dry run); the denial or None."""
    res = dyn.resources.get(api_version="v1", kind="Node")
    return _denied(
        lambda: res.patch(
            body=patch,
            name=name,
            content_type="application/merge-patch+json",
            header_params=_as_driver(node),
            dry_run="All",
        )
    )


def test_node_policy_confines_the_agent_to_its_nodes_two_labels(
    dyn: DynamicClient, node_policy: tuple[str, str]
) -> None:
    own, other = node_policy
    join = {"metadata": {"labels": {DOMAIN_LABEL: "6d1c7e3a-uid", CLIQUE_LABEL: "c.1"}}}
    deadline = time.monotonic() + 30
    while _patch_node_as(dyn, other, join, own) is None:  # the policy reaches admission
        assert time.monotonic() < deadline, "node policy not active after 30 s"
        time.sleep(0.25)

    # Its own node: the domain and clique labels, on and off.
    assert _patch_node_as(dyn, own, join, own) is None
    res = dyn.resources.get(api_version="v1", kind="Node")
    res.patch(
        body=join,
        name=own,
        content_type="application/merge-patch+json",
        header_params=_as_driver(own),
    )
    leave = {"metadata": {"labels": {DOMAIN_LABEL: None}}}
    assert _patch_node_as(dyn, own, leave, own) is None

    # Another node, even the same labels: denied, naming both nodes.
    message = _patch_node_as(dyn, other, join, own)
    assert message and f'may only change that Node, not node "{other}"' in message
    assert f"on node {own}" in message

    # Its own node, anything else: denied.
    for patch, said in (
        ({"metadata": {"labels": {"team": "b"}}}, "may only change the labels"),
        ({"metadata": {"labels": {"team": None}}}, "may only change the labels"),
        ({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, "labels"),
        ({"metadata": {"annotations": {"note": "y"}}}, "annotations or spec"),
        ({"spec": {"unschedulable": True}}, "annotations or spec"),
        (
            {"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}},
            "annotations or spec",
        ),
    ):
        message = _patch_node_as(dyn, own, patch, own)
        assert message and said in message, (patch, message)

    # A token that is not bound to a pod on a node: denied.
    message = _patch_node_as(dyn, own, join, None)
    assert message and "token bound to a pod on a node" in message
