"""ComputeDomains in the Helm chart (computeDomains.enabled) and the kustomize component.

``helm template`` and ``kustomize build`` from ``make tools`` (skipped without them):

- off by default, and then nothing of it renders: the output is the same as without the
  value at all;
- on, in each mode (the driver's own API group, or the NVIDIA driver's with compat: nvidia):
  the CRD ``crd()`` makes, the IMEX DeviceClasses (names from ``ApiNames``, selectors that
  pick exactly the device of their kind among those the node publishes), the controller
  Deployment whose environment the controller's own command accepts, the IMEX daemons'
  ServiceAccount under the name the controller gives its daemons, and the node container;
- RBAC: the controller is run against a recording API client, and every request it makes
  (listing, watching, leader election, each action the planner can take) is allowed by the
  roles the chart binds to its ServiceAccount, in the namespace where it makes it;
- the kustomize component renders the same objects as the chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import pytest
import yaml

from dra_driver.bindsettings import env_name
from dra_driver.computedomain import planner
from dra_driver.computedomain.api import NVIDIA, OWN, ApiNames, read_domain
from dra_driver.computedomain.controller import DomainController, run_controller
from dra_driver.computedomain.crd import crd
from dra_driver.computedomain.launch import daemon_settings
from dra_driver.computedomain.objects import (
    DaemonSettings,
    daemon_name,
    daemon_set,
    daemon_template,
    workload_template,
)
from dra_driver.kube import APPLY_PATCH, Response
from dra_driver.settings import Settings
from tests.unit.test_helm_chart import kind, render, template
from tests.unit.test_manifests import (
    BASE,
    MANIFESTS,
    Obj,
    by_key,
    run,
    tool,
    without_release_labels,
)

COMPONENT = MANIFESTS / "components" / "compute-domains"
MODES = {"own": ("", OWN), "nvidia": ("nvidia", NVIDIA)}
NAMESPACE = "gpu-ops"


def enabled(mode: str, **values: Any) -> dict[Any, Obj]:
    compat, _ = MODES[mode]
    extra = {"compat": compat} if compat else {}
    return render(
        "dra-driver",
        "--namespace",
        NAMESPACE,
        **{"computeDomains.enabled": "true"},
        **extra,
        **values,
    )


def one(objects: dict[Any, Obj], kind_name: str, name: str) -> Obj:
    (found,) = [o for o in kind(objects, kind_name) if o["metadata"]["name"] == name]
    return found


def containers(objects: dict[Any, Obj]) -> dict[str, Obj]:
    (ds,) = kind(objects, "DaemonSet")
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


def controller(objects: dict[Any, Obj]) -> Obj:
    (deployment,) = kind(objects, "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(c)


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container["env"]}


# ------------------------------------------------------------------------------------
# off by default
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", ["", "nvidia"])
def test_off_by_default_renders_nothing_of_it(compat: str) -> None:
    extra = {"compat": compat} if compat else {}
    default = template("dra-driver", **extra)
    # The other settings of the feature do nothing while it is off.
    off = template(
        "dra-driver",
        **extra,
        **{
            "computeDomains.enabled": "false",
            "computeDomains.bindingConditions": "true",
            "computeDomains.controller.replicas": "3",
        },
    )
    assert off == default
    assert "compute-domain" not in default and "imex" not in default.lower()
    objects = by_key(default)
    assert not {"CustomResourceDefinition", "Deployment", "Role"} & {
        o["kind"] for o in objects.values()
    }
    assert list(containers(objects)) == ["plugin"]
    (role,) = kind(objects, "ClusterRole")
    assert not [r for r in role["rules"] if "computedomains" in r["resources"]]


# ------------------------------------------------------------------------------------
# what each mode installs
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_crd_of_the_mode(mode: str) -> None:
    _, names = MODES[mode]
    (crd_obj,) = kind(enabled(mode), "CustomResourceDefinition")
    assert crd_obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "dra-driver"
    del crd_obj["metadata"]["labels"]
    assert crd_obj == crd(names)
    assert crd_obj["spec"]["group"] == names.group


def _published(names: ApiNames) -> list[Any]:
    """The devices the node's compute-domain plugin publishes, as the CEL matcher sees them."""
    nodedevices = pytest.importorskip("dra_driver.computedomain.nodedevices")
    from dra_driver.cel.match import Device

    devices = nodedevices.imex_devices(names.driver, "clique-a", binding=False)
    return [Device(names.driver, "node-a", d["name"], d) for d in devices]


