"""The opaque-config admission policy (manifests/base/opaque-config-policy.yaml) against the
real API server.

- The API server accepts the policy (it compiles every expression) and its binding.
- Every invalid config of tests/unit/test_admission_policy.py's table (which includes the
  tables of tests/unit/gpu/test_config.py) is refused when a ResourceClaim or a
  ResourceClaimTemplate is created, with a message naming the field the agent names; the few
  the API server refuses before admission (not an object, too large) are refused all the same.
- Every valid config, and every ResourceClaim and ResourceClaimTemplate under examples/, is
  admitted.
- Admission latency: creating claims with and without the policy (printed, not asserted).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from devenv.localcluster import LocalCluster
from tests.unit import test_admission_policy as unit

pytestmark = pytest.mark.e2e

POLICY_FILE = unit.gen.KUSTOMIZE_FILE
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
LATENCY_CLAIMS = 200

Obj = dict[str, Any]


def _objects() -> tuple[Obj, Obj]:
    policy, binding = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    return policy, binding


class Api:
    """Plain JSON calls through the admin client (its typed models may lag the server)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> tuple[int, Any]:
        from kubernetes.client.exceptions import ApiException

        request = self.client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(*request, _request_timeout=60)
            resp.read()
        except ApiException as e:
            try:
                return int(e.status), json.loads(e.body)
            except (TypeError, ValueError):
                return int(e.status), {"message": str(e.body)}
        data = resp.data
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, {"message": data.decode(errors="replace")}


ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def _install(api: Api) -> None:
    policy, binding = _objects()
    for plural, obj in (
        ("validatingadmissionpolicies", policy),
        ("validatingadmissionpolicybindings", binding),
    ):
        status, body = api.call("POST", f"{ADMISSION}/{plural}", obj)
        if status == 409:
            status, body = api.call(
                "PUT",
                f"{ADMISSION}/{plural}/{obj['metadata']['name']}",
                _with_version(api, plural, obj),
            )
        assert status in (200, 201), body


def _with_version(api: Api, plural: str, obj: Obj) -> Obj:
    _, current = api.call("GET", f"{ADMISSION}/{plural}/{obj['metadata']['name']}")
    return {
        **obj,
        "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
    }


def _uninstall(api: Api) -> None:
    policy, binding = _objects()
    for plural, obj in (
        ("validatingadmissionpolicybindings", binding),
        ("validatingadmissionpolicies", policy),
    ):
        status, body = api.call("DELETE", f"{ADMISSION}/{plural}/{obj['metadata']['name']}")
        assert status in (200, 202, 404), body


def claim_body(params: Any, name: str, driver: str = unit.DRIVER) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        **unit.claim(params, driver),
    }


def template_body(params: Any, name: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        **unit.template(params),
    }


def _create(api: Api, namespace: str, obj: Obj, dry_run: bool = False) -> tuple[int, Any]:
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[
        obj["kind"]
    ]
    query = [("dryRun", "All")] if dry_run else []
    return api.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/{plural}", obj, query)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _policy_active(api: Api, namespace: str) -> bool:
    status, body = _create(
        api,
        namespace,
        claim_body(unit._mps(defaultActiveThreadPercentage=500), _name("probe")),
        dry_run=True,
    )
    return status == 422 and "ValidatingAdmissionPolicy" in body.get("message", "")


def _policy_inactive(api: Api, namespace: str) -> bool:
    status, _ = _create(
        api,
        namespace,
        claim_body(unit._mps(defaultActiveThreadPercentage=500), _name("probe")),
        dry_run=True,
    )
    return status == 201


def _wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def api(kube_api: Any) -> Api:
    return Api(kube_api)


