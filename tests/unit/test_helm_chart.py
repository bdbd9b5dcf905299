"""The Helm chart behaves like the charts cluster administrators know.

``helm template`` and ``helm lint`` from ``make tools`` (skipped without them): release
names and namespaces, the standard labels, the values admins expect, the schema that
rejects typos, and the opt-in extended-resource class. Equality with the kustomize base
is checked in test_manifests.py; the API server's strict validation of what the chart
renders in tests/e2e/test_manifests_e2e.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_manifests import CHART, ROOT, Obj, by_key, run, slice_policy, tool

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


#: The values an administrator commonly sets, each to something visible in the output.
ADMIN_VALUES = {
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].key": "gpu",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].operator": "Exists",
    "podAnnotations.team": "ml",
    "podLabels.tier": "system",
    "podSecurityContext.seccompProfile.type": "RuntimeDefault",
    "securityContext.readOnlyRootFilesystem": "true",
    "serviceAccount.annotations.role": "arn",
    "extraEnv[0].name": "DRA_LOG_LEVEL_EXTRA",
    "extraEnv[0].value": "x",
    "priorityClassName": "gpu-critical",
}


def template(release: str, *args: str, **values: Any) -> str:
    """``helm template`` of the chart with ``--set`` for each value."""
    argv: list[str | Path] = [tool("helm"), "template", release, CHART, *args]
    for k, v in values.items():
        argv += ["--set", f"{k}={v}"]
    return run(*argv)


def render(release: str = "dra-driver", *args: str, **values: Any) -> dict[Any, Obj]:
    return by_key(template(release, *args, **values))


def render_error(*values: str) -> str:
    argv = [str(tool("helm")), "template", "x", str(CHART)]
    for v in values:
        argv += ["--set", v]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, f"rendered although invalid: {values}"
    return proc.stderr


def kind(objects: dict[Any, Obj], name: str) -> list[Obj]:
    return [o for o in objects.values() if o["kind"] == name]


def daemonset(objects: dict[Any, Obj]) -> Obj:
    (ds,) = kind(objects, "DaemonSet")
    return ds


def container(objects: dict[Any, Obj]) -> Obj:
    (c,) = daemonset(objects)["spec"]["template"]["spec"]["containers"]
    return c


def env(objects: dict[Any, Obj]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(objects)["env"]}


def test_helm_lint_strict() -> None:
    out = run(tool("helm"), "lint", "--strict", CHART)
    assert "0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out


def test_namespace_from_release() -> None:
    objects = render("dra-driver", "--namespace", "gpu-ops")
    namespaced = [o for o in objects.values() if o["kind"] not in CLUSTER_SCOPED]
    assert namespaced and {o["metadata"]["namespace"] for o in namespaced} == {"gpu-ops"}
    (ns,) = kind(objects, "Namespace")
    assert ns["metadata"]["name"] == "gpu-ops"
    (binding,) = kind(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "gpu-ops"
    policy, _ = slice_policy(objects.values())
    expression = policy["spec"]["matchConditions"][0]["expression"]
    assert expression == 'request.userInfo.username == "system:serviceaccount:gpu-ops:dra-driver"'


def test_namespace_override_and_no_namespace_object() -> None:
    objects = render(
        "dra-driver",
        "--namespace",
        "ignored",
        namespaceOverride="gpu-system",
        createNamespace=False,
    )
    assert kind(objects, "Namespace") == []
    assert daemonset(objects)["metadata"]["namespace"] == "gpu-system"


def test_standard_labels() -> None:
    objects = render("gpu", "--namespace", "gpu")
    for obj in objects.values():
        labels = obj["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "dra-driver-0.1.0"
        assert labels["app.kubernetes.io/name"] == "dra-driver"
        assert labels["app.kubernetes.io/instance"] == "gpu"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    ds = daemonset(objects)
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "dra-driver",
        "app.kubernetes.io/instance": "gpu",
        "app.kubernetes.io/component": "kubelet-plugin",
    }
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_names_from_fullname() -> None:
    assert daemonset(render("dra-driver"))["metadata"]["name"] == "dra-driver-kubelet-plugin"
    assert daemonset(render("gpu"))["metadata"]["name"] == "gpu-dra-driver-kubelet-plugin"
    objects = render("gpu", fullnameOverride="nv", nameOverride="x")
    assert daemonset(objects)["metadata"]["name"] == "nv-kubelet-plugin"
    assert daemonset(objects)["metadata"]["labels"]["app.kubernetes.io/name"] == "x"
    (sa,) = kind(objects, "ServiceAccount")
    assert sa["metadata"]["name"] == "nv"
    assert daemonset(objects)["spec"]["template"]["spec"]["serviceAccountName"] == "nv"


def test_second_release_does_not_collide() -> None:
    """Two releases (each with its own driver name) share no cluster-scoped object name."""
    first = render("dra-driver", "--namespace", "dra-driver")
    second = render("gpu-b", "--namespace", "gpu-b", driverName="b.gpu.example.com")

    def cluster_scoped(objects: dict[Any, Obj]) -> set[tuple[str, str]]:
        return {
            (o["kind"], o["metadata"]["name"])
            for o in objects.values()
            if o["kind"] in CLUSTER_SCOPED
        }

    a, b = cluster_scoped(first), cluster_scoped(second)
    assert len(a) == len(b) == 10
    assert a.isdisjoint(b)
    # Each release's binding and policy point at its own objects.
    (role,) = kind(second, "ClusterRole")
    (binding,) = kind(second, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "gpu-b-dra-driver"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-b-dra-driver", "namespace": "gpu-b"}
    ]
    policies = {p["metadata"]["name"] for p in kind(second, "ValidatingAdmissionPolicy")}
    bound = {b["spec"]["policyName"] for b in kind(second, "ValidatingAdmissionPolicyBinding")}
    assert bound == policies and len(policies) == 2


def test_admin_values() -> None:
    objects = render(
        "dra-driver",
        **ADMIN_VALUES,
        **{"updateStrategy.type": "OnDelete", "updateStrategy.rollingUpdate": "null"},
    )
    pod = daemonset(objects)["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"team": "ml"}
    assert pod["metadata"]["labels"]["tier"] == "system"
    spec = pod["spec"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "gpu",
        "operator": "Exists",
    }
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["priorityClassName"] == "gpu-critical"
    assert container(objects)["securityContext"] == {
        "privileged": True,
        "readOnlyRootFilesystem": True,
    }
    assert env(objects)["DRA_LOG_LEVEL_EXTRA"] == "x"
    assert daemonset(objects)["spec"]["updateStrategy"] == {"type": "OnDelete"}
    (sa,) = kind(objects, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"role": "arn"}


def test_existing_service_account() -> None:
    objects = render(
        "dra-driver", **{"serviceAccount.create": "false", "serviceAccount.name": "gpu"}
    )
    assert kind(objects, "ServiceAccount") == []
    assert daemonset(objects)["spec"]["template"]["spec"]["serviceAccountName"] == "gpu"
    (binding,) = kind(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "gpu"
    assert "serviceAccount.name is required" in render_error("serviceAccount.create=false")


def test_probes_and_ports_off_with_zero() -> None:
    """0 means off, as for the agent's flags: no port, no probe, DRA_*_PORT=0."""
    default = container(render())
    assert default["startupProbe"]["grpc"]["port"] == default["livenessProbe"]["grpc"]["port"]
    for metrics_off in ({"metrics.enabled": "false"}, {"metrics.port": "0"}):
        objects = render(healthPort=0, **metrics_off, **{"metrics.serviceMonitor.enabled": "true"})
        c = container(objects)
        assert "startupProbe" not in c and "livenessProbe" not in c and "ports" not in c
        assert env(objects)["DRA_HEALTH_PORT"] == "0"
        assert env(objects)["DRA_METRICS_PORT"] == "0"
        assert kind(objects, "ServiceMonitor") == [] and kind(objects, "Service") == []


