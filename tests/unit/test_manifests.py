"""Static checks of the install manifests, the Helm chart and the examples.

Everything here runs without a cluster. The helm, kustomize and hadolint checks use the
pinned binaries that ``make tools`` builds once into ``.cache/tools/bin`` (or
``$DRA_TOOLS_BIN``); without them they are skipped, saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.gpu.config import parse_config
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
CHART = ROOT / "deployments" / "helm" / "dra-driver"
EXAMPLES = ROOT / "examples"
TOOLS_BIN = Path(os.environ.get("DRA_TOOLS_BIN") or ROOT / ".cache" / "tools" / "bin")

DRIVER = "gpu.dra.dev"
SERVICE_ACCOUNT_USER = "system:serviceaccount:dra-driver:dra-driver"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
DEMO_PROFILES = ("dgx-h100", "mixed")

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------


def load_docs(path: Path) -> list[Obj]:
    """The non-empty YAML documents of a file."""
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml"))


def key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


def base_objects() -> dict[tuple[str, str, str, str], Obj]:
    """The kustomize base's resources as written (before images are substituted)."""
    kustomization = load_docs(BASE / "kustomization.yaml")[0]
    objects: dict[tuple[str, str, str, str], Obj] = {}
    for name in kustomization["resources"]:
        for obj in load_docs(BASE / name):
            assert key(obj) not in objects, f"{key(obj)} defined twice"
            objects[key(obj)] = obj
    return objects


def one(kind: str) -> Obj:
    found = [o for o in base_objects().values() if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def example_dirs() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


def example_objects(directory: Path) -> list[Obj]:
    return [obj for path in yaml_files(directory) for obj in load_docs(path)]


@cache
def published_names() -> tuple[frozenset[str], frozenset[str]]:
    """Attribute and capacity names (qualified or in the driver's domain) of the demo nodes."""
    attributes: set[str] = set()
    capacities: set[str] = set()
    for profile in DEMO_PROFILES:
        inventory = SimulatedDiscovery(profile, "n1").discover()
        for device in build_catalog(inventory).published():
            attributes.update(device.get("attributes", {}))
            capacities.update(device.get("capacity", {}))
    return frozenset(attributes), frozenset(capacities)


def qualified(name: str) -> str:
    return name if "/" in name else f"{DRIVER}/{name}"


def claim_specs(obj: Obj) -> Iterator[Obj]:
    """The ResourceClaim spec inside a ResourceClaim or ResourceClaimTemplate."""
    if obj["kind"] == "ResourceClaim":
        yield obj["spec"]
    elif obj["kind"] == "ResourceClaimTemplate":
        yield obj["spec"]["spec"]


def request_entries(spec: Obj) -> Iterator[Obj]:
    """Every exact request and firstAvailable subrequest of a claim spec."""
    for request in spec["devices"]["requests"]:
        if "exactly" in request:
            yield request["exactly"]
        yield from request.get("firstAvailable", [])


# ------------------------------------------------------------------------------------
# every YAML parses
# ------------------------------------------------------------------------------------


ALL_YAML = (
    yaml_files(MANIFESTS)
    + yaml_files(EXAMPLES)
    + [CHART / "Chart.yaml", CHART / "values.yaml"]  # templates/ is not YAML before rendering
)


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path} has no YAML documents"
    for doc in docs:
        assert isinstance(doc, dict)
        if path.name in ("kustomization.yaml", "values.yaml"):
            continue
        if path.name == "Chart.yaml":
            assert doc["apiVersion"] == "v2" and doc["name"] == "dra-driver"
            continue
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: apiVersion/kind missing"
        assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} has no name"


def test_kustomization_lists_every_file() -> None:
    listed = set(load_docs(BASE / "kustomization.yaml")[0]["resources"])
    present = {p.name for p in yaml_files(BASE)} - {"kustomization.yaml"}
    assert listed == present


def test_image_set_in_one_place() -> None:
    kustomization = load_docs(BASE / "kustomization.yaml")[0]
    (image,) = kustomization["images"]
    container = one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image["name"]
    values = load_docs(CHART / "values.yaml")[0]
    assert values["image"]["repository"] == image["newName"]
    assert values["image"]["tag"] == image["newTag"]


# ------------------------------------------------------------------------------------
# RBAC and admission policy
# ------------------------------------------------------------------------------------