@pytest.mark.parametrize("mode", MODES)
def test_device_classes(mode: str) -> None:
    from dra_driver.cel.match import class_selectors, match_devices

    _, names = MODES[mode]
    classes = {o["metadata"]["name"]: o for o in kind(enabled(mode), "DeviceClass")}
    assert {names.channel_class, names.daemon_class} <= set(classes)
    expressions = {
        name: [s["cel"]["expression"] for s in classes[name]["spec"]["selectors"]]
        for name in (names.channel_class, names.daemon_class)
    }
    d = names.driver
    if mode == "own":
        assert expressions == {
            "imex-channel.gpu.dra.dev": [
                "device.driver == 'compute-domain.gpu.dra.dev' && "
                "device.attributes['compute-domain.gpu.dra.dev'].type == 'channel'"
            ],
            "imex-daemon.gpu.dra.dev": [
                "device.driver == 'compute-domain.gpu.dra.dev' && "
                "device.attributes['compute-domain.gpu.dra.dev'].type == 'daemon'"
            ],
        }
    else:
        assert expressions == {
            "compute-domain-default-channel.nvidia.com": [
                f"device.driver == '{d}' && device.attributes['{d}'].type == 'channel' && "
                f"device.attributes['{d}'].id == 0"
            ],
            "compute-domain-daemon.nvidia.com": [
                f"device.driver == '{d}' && device.attributes['{d}'].type == 'daemon'"
            ],
        }
    # Each class picks exactly the device of its kind among those a node publishes.
    devices = _published(names)
    for name, wanted in ((names.channel_class, "channel-0"), (names.daemon_class, "daemon-0")):
        results = match_devices(devices, class_selectors(classes[name]))
        assert {r.device.name for r in results if r.verdict.value == "match"} == {wanted}, name
        assert not [r for r in results if r.verdict.value == "error"], name