def test_service_monitor() -> None:
    assert kind(render(), "ServiceMonitor") == []
    objects = render(
        "dra-driver",
        "--namespace",
        "mon",
        **{"metrics.serviceMonitor.enabled": "true", "metrics.serviceMonitor.labels.release": "kp"},
    )
    (monitor,) = kind(objects, "ServiceMonitor")
    (service,) = kind(objects, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kp"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["selector"].items() <= (
        daemonset(objects)["spec"]["template"]["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert service["spec"]["ports"][0]["port"] == 8080
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["mon"]}
    assert (
        kind(
            render(**{"metrics.enabled": "false", "metrics.serviceMonitor.enabled": "true"}),
            "ServiceMonitor",
        )
        == []
    )


@pytest.mark.parametrize(
    ("release", "values"),
    [
        ("g" * 53, {}),  # the longest release name Helm takes: "<release>-dra-drive" is 63
        ("gpu", {"fullnameOverride": "f" * 63}),
        ("gpu.a", {}),  # Helm takes dots in release names; a Service name cannot have them
    ],
    ids=["long-release", "long-fullname", "dotted-release"],
)
def test_metrics_service_name_is_a_dns_label(release: str, values: dict[str, str]) -> None:
    """A Service's name is a DNS-1035 label (at most 63 characters, no dots), unlike the
    other objects' names: the API server refuses anything else."""
    objects = render(release, **values, **{"metrics.serviceMonitor.enabled": "true"})
    (service,) = kind(objects, "Service")
    name = service["metadata"]["name"]
    assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
    assert name.endswith("-metrics")
    (monitor,) = kind(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_extended_resource_class_needs_acknowledgement() -> None:
    classes = {o["metadata"]["name"] for o in kind(render(), "DeviceClass")}
    assert "extended.gpu.dra.dev" not in classes
    message = render_error("extendedResource.enabled=true")
    assert "device plugin" in message and "acknowledgeNoDevicePlugin" in message
    objects = render(
        **{"extendedResource.enabled": "true", "extendedResource.acknowledgeNoDevicePlugin": "true"}
    )
    (extended,) = [
        o for o in kind(objects, "DeviceClass") if o["metadata"]["name"].startswith("extended.")
    ]
    assert extended["spec"]["extendedResourceName"] == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("affinity.foo=bar", "/affinity"),
        ("loglevel=debug", "loglevel"),
        ("logFormat=xml", "/logFormat"),
        ("securityContext.privilegd=true", "/securityContext"),
        ("resources.request.cpu=1", "/resources"),
        ("tolerations[0].efect=NoSchedule", "/tolerations/0"),
        ("metrics.port=65536", "/metrics/port"),
        ("healthPort=-1", "/healthPort"),
        ("features.dynamicMig=yes", "/features/dynamicMig"),
        ("features.migProfiles=1g", "/features/migProfiles"),
    ],
)
def test_schema_rejects(value: str, where: str) -> None:
    assert where in render_error(value)