def test_rbac_least_privilege() -> None:
    rules = {
        (rule["apiGroups"][0], resource): set(rule["verbs"])
        for rule in one("ClusterRole")["rules"]
        for resource in rule["resources"]
    }
    assert rules == {
        # What the agent requests, no more (resourceslice/rawapi.py, events.py).
        ("resource.k8s.io", "resourceslices"): {"create", "list", "watch", "update", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
        ("resource.k8s.io", "resourceclaims/status"): {"update", "patch"},
        # status.devices of this driver only, on claims allocated on the agent's own node.
        ("resource.k8s.io", "resourceclaims/driver"): {
            "associated-node:patch",
            "associated-node:update",
        },
        ("", "nodes"): {"get"},
        ("", "events"): {"create"},
    }
    (driver_rule,) = [
        r for r in one("ClusterRole")["rules"] if "resourceclaims/driver" in r["resources"]
    ]
    assert driver_rule["resourceNames"] == ["gpu.dra.dev"]
    for rule in one("ClusterRole")["rules"]:
        assert len(rule["apiGroups"]) == 1
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
    binding = one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one("ClusterRole")["metadata"]["name"]
    sa = one("ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


def test_rbac_rules_are_commented() -> None:
    role = (BASE / "rbac.yaml").read_text().split("\n---\n")[0].splitlines()
    rules = [i for i, line in enumerate(role) if line.strip().startswith("- apiGroups:")]
    assert len(rules) == len(one("ClusterRole")["rules"])
    for i in rules:
        assert role[i - 1].strip().startswith("#"), f"rbac.yaml:{i + 1}: rule without comment"


def slice_policy(objects: Iterable[Obj]) -> tuple[Obj, Obj]:
    """The policy that confines slice writes to the agent's node, and its binding (the other
    policy checks opaque configs)."""
    (policy,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-resourceslices")
    ]
    (binding,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
        and o["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    return policy, binding


def test_admission_policy() -> None:
    policy, binding = slice_policy(base_objects().values())
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{SERVICE_ACCOUNT_USER}"'
    sa = one("ServiceAccount")["metadata"]
    assert f"system:serviceaccount:{sa['namespace']}:{sa['name']}" == SERVICE_ACCOUNT_USER
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert NODE_NAME_EXTRA in variables["userNodeName"]
    assert "oldObject.spec.nodeName" in variables["sliceNodeName"]
    assert "object.spec.nodeName" in variables["sliceNodeName"]
    assert policy["spec"]["failurePolicy"] == "Fail"


# ------------------------------------------------------------------------------------
# DaemonSet
# ------------------------------------------------------------------------------------


def _container() -> Obj:
    (container,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


def test_daemonset_downward_api_and_env() -> None:
    env = {e["name"]: e for e in _container()["env"]}
    assert env["DRA_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["DRA_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["DRA_LOG_FORMAT"]["value"] == "json"
    assert env["DRA_DRIVER_NAME"]["value"] == DRIVER
    assert env["DRA_BACKEND"]["value"] == "nvml"
    for e in env.values():
        assert "value" not in e or isinstance(e["value"], str), f"{e['name']}: not a string"


def test_daemonset_env_names_known_settings() -> None:
    """The env vars the agent reads today are spelt like its settings fields."""
    from dra_driver.bindsettings import env_name
    from dra_driver.settings import Settings

    known = {env_name(f) for f in Settings.model_fields}
    env = {e["name"] for e in _container()["env"]}
    assert env <= known, env - known


def test_daemonset_rolling_update() -> None:
    spec = one("DaemonSet")["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_daemonset_scheduling() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]


def test_daemonset_probe_ports_resources() -> None:
    c = _container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["grpc"]["port"] == ports["healthz"]
    assert c["startupProbe"]["grpc"]["port"] == ports["healthz"]
    # The start-up budget covers NVML and the first publication.
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 60
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DRA_HEALTH_PORT"] == str(ports["healthz"])
    assert env["DRA_METRICS_PORT"] == str(ports["metrics"])
    assert c["resources"]["requests"] == {"cpu": "50m", "memory": "96Mi"}
    assert c["resources"]["limits"]["memory"] == "256Mi"
    assert c["securityContext"]["privileged"] is True
    assert c["args"] == ["run"]


def test_daemonset_host_paths() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m for m in _container()["volumeMounts"]}
    assert set(volumes) == set(mounts)
    host_paths = set(volumes.values())
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"} <= (
        host_paths
    )
    assert mounts["driver-root"]["readOnly"] is True
    assert volumes["driver-root"] in ("/", "/run/nvidia/driver")
    # The agent's directories are the host's, at the same paths.
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    for var, volume in (
        ("DRA_PLUGINS_DIR", "plugins"),
        ("DRA_REGISTRY_DIR", "plugins-registry"),
        ("DRA_CDI_ROOT", "cdi"),
    ):
        assert env[var] == mounts[volume]["mountPath"] == volumes[volume]
    assert env["DRA_DRIVER_ROOT"] == mounts["driver-root"]["mountPath"]
    # CDI specs mount driver files from the host's path of the same volume.
    assert env["DRA_HOST_DRIVER_ROOT"] == volumes["driver-root"]


def test_privileges_are_explained() -> None:
    text = (BASE / "daemonset.yaml").read_text()
    before = text.split("privileged: true")[0].splitlines()[-8:]
    assert sum(line.strip().startswith("#") for line in before) >= 5


# ------------------------------------------------------------------------------------
# DeviceClasses
# ------------------------------------------------------------------------------------


def test_device_classes() -> None:
    classes = {
        o["metadata"]["name"]: o for o in base_objects().values() if o["kind"] == "DeviceClass"
    }
    assert set(classes) == {DRIVER, f"mig.{DRIVER}", f"shared.{DRIVER}"}
    for dc in classes.values():
        assert dc["apiVersion"] == "resource.k8s.io/v1"
        for selector in dc["spec"]["selectors"]:
            expression = selector["cel"]["expression"]
            assert isinstance(expression, str) and expression.strip()
            assert f'device.driver == "{DRIVER}"' in expression
    gpu = classes[DRIVER]["spec"]["selectors"][0]["cel"]["expression"]
    assert gpu.endswith(f'device.attributes["{DRIVER}"].type == "gpu"')
    mig = classes[f"mig.{DRIVER}"]["spec"]["selectors"][0]["cel"]["expression"]
    assert mig.endswith(f'device.attributes["{DRIVER}"].type == "mig"')
    shared = classes[f"shared.{DRIVER}"]["spec"]["selectors"][0]["cel"]["expression"]
    assert shared == (
        f'{gpu} && device.allowMultipleAllocations && "compute" in device.capacity["{DRIVER}"]'
    )

    # The extended-resource class is an opt-in component, not part of the base.
    component = MANIFESTS / "components" / "extended-resource"
    (extended,) = load_docs(component / "deviceclass.yaml")
    assert extended["metadata"]["name"] == f"extended.{DRIVER}"
    assert extended["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert extended["spec"]["selectors"] == classes[DRIVER]["spec"]["selectors"]
    assert "device plugin" in (component / "deviceclass.yaml").read_text()


def test_shared_class_leaves_gpus_shared_by_mig_slices_out() -> None:
    """With ``--mig-layout=capacity`` a MIG-capable GPU is published as type ``gpu`` with
    ``allowMultipleAllocations`` too, shared by MIG slices. A ``shared.`` claim that asks for
    no capacity takes the defaults there (all compute and memory slices): the whole GPU,
    held exclusively, where the user asked for a 1Gi MPS share. The class must select the
    GPUs shared by memory (``--shared-gpus``) only; the whole-GPU class still selects both."""
    from dra_driver.cel import Verdict, device_variables, evaluate_expression
    from dra_driver.gpu.publish.catalog import CAPACITY

    classes = {
        o["metadata"]["name"]: o["spec"]["selectors"][0]["cel"]["expression"]
        for o in base_objects().values()
        if o["kind"] == "DeviceClass"
    }
    inventory = SimulatedDiscovery("dgx-h100", "node-1").discover()
    shared = {inventory.gpus[1].uuid}
    devices = build_catalog(inventory, dynamic=True, shared=shared, layout=CAPACITY).published()
    assert devices[0]["capacity"]["computeSlices"] and devices[0]["allowMultipleAllocations"]

    def selected(name: str) -> list[str]:
        out = []
        for device in devices:
            outcome = evaluate_expression(classes[name], device_variables(device, DRIVER))
            assert outcome.verdict is not Verdict.ERROR, outcome.error
            if outcome.verdict is Verdict.MATCH:
                out.append(device["name"])
        return out

    assert selected(f"shared.{DRIVER}") == ["gpu-1"]
    assert selected(DRIVER) == [f"gpu-{i}" for i in range(8)]


# ------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------

WANTED_EXAMPLES = {
    "single-gpu", "gpu-min-memory", "gpu-by-model", "gpu-compute-capability",
    "two-gpus-same-pcie-root", "prioritized-list", "shared-claim", "time-slicing", "mps",
    "mig-1g10gb", "mig-multiple-same-parent", "admin-access", "all-gpus", "selector-typo",
    "shared-gpu-memory",
}  # fmt: skip


def test_examples_present() -> None:
    names = {p.name for p in example_dirs()}
    assert names >= WANTED_EXAMPLES
    for d in example_dirs():
        assert (d / "README.md").is_file(), f"{d.name} has no README.md"
        assert yaml_files(d), f"{d.name} has no YAML"


@pytest.mark.parametrize("directory", example_dirs(), ids=lambda p: p.name)
def test_example_is_consistent(directory: Path) -> None:
    objects = example_objects(directory)
    kinds = {o["kind"] for o in objects}
    assert "Pod" in kinds
    assert kinds <= {"Pod", "ResourceClaim", "ResourceClaimTemplate"}
    for obj in objects:
        assert "namespace" not in obj["metadata"], f"{obj['metadata']['name']}: has a namespace"
        if obj["kind"] != "Pod":
            assert obj["apiVersion"] == "resource.k8s.io/v1"
    templates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceClaimTemplate"}
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceClaim"}
    for pod in (o for o in objects if o["kind"] == "Pod"):
        pod_claims: dict[str, Obj] = {}
        for ref in pod["spec"]["resourceClaims"]:
            if "resourceClaimTemplateName" in ref:
                source = templates[ref["resourceClaimTemplateName"]]
            else:
                source = claims[ref["resourceClaimName"]]
            pod_claims[ref["name"]] = next(claim_specs(source))
        for container in pod["spec"]["containers"]:
            assert container["image"].startswith("registry.k8s.io/pause:")
            for use in container["resources"]["claims"]:
                spec = pod_claims[use["name"]]
                requests = {r["name"] for r in spec["devices"]["requests"]}
                if "request" in use:
                    assert use["request"] in requests


@pytest.mark.parametrize("directory", example_dirs(), ids=lambda p: p.name)
def test_example_selectors_use_published_names(directory: Path) -> None:
    """Attribute and capacity names in selectors exist on the demo nodes' devices."""
    attributes, capacities = published_names()
    used: list[tuple[str, str]] = []
    for obj in example_objects(directory):
        for spec in claim_specs(obj):
            for entry in request_entries(spec):
                assert entry["deviceClassName"] in (DRIVER, f"mig.{DRIVER}", f"shared.{DRIVER}")
                for selector in entry.get("selectors", []):
                    expression = selector["cel"]["expression"]
                    for kind, domain, name in re.findall(
                        r'device\.(attributes|capacity)\["([^"]+)"\]\.(\w+)', expression
                    ):
                        used.append((kind, f"{domain}/{name}"))
            for constraint in spec["devices"].get("constraints", []):
                name = constraint["matchAttribute"]
                assert "/" in name, "matchAttribute needs a fully qualified name"
                used.append(("attributes", name))
    unknown = [
        name
        for kind, name in used
        if name not in {qualified(n) for n in (attributes if kind == "attributes" else capacities)}
    ]
    if directory.name == "selector-typo":
        assert unknown == [f"{DRIVER}/prodcutName"]
    else:
        assert unknown == []


@pytest.mark.parametrize("directory", example_dirs(), ids=lambda p: p.name)
def test_example_opaque_config_is_valid(directory: Path) -> None:
    for obj in example_objects(directory):
        for spec in claim_specs(obj):
            requests = {r["name"] for r in spec["devices"]["requests"]}
            for entry in spec["devices"].get("config", []):
                assert set(entry.get("requests", [])) <= requests
                opaque = entry["opaque"]
                assert opaque["driver"] == DRIVER
                parse_config(opaque["parameters"], where=f"{directory.name}")


# ------------------------------------------------------------------------------------
# helm and kustomize
# ------------------------------------------------------------------------------------


def tool(name: str) -> Path:
    """The pinned tool from ``make tools``; the test is skipped when it has not been built."""
    path = TOOLS_BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"{name} not built: run `make tools` (looked in {TOOLS_BIN})")
    return path


def run(*argv: str | Path) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{proc.stderr}{proc.stdout}"
    return proc.stdout


def by_key(text: str) -> dict[tuple[str, str, str, str], Obj]:
    objects: dict[tuple[str, str, str, str], Obj] = {}
    for obj in yaml.safe_load_all(text):
        if obj:
            assert key(obj) not in objects, f"{key(obj)} rendered twice"
            objects[key(obj)] = obj
    return objects


@pytest.fixture(scope="module")
def kustomize_output() -> str:
    return run(tool("kustomize"), "build", BASE)


def test_kustomize_build(kustomize_output: str) -> None:
    objects = by_key(kustomize_output)
    assert set(objects) == set(base_objects())
    (ds,) = [o for o in objects.values() if o["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/example/dra-driver:v0.1.0"


# Labels only a Helm release carries: the chart's version, the release's name and manager.
RELEASE_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)


def without_release_labels(obj: Obj) -> Obj:
    """``obj`` with the Helm release's labels removed wherever labels or selectors live."""
    if isinstance(obj, dict):
        return {
            k: without_release_labels(v)
            for k, v in obj.items()
            if not (k in RELEASE_LABELS and isinstance(v, str))
        }
    if isinstance(obj, list):
        return [without_release_labels(v) for v in obj]
    return obj


def test_helm_template_equals_kustomize(kustomize_output: str) -> None:
    """Default values, release dra-driver in namespace dra-driver: the kustomize objects."""
    out = run(tool("helm"), "template", "dra-driver", CHART, "--namespace", "dra-driver")
    rendered = by_key(out)
    expected = by_key(kustomize_output)
    assert sorted(rendered) == sorted(expected)
    for k, obj in expected.items():
        # Every rendered object carries the release labels; nothing else differs.
        labels = rendered[k]["metadata"]["labels"]
        assert {name: labels[name] for name in RELEASE_LABELS} == {
            "helm.sh/chart": "dra-driver-0.1.0",
            "app.kubernetes.io/instance": "dra-driver",
            "app.kubernetes.io/version": "v0.1.0",
            "app.kubernetes.io/managed-by": "Helm",
        }
        got = without_release_labels(rendered[k])
        assert got == obj, f"{k} differs between helm template and kustomize build"


def test_kustomize_extended_resource_component(tmp_path: Path) -> None:
    """The opt-in component adds the extended-resource class to the base."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(BASE, tmp_path)],
                "components": [
                    os.path.relpath(MANIFESTS / "components" / "extended-resource", tmp_path)
                ],
            }
        )
    )
    out = run(tool("kustomize"), "build", "--load-restrictor", "LoadRestrictionsNone", tmp_path)
    names = {k[3] for k in by_key(out) if k[1] == "DeviceClass"}
    assert names == {DRIVER, f"shared.{DRIVER}", f"mig.{DRIVER}", f"extended.{DRIVER}"}


def test_dockerfile_lint() -> None:
    out = run(tool("hadolint"), ROOT / "Dockerfile")
    assert out.strip() == ""


def test_dockerignore_keeps_context_small() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!dra_driver/"} <= set(lines)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dra-driver"]' in dockerfile
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for src in copied.split():
            assert f"!{src.rstrip('/')}" in {line.rstrip("/") for line in lines}, src


def test_image_ships_the_bytecode_of_the_level_it_runs_at() -> None:
    """The image writes no bytecode at run time; without the optimized bytecode built in,
    every start of the agent would compile each module it imports again."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    level = re.search(r"\bPYTHONOPTIMIZE=(\d)", dockerfile)
    assert level is not None and "PYTHONDONTWRITEBYTECODE=1" in dockerfile
    compiled = re.search(r"compileall (.*)\\\n\s*(.*stdlib.*)\\\n\s*(.*purelib.*)", dockerfile)
    assert compiled is not None and f"-o {level[1]} " in compiled[1]


def test_license_file_matches_the_declared_license() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not the old table
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_image_build_script_defaults_match_the_chart() -> None:
    """hack/build-image.sh builds what the chart runs by default, for amd64 and arm64."""
    script = (ROOT / "hack" / "build-image.sh").read_text()
    chart = load_docs(CHART / "Chart.yaml")[0]
    values = load_docs(CHART / "values.yaml")[0]
    assert f"IMAGE=${{IMAGE:-{values['image']['repository']}}}" in script
    assert "TAG=${TAG:-v${version}}" in script and chart["appVersion"] == "v0.1.0"
    assert "PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}" in script
    assert os.access(ROOT / "hack" / "build-image.sh", os.X_OK)
    proc = subprocess.run(["bash", "-n", str(ROOT / "hack" / "build-image.sh")], check=False)
    assert proc.returncode == 0
