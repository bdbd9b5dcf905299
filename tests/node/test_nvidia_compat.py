"""The NVIDIA DRA driver's own examples on the real node in compat mode, unchanged but for
images and commands (tests/node/nvidia_examples/).

The chart is switched to ``compat: nvidia`` on the simulated DGX A100 profile with dynamic MIG
and two shared GPUs (`COMPAT_NODE`), then each example that can run here is applied as it is:
every pod runs, every claim is allocated from ``gpu.nvidia.com``, each container's log shows
the devices it was promised, and the example's constraints hold. The examples that need what
the driver does not have are listed with the reason in ``CANNOT_RUN`` and docs/migrating.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.node.nvidia_examples import (
    CANNOT_RUN,
    COMPAT_NODE,
    DEVICE_CLASSES_FILE,
    RUNNABLE,
    Example,
    Workload,
)
from tests.node.probe import Node, Seen, wait_until

pytestmark = pytest.mark.node

NVIDIA_DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def compat(node: Node) -> Iterator[Node]:
    # The tier's chart maps nvidia.com/gpu to its extended.gpu.dra.dev class. Replaced in one
    # upgrade by gpu.nvidia.com, the scheduler (1.37) drops the mapping when the old class
    # goes after the new one came, and nvidia.com/gpu pods stay Pending: so each way, the
    # class that maps it goes first (docs/migrating.md says so too).
    no_extended = ("--set", "extendedResource.enabled=false")
    node.switch_chart("simulated", *no_extended)
    node.driver = NVIDIA_DRIVER
    try:
        node.switch_chart("simulated", *[a for kv in COMPAT_NODE for a in ("--set", kv)])
        yield node
    finally:
        node.driver = "gpu.dra.dev"
        node.switch_chart("simulated", *no_extended)
        node.switch_chart("simulated")
        # The kubelet removes the slices of a driver whose plugin is gone, after a while.
        res = node.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
        wait_until(
            lambda: not res.get(field_selector=f"spec.driver={NVIDIA_DRIVER}").items,
            f"the kubelet to remove the {NVIDIA_DRIVER} slices",
        )


def _pods(node: Node, namespace: str, workload: Workload) -> list[str]:
    """The workload's pods once as many as expected run."""

    def running() -> list[str] | None:
        if workload.kind == "Pod":
            pods = node.core.list_namespaced_pod(
                namespace, field_selector=f"metadata.name={workload.name}"
            ).items
        else:
            pods = node.core.list_namespaced_pod(
                namespace, label_selector=workload.label_selector
            ).items
        names = sorted(p.metadata.name for p in pods if p.status.phase == "Running")
        return names if len(names) == workload.running else None

    try:
        found: list[str] = wait_until(
            running, f"{workload.running} running pods of {workload.name}"
        )
    except AssertionError as e:
        pods = node.core.list_namespaced_pod(namespace).items
        details = "\n".join(node.describe(namespace, p.metadata.name) for p in pods)
        raise AssertionError(f"{e}\n{details}") from None
    return found


def _apply(node: Node, example: Example) -> None:
    for obj in yaml.safe_load_all(example.path.read_text()):
        if obj:
            node.create(obj, obj["metadata"].get("namespace", example.namespace))


def _devices(seen: Seen) -> frozenset[str]:
    """The GPU devices a container can open: its MIG devices' capability nodes (two per MIG
    device) when it has MIG devices, else its whole GPUs' /dev/nvidia<minor> nodes.
    (NVIDIA_VISIBLE_DEVICES lists every device of the claim, also in a container that uses
    one request of it.)"""
    caps = frozenset(d for d in seen.devices if d.startswith("/dev/nvidia-caps/"))
    if caps:
        return caps
    return frozenset(
        d for d, (major, minor) in seen.devices.items() if major == 195 and minor < 255
    )