@pytest.mark.parametrize(
    "values",
    [
        {"discovery.backend": "simulated", "discovery.profile": "mixed"},
        {
            "features.sharedGpus": "model:L4",
            "features.dynamicMig": "true",
            "features.migProfiles": "1g.10gb\\,7g.80gb",
            "features.migLayout": "capacity",
        },
        {"admissionPolicy.enabled": "false"},
        {"driverName": "gpu.example.com", "image.tag": ""},
    ],
    ids=["simulated", "features", "no-policy", "renamed"],
)
def test_values_reach_the_agent(values: dict[str, str]) -> None:
    objects = render(**values)
    e = env(objects)
    if "discovery.profile" in values:
        assert e["DRA_BACKEND"] == "simulated" and e["DRA_PROFILE"] == "mixed"
    else:
        assert "DRA_PROFILE" not in e
    if "features.sharedGpus" in values:
        assert e["DRA_DYNAMIC_MIG"] == "true" and e["DRA_SHARED_GPUS"] == "model:L4"
        assert e["DRA_MIG_PROFILES"] == "1g.10gb,7g.80gb"
        assert e["DRA_MIG_LAYOUT"] == "capacity"
    if "admissionPolicy.enabled" in values:
        names = [o["metadata"]["name"] for o in kind(objects, "ValidatingAdmissionPolicy")]
        assert not [n for n in names if n.endswith("-resourceslices")], names
    if "driverName" in values:
        assert container(objects)["image"] == "ghcr.io/example/dra-driver:v0.1.0"  # appVersion
        assert e["DRA_DRIVER_NAME"] == "gpu.example.com"
        names = {o["metadata"]["name"] for o in kind(objects, "DeviceClass")}
        assert names == {"gpu.example.com", "mig.gpu.example.com", "shared.gpu.example.com"}