@pytest.fixture(scope="module")
def ns(api: Api, cluster: LocalCluster) -> Iterator[str]:
    """A namespace for the module (labelled for the admin-access example)."""
    name = _name("e2e-opaque-policy")
    status, body = api.call(
        "POST",
        "/api/v1/namespaces",
        {"metadata": {"name": name, "labels": {"e2e": "true", ADMIN_ACCESS_LABEL: "true"}}},
    )
    assert status == 201, body
    try:
        yield name
    finally:
        api.call("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="module")
def installed(api: Api, ns: str) -> Iterator[None]:
    _install(api)
    _wait(lambda: _policy_active(api, ns), "the policy to take effect")
    try:
        yield
    finally:
        _uninstall(api)


def test_policy_is_accepted_and_type_checks(
    api: Api, installed: None, cluster: LocalCluster
) -> None:
    policy, _ = _objects()
    name = policy["metadata"]["name"]
    deadline = time.monotonic() + 30
    while True:
        _, stored = api.call("GET", f"{ADMISSION}/validatingadmissionpolicies/{name}")
        status = stored.get("status") or {}
        if status.get("observedGeneration") == stored["metadata"]["generation"]:
            break
        if time.monotonic() > deadline:
            pytest.skip("no validatingadmissionpolicy-status-controller wrote the policy's status")
        time.sleep(0.25)
    warnings = (status.get("typeChecking") or {}).get("expressionWarnings") or []
    for w in warnings:
        print(f"type-checking warning at {w['fieldRef']}: {w['warning'][:300]}")
    assert warnings == []


@pytest.mark.parametrize("params", unit.INVALID, ids=unit._id)
def test_invalid_configs_are_refused(api: Api, ns: str, installed: None, params: Any) -> None:
    agent = unit.agent_error(params)
    assert agent is not None
    for obj in (claim_body(params, _name("bad")), template_body(params, _name("bad"))):
        status, body = _create(api, ns, obj)
        message = body.get("message", "")
        assert status >= 400, f"{obj['kind']} created, but the agent says: {agent}"
        if unit.api_server_refuses(params):
            assert status in (413, 422), body  # API validation, before admission
            print(f"\n{obj['kind']}: refused by API validation ({status}): {message[:200]}")
            continue
        assert (
            status == 422 and "ValidatingAdmissionPolicy 'dra-driver-opaque-config'" in message
        ), body
        path = (
            "spec.spec.devices.config"
            if obj["kind"] == "ResourceClaimTemplate"
            else "spec.devices.config"
        )
        assert f"{path}[1].opaque.parameters (config for gpu): " in message, message
        assert unit._field_named(agent) in message, (message, agent)
        print(f"\n{obj['kind']}: {message}")


@pytest.mark.parametrize("params", unit.VALID, ids=unit._id)
def test_valid_configs_are_admitted(api: Api, ns: str, installed: None, params: Any) -> None:
    for obj in (claim_body(params, _name("ok")), template_body(params, _name("ok"))):
        status, body = _create(api, ns, obj, dry_run=True)
        assert status == 201, body


def _example_objects() -> list[Obj]:
    found = []
    for path in sorted((unit.ROOT / "examples").rglob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
                found.append(obj)
    return found


EXAMPLE_OBJECTS = _example_objects()


@pytest.mark.parametrize(
    "obj", EXAMPLE_OBJECTS, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}"
)
def test_examples_are_admitted(api: Api, ns: str, installed: None, obj: Obj) -> None:
    body = {**obj, "metadata": {**obj["metadata"]}}
    body["metadata"].pop("namespace", None)
    status, response = _create(api, ns, body, dry_run=True)
    assert status == 201, response


def test_configs_of_other_drivers_pass(api: Api, ns: str, installed: None) -> None:
    status, body = _create(
        api, ns, claim_body({"sharng": 1}, _name("other"), driver="other.example.com")
    )
    assert status == 201, body


def _measure(api: Api, namespace: str, count: int, params: Any) -> list[float]:
    took = []
    for _ in range(count):
        obj = claim_body(params, _name("lat"))
        t0 = time.perf_counter()
        status, body = _create(api, namespace, obj)
        took.append(time.perf_counter() - t0)
        assert status == 201, body
    return took


def _summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(0.95 * (len(ordered) - 1))] * 1000