@pytest.mark.parametrize("mode", MODES)
def test_controller_deployment(mode: str) -> None:
    compat, names = MODES[mode]
    objects = enabled(
        mode,
        driverRoot="/run/nvidia/driver",
        logLevel="debug",
        **{
            "image.tag": "v9",
            "image.pullPolicy": "Always",
            "imagePullSecrets[0].name": "regcred",
            "imagePullSecrets[1].name": "mirror",
            "computeDomains.controller.replicas": "2",
            "computeDomains.controller.nodeSelector.role": "infra",
            "computeDomains.controller.tolerations[0].key": "infra",
            "computeDomains.controller.tolerations[0].operator": "Exists",
        },
    )
    (deployment,) = kind(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"] == {"role": "infra"}
    assert pod["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    c = controller(objects)
    assert c["command"] == ["dra-driver", "compute-domain-controller"]
    assert c["image"] == "ghcr.io/example/dra-driver:v9"
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    env = env_of(c)
    assert env["DRA_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["DRA_IMEX_IMAGE"]["value"] == c["image"]
    assert env["DRA_HOST_DRIVER_ROOT"]["value"] == "/run/nvidia/driver"
    assert env["DRA_COMPAT"]["value"] == compat
    assert env["DRA_LOG_LEVEL"]["value"] == "debug"
    # The controller's command takes these settings from the environment and runs its
    # daemons as the chart means: in its namespace, with the chart's image and driver root.
    settings = command_settings("compute-domain-controller", c, {"DRA_NAMESPACE": NAMESPACE})
    daemons = daemon_settings(settings)
    assert (daemons.namespace, daemons.image, daemons.driver_root, daemons.compat) == (
        NAMESPACE,
        "ghcr.io/example/dra-driver:v9",
        "/run/nvidia/driver",
        compat,
    )
    # The daemons are pulled as the controller is: same policy, same secrets.
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    daemon_pod = daemon_set(read_domain(DOMAIN, names), names, daemons)["spec"]["template"]
    assert daemon_pod["spec"]["imagePullSecrets"] == pod["imagePullSecrets"]
    assert daemon_pod["spec"]["containers"][0]["imagePullPolicy"] == c["imagePullPolicy"]
    assert c["imagePullPolicy"] == "Always"
    # Its own ServiceAccount, with rights on the domains of the mode's group only.
    rbac = Rbac(objects, pod["serviceAccountName"])
    assert rbac.allows(Attributes("watch", names.group, "computedomains", "", "", ""))
    other = NVIDIA if names is OWN else OWN
    assert not rbac.allows(Attributes("watch", other.group, "computedomains", "", "", ""))


def command_settings(command: str, container: Obj, downward: dict[str, str]) -> Settings:
    """The settings ``dra-driver <command>`` resolves from the container's environment (the
    downward API's values given), as its entry point does."""
    from dra_driver.commands import COMMANDS, build_parser
    from dra_driver.settings import from_namespace

    environ: dict[str, str] = {}
    for e in container["env"]:
        environ[e["name"]] = e["value"] if "value" in e else downward[e["name"]]
    known = {env_name(f) for f in Settings.model_fields}
    assert set(environ) <= known, f"not settings: {set(environ) - known}"
    if command not in COMMANDS:
        pytest.skip(f"dra-driver {command} does not exist yet")
    parser, _ = build_parser()
    ns = parser.parse_args([command])
    return from_namespace(ns, COMMANDS[command].fields, environ=environ)


def test_imex_daemon_service_account() -> None:
    """The daemons' pods run as the ServiceAccount the chart makes, which may read the pods
    of its namespace (a daemon finds its peers)."""
    objects = enabled("own")
    wanted = DaemonSettings(namespace=NAMESPACE, image="x").service_account
    assert wanted == "dra-driver-imex-daemon"
    sa = one(objects, "ServiceAccount", wanted)
    assert sa["metadata"]["namespace"] == NAMESPACE
    domain = read_domain(DOMAIN, OWN)
    pod = daemon_set(domain, OWN, DaemonSettings(namespace=NAMESPACE, image="x"))["spec"][
        "template"
    ]
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    rbac = Rbac(objects, wanted)
    for verb in ("get", "list", "watch"):
        assert rbac.allows(Attributes(verb, "", "pods", "", NAMESPACE, "")), verb
    assert not rbac.allows(Attributes("list", "", "pods", "", "default", ""))
    assert not rbac.allows(Attributes("create", "", "pods", "", NAMESPACE, ""))
    # A release under another name keeps the name the controller uses.
    other = render("gpu", "--namespace", "x", **{"computeDomains.enabled": "true"})
    assert one(other, "ServiceAccount", wanted)["metadata"]["namespace"] == "x"


@pytest.mark.parametrize("mode", MODES)
def test_node_container(mode: str) -> None:
    compat, names = MODES[mode]
    for binding in ("false", "true"):
        objects = enabled(
            mode,
            **{
                "computeDomains.bindingConditions": binding,
                "discovery.backend": "simulated",
                "discovery.profile": "dgx-h100",
                "kubeletPluginsDir": "/data/kubelet/plugins",
            },
        )
        by_name = containers(objects)
        assert list(by_name) == ["plugin", "compute-domain"]
        agent, node = by_name["plugin"], by_name["compute-domain"]
        assert node["command"] == ["dra-driver", "compute-domain-plugin"]
        assert node["image"] == agent["image"]
        assert node["securityContext"] == agent["securityContext"]
        env, agent_env = env_of(node), env_of(agent)
        assert env["DRA_IMEX_BINDING_CONDITIONS"]["value"] == binding
        assert env["DRA_COMPAT"]["value"] == compat
        # Everything both read is the same: node, pod UID, discovery, directories, logging.
        shared = set(env) & set(agent_env)
        assert shared >= {
            "DRA_NODE_NAME", "DRA_POD_UID", "DRA_BACKEND", "DRA_PROFILE", "DRA_PLUGINS_DIR",
            "DRA_REGISTRY_DIR", "DRA_CDI_ROOT", "DRA_DRIVER_ROOT", "DRA_LOG_FORMAT",
            "DRA_LOG_LEVEL",
        }  # fmt: skip
        for name in shared - {"DRA_COMPAT"}:
            assert env[name] == agent_env[name], name
        assert env["DRA_PLUGINS_DIR"]["value"] == "/data/kubelet/plugins"
        assert node["volumeMounts"] == [
            m
            for m in agent["volumeMounts"]
            if m["name"] in {v["name"] for v in node["volumeMounts"]}
        ]
        assert {m["name"] for m in node["volumeMounts"]} == {
            "plugins", "plugins-registry", "cdi", "driver-root",
        }  # fmt: skip
        settings = command_settings(
            "compute-domain-plugin", node, {"DRA_NODE_NAME": "node-a", "DRA_POD_UID": "u-1"}
        )
        assert settings.imex_binding_conditions is (binding == "true")
        assert (settings.node_name, settings.pod_uid) == ("node-a", "u-1")
        assert str(settings.plugins_dir) == "/data/kubelet/plugins"
        assert settings.compat == compat
        assert names.driver  # the plugin names its driver from compat alone


@pytest.mark.parametrize("mode", MODES)
def test_agent_rights_for_the_node_container(mode: str) -> None:
    _, names = MODES[mode]
    objects = enabled(mode)
    (ds,) = kind(objects, "DaemonSet")
    rbac = Rbac(objects, ds["spec"]["template"]["spec"]["serviceAccountName"])
    for verb in ("get", "list", "watch"):
        assert rbac.allows(Attributes(verb, names.group, "computedomains", "", "team-a", "cd"))
    assert rbac.allows(Attributes("patch", "", "nodes", "", "", "node-a"))
    assert rbac.allows(Attributes("patch", "resource.k8s.io", "resourceclaims", "status", "t", "c"))
    driver_rules = [r for r in rbac.rules("") if "resourceclaims/driver" in r["resources"]]
    assert sorted(n for r in driver_rules for n in r["resourceNames"]) == sorted(
        [names.driver, "gpu.nvidia.com" if mode == "nvidia" else "gpu.dra.dev"]
    )
    assert not rbac.allows(Attributes("update", names.group, "computedomains", "", "t", "cd"))
    # The slice policy lets the agent's pod publish the IMEX driver's slices too.
    (policy,) = [
        p for p in kind(objects, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-resourceslices")
    ]  # fmt: skip
    (check,) = [v for v in policy["spec"]["validations"] if "sliceDriver" in v["expression"]]
    gpu_driver = "gpu.nvidia.com" if mode == "nvidia" else "gpu.dra.dev"
    assert check["expression"] == f'variables.sliceDriver in ["{gpu_driver}", "{names.driver}"]'


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("computeDomains.enable=true", "/computeDomains"),
        ("computeDomains.bindingConditions=yes", "/computeDomains/bindingConditions"),
        ("computeDomains.controller.replicas=-1", "/computeDomains/controller/replicas"),
        (
            "computeDomains.controller.resources.request.cpu=1",
            "/computeDomains/controller/resources",
        ),
        ("computeDomains.controller.securityContext.privilegd=true", "/computeDomains/controller"),
        ("computeDomains.plugin.resource.cpu=1", "/computeDomains/plugin"),
    ],
)
def test_schema_rejects(value: str, where: str) -> None:
    from tests.unit.test_helm_chart import render_error

    assert where in render_error(value)


# ------------------------------------------------------------------------------------
# RBAC: every request the controller makes is allowed
# ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attributes:
    """A request as the API server's authorizer sees it."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f"{self.verb} {self.group or 'core'}/{what} {self.name} {where}"


class Rbac:
    """The rules bound to one ServiceAccount in a rendered chart."""

    def __init__(self, objects: dict[Any, Obj], service_account: str) -> None:
        self._by_scope: dict[str, list[Obj]] = {}
        sa_namespace = one(objects, "ServiceAccount", service_account)["metadata"]["namespace"]
        subject = {"kind": "ServiceAccount", "name": service_account, "namespace": sa_namespace}
        for binding in kind(objects, "ClusterRoleBinding") + kind(objects, "RoleBinding"):
            if subject not in binding["subjects"]:
                continue
            ref = binding["roleRef"]
            role_ns = binding["metadata"].get("namespace", "")
            roles = [
                o
                for o in kind(objects, ref["kind"])
                if o["metadata"]["name"] == ref["name"]
                and o["metadata"].get("namespace", "") == role_ns
            ]
            assert len(roles) == 1, f"{binding['metadata']['name']}: no role {ref}"
            self._by_scope.setdefault(role_ns, []).extend(roles[0]["rules"])

    def rules(self, namespace: str) -> list[Obj]:
        """The rules that apply in ``namespace`` ("" cluster-wide)."""
        found = list(self._by_scope.get("", []))
        if namespace:
            found += self._by_scope.get(namespace, [])
        return found

    def allows(self, a: Attributes) -> bool:
        resource = a.resource + (f"/{a.subresource}" if a.subresource else "")
        return any(
            a.group in rule["apiGroups"]
            and resource in rule["resources"]
            and a.verb in rule["verbs"]
            and (not rule.get("resourceNames") or a.name in rule["resourceNames"])
            for rule in self.rules(a.namespace)
        )


def attributes(
    method: str, path: str, query: dict[str, str], content_type: str
) -> list[Attributes]:
    """What the authorizer checks for one HTTP request (a server-side apply may create the
    object, so it needs create as well as patch)."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = rest[0], "", ""
    if len(rest) > 1:
        name = rest[1]
    if len(rest) > 2:
        subresource = rest[2]
    if method == "GET":
        verbs = ["get"] if name else (["watch"] if query.get("watch") == "true" else ["list"])
    elif method == "PATCH" and content_type == APPLY_PATCH:
        verbs = ["patch", "create"]
    else:
        verbs = [{"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]]
    return [Attributes(v, group, resource, subresource, namespace, name) for v in verbs]


class _Stream:
    status, reason, ok = 200, "OK", True
    headers: ClassVar[dict[str, str]] = {}

    async def read(self) -> bytes:
        return b""

    async def lines(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()  # a watch that stays open, quietly
        yield b""


class RecordingClient:
    """Answers every request as an empty cluster would and records what was asked."""

    def __init__(self, lease: Obj | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, str], str]] = []
        self.lease = lease

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> Response:
        self.requests.append((method, path, dict(query or []), content_type))
        answer: Any = {}
        status = 200
        if "/leases" in path:
            if method == "GET":
                status, answer = (200, self.lease) if self.lease else (404, {})
            else:
                self.lease = body
                status, answer = 201 if method == "POST" else 200, body
        elif method == "GET":
            answer = {"items": [], "metadata": {"resourceVersion": "1"}}
        return Response(status, {}, json.dumps(answer).encode(), "")

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kw: Any) -> AsyncIterator[_Stream]:
        self.requests.append((method, path, dict(kw.get("query") or []), ""))
        yield _Stream()


DOMAIN: Obj = {
    "apiVersion": "gpu.dra.dev/v1alpha1",
    "kind": "ComputeDomain",
    "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
    "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "train-channel"}}},
}


async def _controller_requests(names: ApiNames, settings: DaemonSettings) -> RecordingClient:
    # Leader election (the Lease missing, then held by another replica that stopped
    # renewing: taken once it has stood unchanged for its duration, here 1 s, on this
    # replica's clock) and the controller's list and watch of everything it follows.
    watched = 5
    clients = [
        RecordingClient(),
        RecordingClient(
            {
                "metadata": {"name": "dra-driver-compute-domain", "resourceVersion": "7"},
                "spec": {
                    "holderIdentity": "old",
                    "leaseDurationSeconds": 1,
                    "renewTime": "2020-01-01T00:00:00.000000Z",
                },
            }
        ),
    ]
    for client in clients:
        task = asyncio.ensure_future(
            run_controller(client, names, settings, identity="me")  # type: ignore[arg-type]
        )
        for _ in range(1000):
            if sum(1 for r in client.requests if r[2].get("watch") == "true") >= watched:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert sum(1 for r in client.requests if r[2].get("watch") == "true") >= watched
    # Every kind of action the planner can ask for, carried out.
    recorder = clients[0]
    domain = read_domain({**DOMAIN, "apiVersion": names.api_version}, names)
    ns, own = settings.namespace, daemon_name(domain)
    actions: list[planner.Action] = [
        planner.AddFinalizer(),
        planner.SetChannel(3),
        planner.Apply(
            planner.TEMPLATES, "team-a", "train-channel", workload_template(domain, 3, names)
        ),
        planner.Apply(planner.TEMPLATES, ns, own, daemon_template(domain, names, settings)),
        planner.Apply(planner.DAEMON_SETS, ns, own, daemon_set(domain, names, settings)),
        planner.SetStatus({"status": "NotReady", "nodes": []}),
        planner.Emit("DaemonNotReady", "the daemon on node-a is not ready"),
        planner.Unlabel("node-a"),
        planner.Delete(planner.DAEMON_SETS, ns, own),
        planner.Delete(planner.TEMPLATES, ns, own),
        planner.Delete(planner.TEMPLATES, "team-a", "train-channel"),
        planner.RemoveFinalizer(),
    ]
    assert {type(a) for a in actions} == set(typing.get_args(planner.Action)), (
        "a new kind of action: add it here, and the rights it needs to the chart"
    )
    work = DomainController(recorder, names, settings)  # type: ignore[arg-type]
    for action in actions:
        await work._carry_out(domain, action)
    recorder.requests += clients[1].requests
    return recorder


@pytest.mark.parametrize("mode", MODES)
def test_controller_rbac_allows_every_request(mode: str) -> None:
    compat, names = MODES[mode]
    objects = enabled(mode)
    (deployment,) = kind(objects, "Deployment")
    rbac = Rbac(objects, deployment["spec"]["template"]["spec"]["serviceAccountName"])
    settings = DaemonSettings(namespace=NAMESPACE, image="img", compat=compat)
    recorder = asyncio.run(_controller_requests(names, settings))
    asked = {
        a
        for method, path, query, content_type in recorder.requests
        for a in attributes(method, path, query, content_type)
    }
    refused = sorted(str(a) for a in asked if not rbac.allows(a))
    assert refused == [], "the controller's roles do not allow: " + "; ".join(refused)
    # The recording saw what the controller does (not an empty run).
    seen = {(a.verb, a.resource, a.subresource) for a in asked}
    assert seen >= {
        ("watch", "computedomains", ""), ("watch", "resourceclaimtemplates", ""),
        ("watch", "daemonsets", ""), ("watch", "pods", ""), ("watch", "nodes", ""),
        ("create", "leases", ""), ("update", "leases", ""), ("get", "leases", ""),
        ("patch", "computedomains", ""), ("patch", "computedomains", "status"),
        ("create", "resourceclaimtemplates", ""), ("delete", "daemonsets", ""),
        ("patch", "nodes", ""), ("create", "events", ""),
    }  # fmt: skip
    assert {a.group for a in asked if a.resource == "computedomains"} == {names.group}
    # Namespaced rights stay in the driver's namespace: daemons, pods, the Lease.
    for a in asked:
        if a.resource in ("daemonsets", "pods", "leases"):
            assert a.namespace == NAMESPACE, a
            other = Attributes(a.verb, a.group, a.resource, a.subresource, "team-a", a.name)
            assert not rbac.allows(other), other
    assert not rbac.allows(
        Attributes("update", "coordination.k8s.io", "leases", "", NAMESPACE, "x")
    )
    # Nothing the controller never does.
    for verb in ("delete", "create"):
        assert not rbac.allows(Attributes(verb, names.group, "computedomains", "", "t", "cd"))
    assert not rbac.allows(Attributes("get", "", "secrets", "", NAMESPACE, "x"))
    # Its Events are created once each (dra_driver/events.py): it may not change the Events
    # of anything else in the cluster.
    assert not rbac.allows(Attributes("patch", "", "events", "", "team-a", "x"))
    assert not rbac.allows(Attributes("update", "", "events", "", "team-a", "x"))


# ------------------------------------------------------------------------------------
# the kustomize component
# ------------------------------------------------------------------------------------


def test_kustomize_component_equals_the_chart(tmp_path: Path) -> None:
    """Base plus component: the chart's objects with computeDomains.enabled=true (own group,
    release dra-driver in namespace dra-driver), apart from the release labels."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(BASE, tmp_path)],
                "components": [os.path.relpath(COMPONENT, tmp_path)],
            }
        )
    )
    built = by_key(
        run(tool("kustomize"), "build", "--load-restrictor", "LoadRestrictionsNone", tmp_path)
    )
    chart = render("dra-driver", "--namespace", "dra-driver", **{"computeDomains.enabled": "true"})
    assert sorted(built) == sorted(chart)
    for k, obj in built.items():
        assert without_release_labels(chart[k]) == obj, f"{k} differs between chart and component"
    # The image reaches every new container and the daemons' setting from the base alone.
    image = containers(built)["plugin"]["image"]
    assert containers(built)["compute-domain"]["image"] == image
    assert (
        controller(built)["image"] == env_of(controller(built))["DRA_IMEX_IMAGE"]["value"] == image
    )


def test_component_files_are_listed_and_described() -> None:
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    listed = set(kustomization["resources"])
    present = {p.name for p in COMPONENT.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert "components/compute-domains" in (MANIFESTS / "README.md").read_text()


def test_values_are_documented() -> None:
    """Every computeDomains value is in values.yaml (off by default) and the chart README."""
    from tests.unit.test_manifests import CHART

    values = yaml.safe_load((CHART / "values.yaml").read_text())["computeDomains"]
    assert values["enabled"] is False and values["bindingConditions"] is False
    assert values["controller"]["replicas"] == 1
    readme = (CHART / "README.md").read_text()

    def leaves(node: Obj, prefix: str) -> list[str]:
        out = []
        for k, v in node.items():
            if isinstance(v, dict) and v and k not in ("resources", "securityContext"):
                out += leaves(v, f"{prefix}.{k}")
            else:
                out.append(f"{prefix}.{k}")
        return out

    for path in leaves(values, "computeDomains"):
        head, _, last = path.rpartition(".")
        assert f"`{path}`" in readme or f"`{head}.{last}`" in readme or f"`.{last}`" in readme, path


@pytest.mark.parametrize("mode", MODES)
def test_node_policy_names_the_modes_domain_label(mode: str) -> None:
    """The agent may patch Nodes only with ComputeDomains, and the policy that confines it
    to its own Node allows the mode's domain label and the clique label, nothing else."""
    _, names = MODES[mode]
    objects = enabled(mode)
    policies = {o["metadata"]["name"]: o for o in kind(objects, "ValidatingAdmissionPolicy")}
    policy = policies["dra-driver-nodes"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert yaml.safe_load(variables["allowed"]) == [names.domain_label, "nvidia.com/gpu.clique"]
    (binding,) = [
        o
        for o in kind(objects, "ValidatingAdmissionPolicyBinding")
        if o["spec"]["policyName"] == "dra-driver-nodes"
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]

    def policy_names(objs: dict[Any, Obj]) -> set[str]:
        return {o["metadata"]["name"] for o in kind(objs, "ValidatingAdmissionPolicy")}

    assert "dra-driver-nodes" not in policy_names(
        enabled(mode, **{"admissionPolicy.enabled": "false"})
    )
    assert "dra-driver-nodes" not in policy_names(render("dra-driver", "--namespace", NAMESPACE))


@pytest.mark.parametrize(
    ("missing", "enable"),
    [
        (("computeDomains",), False),
        (("computeDomains",), True),
        (("computeDomains.bindingConditions", "computeDomains.plugin"), True),
    ],
    ids=["no-section", "no-section-enabled-by-set", "no-binding-conditions-or-plugin"],
)
def test_an_older_release_without_compute_domain_values(
    tmp_path: Path, missing: tuple[str, ...], enable: bool
) -> None:
    """``helm upgrade --reuse-values`` from a chart without (some of) computeDomains.*: the
    chart renders (was: a nil pointer on computeDomains.enabled or .plugin.resources failed
    the upgrade), the node container's IMEX setting is the default, and with the controller's
    values missing the chart says what to do instead of leaving the Deployment out."""
    from tests.unit.test_helm_chart import agent_settings, older_release_chart

    chart = older_release_chart(tmp_path, *missing)
    argv: list[str | Path] = [tool("helm"), "template", "x", chart]
    if missing == ("computeDomains",) and enable:
        # The section's other values are missing too: refused, with the way out.
        proc = subprocess.run(
            [*map(str, argv), "--set", "computeDomains.enabled=true"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode != 0
        assert "--reset-then-reuse-values" in proc.stderr, proc.stderr
        return
    if enable:
        argv += ["--set", "computeDomains.enabled=true"]
    objects = by_key(run(*argv))
    if not enable:
        assert list(containers(objects)) == ["plugin"]
        return
    node = containers(objects)["compute-domain"]
    assert "DRA_IMEX_BINDING_CONDITIONS" not in env_of(node)
    assert agent_settings(node, "compute-domain-plugin").imex_binding_conditions is False
    assert "resources" not in node
    assert kind(objects, "Deployment")