@pytest.mark.parametrize(
    ("profiles", "accepted"),
    [
        ("1g.10gb", True),
        ("1g.10gb, 3g.40gb,7g.80gb", True),
        ("1g.10gb+me,1g.10gb,", True),
        # Newer drivers' variants of a profile: without media engines, with all, graphics.
        ("1g.24gb-me", True),
        ("1g.24gb+me.all", True),
        ("1g.24gb-me,1g.24gb+me.all,1g.24gb+gfx", True),
        ("1g", False),
        ("1g.10GB", False),
        ("1g.10gb;3g.40gb", False),
        ("1g.10gb+", False),
        ("1g.10gb+me.", False),
    ],
)
def test_mig_profiles_the_agent_takes_are_the_schemas(profiles: str, accepted: bool) -> None:
    """features.migProfiles passes the schema exactly when the agent's --mig-profiles takes it
    (dra_driver/gpu/publish/profiles.py)."""
    from dra_driver.gpu.publish.profiles import ProfileListError, parse_profiles

    try:
        parse_profiles(profiles)
        agent = True
    except ProfileListError:
        agent = False
    assert agent is accepted, "the table disagrees with the agent"
    value = profiles.replace(",", "\\,")  # --set splits at unescaped commas
    if accepted:
        e = env(render(**{"features.dynamicMig": "true", "features.migProfiles": value}))
        assert e["DRA_MIG_PROFILES"] == profiles
    else:
        assert "/features/migProfiles" in render_error(f"features.migProfiles={value}")


def test_extra_volumes_and_the_host_pid_namespace() -> None:
    """Extra volumes reach the pod and their mounts the agent's container; the agent always
    runs in the host's PID namespace (its MPS daemons must outlive it)."""
    objects = render(
        **{
            "extraVolumes[0].name": "state",
            "extraVolumes[0].hostPath.path": "/var/lib/x",
            "extraVolumeMounts[0].name": "state",
            "extraVolumeMounts[0].mountPath": "/var/lib/x",
        }
    )
    spec = daemonset(objects)["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert {"name": "state", "hostPath": {"path": "/var/lib/x"}} in spec["volumes"]
    assert {"name": "state", "mountPath": "/var/lib/x"} in container(objects)["volumeMounts"]
    assert "extraVolumeMounts" in render_error("extraVolumeMounts[0].name=state")


def test_compat_nvidia_renders_the_nvidia_drivers_classes_and_name() -> None:
    objects = render(compat="nvidia", driverName="ignored.example.com")
    classes = {o["metadata"]["name"]: o["spec"] for o in kind(objects, "DeviceClass")}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com", "shared.gpu.nvidia.com"}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    for name, device_type in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        (selector,) = classes[name]["selectors"]
        assert selector["cel"]["expression"] == (
            f'device.driver == "gpu.nvidia.com" && '
            f'device.attributes["gpu.nvidia.com"].type == "{device_type}"'
        )
    assert env(objects)["DRA_DRIVER_NAME"] == "gpu.nvidia.com"
    assert env(objects)["DRA_COMPAT"] == "nvidia"
    rules = [r for o in kind(objects, "ClusterRole") for r in o["rules"]]
    assert ["gpu.nvidia.com"] in [r.get("resourceNames") for r in rules]
    # Only the GPU class serves the extended resource: a second one would be ambiguous.
    acknowledged = render(
        compat="nvidia",
        **{"extendedResource.enabled": "true", "extendedResource.acknowledgeNoDevicePlugin": "true"},
    )
    names = [o["metadata"]["name"] for o in kind(acknowledged, "DeviceClass")]
    assert not [n for n in names if n.startswith("extended.")]
    assert "DRA_COMPAT" not in env(render())
    assert "/compat" in render_error("compat=amd")


@pytest.mark.parametrize(
    "values",
    [{}, {"compat": "nvidia"}, {"driverName": "gpu2.example.com"}],
    ids=["default", "compat", "driver-name"],
)
def test_notes_name_the_device_classes_the_chart_renders(
    tmp_path: Path, values: dict[str, str]
) -> None:
    """What ``helm install`` prints tells users which classes to claim: they must exist."""
    # helm template does not render NOTES.txt: render its text as a ConfigMap's data instead.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes-under-test" -}}\n' + notes + "\n{{- end }}\n"
    )
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\n"
        'data:\n  notes: {{ include "notes-under-test" . | toJson }}\n'
    )
    argv: list[str | Path] = [tool("helm"), "template", "x", chart]
    for k, v in values.items():
        argv += ["--set", f"{k}={v}"]
    objects = by_key(run(*argv))
    (rendered,) = [
        o for o in kind(objects, "ConfigMap") if o["metadata"]["name"] == "notes-under-test"
    ]
    found = re.search(
        r"DeviceClass (\S+)\s+\(whole GPUs\) or (\S+) \(MIG devices\)", rendered["data"]["notes"]
    )
    assert found, rendered["data"]["notes"]
    classes = {o["metadata"]["name"]: o for o in kind(objects, "DeviceClass")}
    for name, device_type in zip(found.groups(), ("gpu", "mig"), strict=True):
        assert name in classes, f"NOTES name {name}; the chart renders {sorted(classes)}"
        (selector,) = classes[name]["spec"]["selectors"]
        assert selector["cel"]["expression"].endswith(f'.type == "{device_type}"')


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
        # The usual DaemonSet setting given alone: the default surge goes (Kubernetes refuses
        # both non-zero: ValidateRollingUpdateDaemonSet).
        (
            {"updateStrategy.rollingUpdate.maxUnavailable": "1"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        ),
        (
            {"updateStrategy.rollingUpdate.maxUnavailable": "25%"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}},
        ),
        (
            {"updateStrategy.rollingUpdate.maxSurge": "2"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0}},
        ),
        ({"updateStrategy.type": "OnDelete"}, {"type": "OnDelete"}),
        # No surge, given alone: the default maxUnavailable 0 would leave both 0, which
        # Kubernetes refuses; Kubernetes' own default for a DaemonSet, one at a time, instead.
        (
            {"updateStrategy.rollingUpdate.maxSurge": "0"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        ),
        (
            {"updateStrategy.rollingUpdate.maxSurge": "0%"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": 1}},
        ),
        (
            {"updateStrategy.rollingUpdate": "null"},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        ),
    ],
)
def test_update_strategy_is_one_the_api_server_accepts(
    values: dict[str, str], expected: dict[str, Any]
) -> None:
    strategy = daemonset(render("x", **values))["spec"]["updateStrategy"]
    assert strategy == expected
    rolling = strategy.get("rollingUpdate", {})
    zero = [str(rolling.get(k, 0)) in ("0", "0%") for k in ("maxSurge", "maxUnavailable")]
    # ValidateRollingUpdateDaemonSet: not both non-zero, and not both zero.
    assert zero.count(False) <= 1
    assert not rolling or zero.count(True) <= 1