def test_admission_latency(api: Api, ns: str, installed: None) -> None:
    """Create LATENCY_CLAIMS claims (each with a valid MPS config for the driver and one for
    another driver) without and with the policy; print median and p95."""
    params = unit._mps(
        defaultActiveThreadPercentage=50,
        defaultPinnedDeviceMemoryLimit="10Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "5Gi"},
    )
    rounds: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for _ in range(2):  # alternate, so drift of the machine hits both alike
            _uninstall(api)
            _wait(lambda: _policy_inactive(api, ns), "the policy to be gone")
            _measure(api, ns, 10, params)  # warm-up
            rounds["without"] += _measure(api, ns, LATENCY_CLAIMS // 2, params)
            _install(api)
            _wait(lambda: _policy_active(api, ns), "the policy to take effect")
            _measure(api, ns, 10, params)
            rounds["with"] += _measure(api, ns, LATENCY_CLAIMS // 2, params)
    finally:
        _install(api)
    without, with_policy = _summary(rounds["without"]), _summary(rounds["with"])
    print(
        f"\nadmission latency, {LATENCY_CLAIMS} ResourceClaim creates each: "
        f"without policy median {without[0]:.2f} ms p95 {without[1]:.2f} ms; "
        f"with policy median {with_policy[0]:.2f} ms p95 {with_policy[1]:.2f} ms; "
        f"difference median {with_policy[0] - without[0]:+.2f} ms p95 {with_policy[1] - without[1]:+.2f} ms"
    )
    assert with_policy[0] < without[0] + 250  # generous: a sanity bound, not a benchmark


def _nvidia_objects() -> tuple[Obj, Obj]:
    """The same policy installed as the NVIDIA driver (compat mode), under its own name."""
    text = POLICY_FILE.read_text().replace(f'"{unit.DRIVER}"', f'"{unit.NVIDIA}"', 1)
    policy, binding = [d for d in yaml.safe_load_all(text) if d]
    name = policy["metadata"]["name"] + "-nvidia"
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    return policy, binding


NVIDIA_CASES = [
    # (mpsConfig, refused naming this field or None)
    ({"defaultActiveThreadPercentage": 0, "multiUser": True}, None),
    ({"defaultPinnedDeviceMemoryLimit": "8Ti"}, None),
    ({"defaultActiveThreadPercentage": 101}, "sharing.mpsConfig.defaultActiveThreadPercentage"),
    ({"multiUser": "yes"}, "sharing.mpsConfig.multiUser"),
    ({"multiuser": True}, "sharing.mpsConfig"),
]


def test_in_compat_mode_the_nvidia_config_api_is_checked(
    api: Api, ns: str, installed: None
) -> None:
    objects = _nvidia_objects()
    for plural, obj in zip(
        ("validatingadmissionpolicies", "validatingadmissionpolicybindings"), objects, strict=True
    ):
        status, body = api.call("POST", f"{ADMISSION}/{plural}", obj)
        assert status in (200, 201), body
    bad = {"apiVersion": unit.NVIDIA_API, "kind": "GpuConfig", "sharing": {"strategy": "Nope"}}
    try:
        _wait(
            lambda: _create(api, ns, claim_body(bad, _name("probe"), unit.NVIDIA), True)[0] == 422,
            "the compat policy to take effect",
        )
        for mps, field in NVIDIA_CASES:
            params = {
                "apiVersion": unit.NVIDIA_API,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": mps},
            }
            assert (unit.agent_error(params, unit.config_apis("nvidia")) is None) is (field is None)
            status, body = _create(api, ns, claim_body(params, _name("nv"), unit.NVIDIA), True)
            if field is None:
                assert status == 201, body
            else:
                assert status == 422 and f"field '{field}" in body.get("message", ""), body
        # Under our own name the NVIDIA API is not ours to accept.
        status, body = _create(api, ns, claim_body(params, _name("nv")), True)
        assert status == 422 and "is not 'gpu.dra.dev/v1alpha1'" in body["message"], body
    finally:
        for plural, obj in (
            ("validatingadmissionpolicybindings", objects[1]),
            ("validatingadmissionpolicies", objects[0]),
        ):
            api.call("DELETE", f"{ADMISSION}/{plural}/{obj['metadata']['name']}")