def test_the_classes_and_slices_are_the_nvidia_drivers(compat: Node) -> None:
    res = compat.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="DeviceClass")
    ours = {c["metadata"]["name"]: c["spec"] for c in res.get().to_dict()["items"]}
    for theirs in yaml.safe_load_all(DEVICE_CLASSES_FILE.read_text()):
        name = theirs["metadata"]["name"]
        if name.startswith("vfio."):
            assert name not in ours
            continue
        spec = ours[name]
        # The same selector up to the quotes around its strings.
        (expected,) = [s["cel"]["expression"] for s in theirs["spec"]["selectors"]]
        (actual,) = [s["cel"]["expression"] for s in spec["selectors"]]
        assert actual.replace('"', "'") == expected
        assert spec.get("extendedResourceName") == theirs["spec"].get("extendedResourceName")
    drivers = {s["spec"]["driver"] for s in compat.slices()}
    assert drivers == {NVIDIA_DRIVER}


@pytest.mark.parametrize("example", RUNNABLE, ids=lambda e: e.name)
def test_an_nvidia_example_runs_unchanged(compat: Node, example: Example) -> None:
    _apply(compat, example)
    try:
        seen: dict[str, list[tuple[str, dict[str, Seen]]]] = {}
        for workload in example.workloads:
            for pod in _pods(compat, example.namespace, workload):
                allocated = compat.allocated(example.namespace, pod)
                assert allocated and {a.pool for a in allocated} == {compat.name}, allocated
                by_container = {}
                for c in workload.containers:
                    view = compat.seen(example.namespace, pod, c.name)
                    where = f"{example.name} {pod}/{c.name}"
                    devices = _devices(view)
                    want = 2 * c.mig_devices if c.mig_devices else c.gpus
                    assert len(devices) == want, (where, sorted(view.devices))
                    uuids = view.visible_devices()
                    prefix = "MIG-" if c.mig_devices else "GPU-"
                    assert uuids and all(u.startswith(prefix) for u in uuids), (where, uuids)
                    if c.sharing == "MPS":
                        assert view.env.get("CUDA_MPS_PIPE_DIRECTORY"), (where, view.env)
                    by_container[c.name] = view
                seen.setdefault(workload.name, []).append((pod, by_container))
        for check in example.checks:
            _check(compat, example, check.kind, check.containers, seen)
    finally:
        compat.delete_namespace(example.namespace)
        wait_until(
            lambda: (
                example.namespace
                not in {n.metadata.name for n in compat.core.list_namespace().items}
            ),
            f"namespace {example.namespace} to go",
        )


def _views(
    refs: tuple[str, ...], seen: dict[str, list[tuple[str, dict[str, Seen]]]]
) -> list[list[tuple[str, set[str]]]]:
    """Per pod, the devices of the referenced containers (``<workload>[*]/<container>`` is
    that container of every replica)."""
    per_pod: dict[str, list[tuple[str, set[str]]]] = {}
    for ref in refs:
        workload, container = ref.split("/")
        for pod, views in seen[workload.removesuffix("[*]")]:
            per_pod.setdefault(pod, []).append((ref, set(_devices(views[container]))))
    if all(r.split("/")[0].endswith("[*]") for r in refs):
        return list(per_pod.values())
    return [[item for items in per_pod.values() for item in items]]


def _check(
    node: Node,
    example: Example,
    kind: str,
    refs: tuple[str, ...],
    seen: dict[str, list[tuple[str, dict[str, Seen]]]],
) -> None:
    groups = _views(refs, seen)
    if kind == "same-devices":
        for group in groups:
            assert len({frozenset(d) for _, d in group}) == 1, (example.name, group)
    elif kind == "disjoint-devices":
        every = [d for group in groups for _, devices in group for d in devices]
        assert len(every) == len(set(every)), (example.name, groups)
    elif kind == "same-parent":
        for pod, _ in seen[refs[0].split("/")[0].removesuffix("[*]")]:
            parents = {a.attr("parentUUID") for a in node.allocated(example.namespace, pod)}
            assert len(parents) == 1 and None not in parents, (example.name, pod, parents)
    elif kind == "extended-resource-claim":
        pod = refs[0].split("/")[0]
        status: Any = node.core.read_namespaced_pod(pod, example.namespace).status
        ext = status.extended_resource_claim_status
        assert ext is not None and ext.resource_claim_name, (example.name, status)
    else:
        raise AssertionError(f"unknown check {kind}")


def test_the_examples_that_cannot_run_say_why() -> None:
    assert set(CANNOT_RUN) == {
        "gpu-test-vfiopci",
        "gpu-test-vfio-config",
        "imex-test1",
        "mig-1g-12gb",
    }
    assert all(CANNOT_RUN.values())