def test_health_and_metrics_ports_differ() -> None:
    """The agent refuses one port for both (--health-port, --metrics-port): so does the chart,
    at install instead of in a crash-looping pod."""
    assert "metrics.port" in render_error("healthPort=8080")
    assert "metrics.port" in render_error("metrics.port=51515")
    e = env(render(healthPort=8080, **{"metrics.enabled": "false"}))
    assert e["DRA_HEALTH_PORT"] == "8080" and e["DRA_METRICS_PORT"] == "0"
    e = env(render(healthPort=0, **{"metrics.port": "0"}))
    assert e["DRA_HEALTH_PORT"] == e["DRA_METRICS_PORT"] == "0"


def test_upgrades_in_the_docs_take_the_new_charts_defaults() -> None:
    """``helm upgrade --reuse-values`` renders the new chart with the old chart's defaults: a
    value the new chart adds is missing (the chart then renders the agent's default, see
    test_an_older_releases_missing_features_leave_the_agent_its_defaults), and a default the
    new chart changed keeps its old value. The docs' upgrades use --reset-then-reuse-values:
    the new defaults, then the release's own."""
    docs = [ROOT / "README.md", CHART / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        # Commands continued with a backslash are one command.
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if "helm upgrade" in line:
                assert "--reuse-values" not in line, f"{path.name}: {line.strip()}"


def test_a_simulated_backend_needs_a_profile() -> None:
    """The agent refuses --backend simulated without --profile, and says so only after it has
    reached the API server: the schema refuses it at install."""
    message = render_error("discovery.backend=simulated")
    assert "/discovery/profile" in message, message
    e = env(render(**{"discovery.backend": "simulated", "discovery.profile": "l4x4"}))
    assert e["DRA_BACKEND"] == "simulated" and e["DRA_PROFILE"] == "l4x4"


def older_release_chart(tmp_path: Path, *missing: str) -> Path:
    """The chart as ``helm upgrade --reuse-values`` renders it for a release of an older chart
    that lacked the ``missing`` values (dotted paths): Helm then takes the old release's
    values in place of this chart's values.yaml, so nothing fills the keys in."""
    import yaml

    chart = tmp_path / "older-release"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for path in missing:
        *parents, last = path.split(".")
        where = values
        for name in parents:
            where = where[name]
        del where[last]
    (chart / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    return chart


def agent_settings(c: Obj, command: str = "run") -> Any:
    """The settings ``dra-driver <command>`` resolves from the container's environment, as
    the kubelet sets it: an EnvVar without a value is an empty variable."""
    from dra_driver.commands import COMMANDS, build_parser
    from dra_driver.settings import from_namespace

    downward = {"DRA_NODE_NAME": "node-a", "DRA_POD_UID": "u-1"}
    environ = {
        e["name"]: downward[e["name"]] if "valueFrom" in e else e.get("value") or ""
        for e in c["env"]
    }
    parser, _ = build_parser()
    return from_namespace(parser.parse_args([command]), COMMANDS[command].fields, environ=environ)


#: The agent's settings the chart renders from features.* (each a DRA_* variable).
FEATURE_SETTINGS = {
    "dynamicMig": "dynamic_mig",
    "migProfiles": "mig_profiles",
    "migLayout": "mig_layout",
    "migBindingConditions": "mig_binding_conditions",
    "migFailureHold": "mig_failure_hold",
    "nodeOverhead": "node_overhead",
    "listAttributes": "list_attributes",
    "sharedGpus": "shared_gpus",
    "ignoredXids": "ignored_xids",
    "healthRecheckInterval": "health_recheck_interval",
}


def test_every_feature_value_is_an_agent_setting_with_the_same_default() -> None:
    """What a release without features.<key> gets (the agent's default, below) is what a new
    install gets (values.yaml)."""
    import yaml

    from dra_driver.bindsettings import env_name
    from dra_driver.settings import Settings

    features = yaml.safe_load((CHART / "values.yaml").read_text())["features"]
    assert set(features) == set(FEATURE_SETTINGS)
    e = env(render())
    for key, field in FEATURE_SETTINGS.items():
        assert e[env_name(field)] == str(features[key]).lower(), key
        default = Settings.model_fields[field].default
        assert default == features[key], f"features.{key}: {features[key]!r}, agent {default!r}"


@pytest.mark.parametrize(
    "missing",
    [
        *[(f"features.{key}",) for key in FEATURE_SETTINGS],
        tuple(f"features.{key}" for key in FEATURE_SETTINGS),
        ("features",),
    ],
    ids=[*FEATURE_SETTINGS, "every-feature", "no-features"],
)
def test_an_older_releases_missing_features_leave_the_agent_its_defaults(
    tmp_path: Path, missing: tuple[str, ...]
) -> None:
    """``helm upgrade --reuse-values`` from a chart without a features.* value: the chart
    renders no variable for it, and the agent starts with the settings a new install gets
    (was: an empty DRA_* variable, which the agent refused for DRA_MIG_LAYOUT,
    DRA_MIG_FAILURE_HOLD and DRA_HEALTH_RECHECK_INTERVAL, a crash loop, and read as "ignore no
    Xid" for DRA_IGNORED_XIDS, so application errors tainted GPUs)."""
    from dra_driver.bindsettings import env_name

    chart = older_release_chart(tmp_path, *missing)
    c = container(by_key(run(tool("helm"), "template", "x", chart)))
    keys = FEATURE_SETTINGS if missing == ("features",) else [m.split(".")[1] for m in missing]
    rendered = {e["name"]: e.get("value") for e in c["env"]}
    for key in keys:
        assert env_name(FEATURE_SETTINGS[key]) not in rendered, f"features.{key}"
    assert agent_settings(c) == agent_settings(container(render("x")))


def test_an_older_release_without_start_up_probe_values_renders(tmp_path: Path) -> None:
    """startupProbe missing (``{{ .Values.startupProbe.periodSeconds }}`` was a nil pointer
    that failed the upgrade) or partly missing (an empty field: Kubernetes' 10 s x 3, half the
    chart's start-up allowance): the chart's own values."""
    for missing in (("startupProbe",), ("startupProbe.periodSeconds",)):
        chart = older_release_chart(tmp_path / missing[0], *missing)
        probe = container(by_key(run(tool("helm"), "template", "x", chart)))["startupProbe"]
        assert (probe["periodSeconds"], probe["failureThreshold"]) == (2, 30), missing


def test_an_older_release_without_compat_renders_the_own_driver(tmp_path: Path) -> None:
    """compat missing (a release of a chart before it) is compat "" (was: "<nil>" was refused
    as a compatibility mode, failing the upgrade)."""
    chart = older_release_chart(tmp_path, "compat")
    e = env(by_key(run(tool("helm"), "template", "x", chart)))
    assert e["DRA_DRIVER_NAME"] == "gpu.dra.dev" and "DRA_COMPAT" not in e
