"""The NVIDIA DRA driver's public examples, rewritten as our test data for compat mode.

In compat mode (chart value ``compat: nvidia``) the driver publishes as ``gpu.nvidia.com`` with
NVIDIA's DeviceClasses, attribute names and opaque config API ``resource.nvidia.com/v1beta1``.
Each YAML file of this directory reproduces one example of kubernetes-sigs/dra-driver-nvidia-gpu
(``demo/specs/quickstart/v1/``, ``demo/specs/quickstart/``, ``demo/specs/consumable-shares/``,
``demo/specs/extended-resources/``): the same namespaces, names, classes, requests, selectors,
constraints and configs, in ``resource.k8s.io/v1``. Only the containers differ: every one runs
`BUSYBOX` (``imagePullPolicy: Never``) with `COMMAND`, which is ``tests.node.probe.PROBE``
verbatim, so ``Node.seen()`` parses their logs. Each file creates its own namespace and applies
on its own; several examples use both whole GPUs of the real node, so run them one at a time.

This module is plain data: for each example the file, the workloads and the pods expected
Running, per container what it should see, the checks across containers, and whether it runs
on the real-node tier in compat mode (`COMPAT_NODE`: the simulated DGX A100 profile, eight
A100 40GB, with dynamic MIG and GPUs 5 and 7 shared) and if not, why.

Container references in `Check` are ``<workload>/<container>``; ``<deployment>[*]/<container>``
stands for that container in every replica of the Deployment.

One file is reference data, not an example: `DEVICE_CLASSES_FILE` (NVIDIA's chart's GPU
DeviceClasses, to compare with ours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

HERE = Path(__file__).resolve().parent
SOURCE_REPO = "kubernetes-sigs/dra-driver-nvidia-gpu"
#: The local busybox image of the real node (testenv/node/ociimage.py ``BUSYBOX_IMAGE``).
BUSYBOX = "localhost/dra-test/busybox:local"
#: Every container's command after ``sh -c``: equal to ``tests.node.probe.PROBE``.
COMMAND = (
    "echo PROBE-ENV; env | sort; "
    "echo PROBE-DEV; ls -ld /dev/nvidia* /dev/nvidia-caps/* 2>&1; "
    "echo PROBE-MOUNTS; cat /proc/mounts; "
    "echo PROBE-END; trap 'exit 0' TERM; while true; do sleep 1; done"
)
DEVICE_CLASSES_FILE = HERE / "nvidia-deviceclasses.yaml"
#: The chart values of the real node that runs the examples (after the tier's own).
COMPAT_NODE = (
    "compat=nvidia",
    "discovery.profile=dgx-a100",
    "features.dynamicMig=true",
    "features.sharedGpus=index:5\\,7",
)

Sharing = Literal["TimeSlicing", "MPS"]
Status = Literal["runs", "needs-setup", "cannot-run"]
CheckKind = Literal[
    # The referenced containers see exactly the same devices (same UUIDs).
    "same-devices",
    # The referenced containers' devices are pairwise disjoint.
    "disjoint-devices",
    # Within each pod, the MIG devices of the referenced containers have one parentUUID.
    "same-parent",
    # The pod's status.extendedResourceClaimStatus maps `containers` (one) and the extended
    # resource `value` to a request of a claim the scheduler generated.
    "extended-resource-claim",
]


@dataclass(frozen=True)
class DeviceClassFact:
    """A DeviceClass of NVIDIA's Helm chart, as rendered for resource.k8s.io/v1."""

    name: str
    selector: str  # the one CEL expression of spec.selectors
    extended_resource_name: str | None = None
    needed_in_compat: bool = True  # whether compat mode should create it


@dataclass(frozen=True)
class Container:
    """One container and what it should see (NVIDIA_VISIBLE_DEVICES and /dev/nvidia*)."""

    name: str
    gpus: int = 0  # whole GPUs
    mig_devices: int = 0
    claim: str | None = None  # the pod's claim name (resources.claims[].name)
    request: str | None = None  # resources.claims[].request, when it names one
    sharing: Sharing | None = None
    time_slice_interval: str | None = None  # TimeSlicing: Default, Short, Medium or Long
    mps_active_thread_percentage: int | None = None
    mps_pinned_memory_limit: str | None = None  # a quantity, e.g. "10Gi"
    mig_profile: str | None = None
    product_pattern: str | None = None  # case-insensitive regex on productName
    extended_resources: dict[str, int] = field(default_factory=dict)  # resources.limits


@dataclass(frozen=True)
class Workload:
    """A Pod, or a Deployment whose replicas are found by `label_selector`."""

    kind: Literal["Pod", "Deployment"]
    name: str
    running: int  # pods expected Running: 1 for a Pod, the replicas of a Deployment
    containers: tuple[Container, ...]
    label_selector: str | None = None  # for Deployments: the pod template's labels


@dataclass(frozen=True)
class Check:
    """A relation between containers' devices that the example promises."""

    kind: CheckKind
    containers: tuple[str, ...]
    value: str = ""
    note: str = ""


@dataclass(frozen=True)
class Example:
    """One NVIDIA example and what it should do on a node that can run it."""

    name: str
    file: str  # in this directory
    source: str  # path in SOURCE_REPO
    namespace: str
    device_classes: tuple[str, ...]  # classes its claims (or extended resources) use
    workloads: tuple[Workload, ...]
    checks: tuple[Check, ...] = ()
    status: Status = "runs"  # on the real-node tier with compat: nvidia
    reason: str = ""  # why it does not simply run there
    needs: tuple[str, ...] = ()  # prerequisites beyond compat mode
    cluster_objects: tuple[str, ...] = ()  # cluster-scoped objects besides the Namespace

    @property
    def path(self) -> Path:
        return HERE / self.file

    @property
    def pods_running(self) -> int:
        return sum(w.running for w in self.workloads)


NVIDIA_DEVICE_CLASSES: tuple[DeviceClassFact, ...] = (
    DeviceClassFact(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        extended_resource_name="nvidia.com/gpu",
    ),
    DeviceClassFact(
        "mig.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    ),
    DeviceClassFact(
        "vfio.gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
        needed_in_compat=False,
    ),
)

#: Attributes and capacities (in the gpu.nvidia.com domain) that the examples read.
ATTRIBUTES_USED: dict[str, str] = {
    "type": "string gpu|mig|vfio; every class selector",
    "profile": "string, MIG devices (gpu-test4, mig-1g-12gb)",
    "parentUUID": "string, MIG devices; matchAttribute gpu.nvidia.com/parentUUID (gpu-test4)",
    "productName": "string, GPUs (gpu-test6: lowerAscii().matches('^.*a100.*$'))",
    "index": "int, GPUs (gpu-test6); NVIDIA stopped publishing it in Sep 2025",
    "capacity memory": "quantity; memory-sharing requests 4Gi of it",
    "capacity shares": "NVIDIA --consumable-shares=N only; integer-sharing relies on its default 1",
}

_SINGLE = "gpu.nvidia.com"
_MIG = "mig.nvidia.com"


def _ctr(name: str, claim: str, request: str | None = None, *, gpus: int = 1) -> Container:
    """A container on `gpus` whole GPUs without a sharing config."""
    return Container(name, gpus=gpus, claim=claim, request=request)


def _mig(name: str, claim: str, request: str, profile: str) -> Container:
    """A container on one MIG device of `profile`."""
    return Container(name, mig_devices=1, claim=claim, request=request, mig_profile=profile)


def _ts_long(name: str, claim: str, request: str | None = None) -> Container:
    """A container on one GPU time-sliced with interval Long."""
    return Container(
        name,
        gpus=1,
        claim=claim,
        request=request,
        sharing="TimeSlicing",
        time_slice_interval="Long",
    )


def _mps_50(name: str, claim: str, request: str) -> Container:
    """A container on one GPU shared through MPS: 50 % active threads, 10Gi pinned memory."""
    return Container(
        name,
        gpus=1,
        claim=claim,
        request=request,
        sharing="MPS",
        mps_active_thread_percentage=50,
        mps_pinned_memory_limit="10Gi",
    )


EXAMPLES: tuple[Example, ...] = (
    Example(
        name="gpu-test1",
        file="gpu-test1.yaml",
        source="demo/specs/quickstart/v1/gpu-test1.yaml",
        namespace="gpu-test1",
        device_classes=(_SINGLE,),
        workloads=(
            Workload("Pod", "pod1", 1, (_ctr("ctr", "gpu", gpus=1),)),
            Workload("Pod", "pod2", 1, (_ctr("ctr", "gpu", gpus=1),)),
        ),
        checks=(Check("disjoint-devices", ("pod1/ctr", "pod2/ctr"), note="one claim per pod"),),
    ),
    Example(
        name="gpu-test2",
        file="gpu-test2.yaml",
        source="demo/specs/quickstart/v1/gpu-test2.yaml",
        namespace="gpu-test2",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Pod",
                "pod",
                1,
                (_ctr("ctr0", "shared-gpu", gpus=1), _ctr("ctr1", "shared-gpu", gpus=1)),
            ),
        ),
        checks=(Check("same-devices", ("pod/ctr0", "pod/ctr1"), note="one claim, two containers"),),
    ),
    Example(
        name="gpu-test3",
        file="gpu-test3.yaml",
        source="demo/specs/quickstart/v1/gpu-test3.yaml",
        namespace="gpu-test3",
        device_classes=(_SINGLE,),
        workloads=(
            Workload("Pod", "pod1", 1, (_ctr("ctr", "shared-gpu", gpus=1),)),
            Workload("Pod", "pod2", 1, (_ctr("ctr", "shared-gpu", gpus=1),)),
        ),
        checks=(
            Check(
                "same-devices",
                ("pod1/ctr", "pod2/ctr"),
                note="one ResourceClaim (single-gpu) referenced by both pods",
            ),
        ),
    ),
    Example(
        name="gpu-test4",
        file="gpu-test4.yaml",
        source="demo/specs/quickstart/v1/gpu-test4.yaml",
        namespace="gpu-test4",
        device_classes=(_MIG,),
        workloads=(
            Workload(
                "Deployment",
                "pod",
                4,
                (
                    _mig("ctr0", "mig-devices", "mig-1g-5gb-0", "1g.5gb"),
                    _mig("ctr1", "mig-devices", "mig-1g-5gb-1", "1g.5gb"),
                    _mig("ctr2", "mig-devices", "mig-2g-10gb", "2g.10gb"),
                    _mig("ctr3", "mig-devices", "mig-3g-20gb", "3g.20gb"),
                ),
                label_selector="app=pod",
            ),
        ),
        checks=(
            Check(
                "same-parent",
                ("pod[*]/ctr0", "pod[*]/ctr1", "pod[*]/ctr2", "pod[*]/ctr3"),
                note="matchAttribute gpu.nvidia.com/parentUUID over all four requests",
            ),
            Check(
                "disjoint-devices",
                ("pod[*]/ctr0", "pod[*]/ctr1", "pod[*]/ctr2", "pod[*]/ctr3"),
                note="16 distinct MIG devices on 4 parents (each parent has one 3g.20gb)",
            ),
        ),
        reason='dynamic MIG makes the 1g.5gb, 2g.10gb and 3g.20gb devices of each replica on one A100',
        needs=("4 GPUs each with 2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb MIG devices",),
    ),
    Example(
        name="gpu-test5",
        file="gpu-test5.yaml",
        source="demo/specs/quickstart/v1/gpu-test5.yaml",
        namespace="gpu-test5",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Pod",
                "pod0",
                1,
                (
                    _ts_long("ts-ctr0", "shared-gpus", "ts-gpu"),
                    _ts_long("ts-ctr1", "shared-gpus", "ts-gpu"),
                    _mps_50("mps-ctr0", "shared-gpus", "mps-gpu"),
                    _mps_50("mps-ctr1", "shared-gpus", "mps-gpu"),
                ),
            ),
        ),
        checks=(
            Check("same-devices", ("pod0/ts-ctr0", "pod0/ts-ctr1")),
            Check("same-devices", ("pod0/mps-ctr0", "pod0/mps-ctr1")),
            Check(
                "disjoint-devices",
                ("pod0/ts-ctr0", "pod0/mps-ctr0"),
                note="two requests of one claim never share a device",
            ),
        ),
        needs=("MPS control daemons on the node",),
    ),
    Example(
        name="gpu-test6",
        file="gpu-test6.yaml",
        source="demo/specs/quickstart/v1/gpu-test6.yaml",
        namespace="gpu-test6",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Deployment",
                "pod",
                4,
                (
                    Container(
                        "ctr",
                        gpus=1,
                        claim="a100",
                        sharing="TimeSlicing",
                        time_slice_interval="Long",
                        product_pattern="a100",
                    ),
                ),
                label_selector="app=pod",
            ),
        ),
        checks=(
            Check(
                "disjoint-devices",
                ("pod[*]/ctr",),
                note="one claim per replica; GPUs with index 0, 2, 4, 6",
            ),
        ),
        reason="compat mode publishes the older attribute 'index' the selector reads",
        needs=("attribute gpu.nvidia.com/index (int)", "whole A100 GPUs with index 0, 2, 4, 6"),
    ),
    Example(
        name="gpu-test-mps",
        file="gpu-test-mps.yaml",
        source="demo/specs/quickstart/v1/gpu-test-mps.yaml",
        namespace="gpu-test-mps",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Pod",
                "test-pod",
                1,
                (
                    _mps_50("mps-ctr0", "shared-gpu", "mps-gpu"),
                    _mps_50("mps-ctr1", "shared-gpu", "mps-gpu"),
                ),
            ),
        ),
        checks=(Check("same-devices", ("test-pod/mps-ctr0", "test-pod/mps-ctr1")),),
        needs=("MPS control daemons on the node",),
    ),
    Example(
        name="gpu-test-vfiopci",
        file="gpu-test-vfiopci.yaml",
        source="demo/specs/quickstart/v1/gpu-test-vfiopci.yaml",
        namespace="gpu-test-vfio",
        device_classes=("vfio.gpu.nvidia.com",),
        workloads=(Workload("Pod", "pod1", 1, (_ctr("ctr", "gpu", gpus=1),)),),
        status="cannot-run",
        reason="VFIO passthrough GPUs (class vfio.gpu.nvidia.com): our driver has no VFIO devices",
        needs=("NVIDIA feature gate PassthroughSupport", "GPUs bound to vfio-pci"),
    ),
    Example(
        name="gpu-test-vfio-config",
        file="gpu-test-vfio-config.yaml",
        source="demo/specs/quickstart/v1/gpu-test-vfio-config.yaml",
        namespace="gpu-test-vfio",
        device_classes=("vfio.gpu.nvidia.com",),
        workloads=(Workload("Pod", "pod1-full-vfioconfig", 1, (_ctr("ctr", "gpu", gpus=1),)),),
        status="cannot-run",
        reason=(
            "VFIO passthrough with a VfioDeviceConfig (iommu backendPolicy LegacyOnly, "
            "enableAPIDevice true): our driver has no VFIO devices. NVIDIA's file puts the pod "
            "in namespace gpu-test-vfiopci, which it never creates; ours uses gpu-test-vfio"
        ),
        needs=("NVIDIA feature gate PassthroughSupport", "GPUs bound to vfio-pci"),
    ),
    Example(
        name="imex-test1",
        file="imex-test1.yaml",
        source="demo/specs/quickstart/v1/imex-test1.yaml",
        namespace="imex-test1",
        device_classes=("imex.nvidia.com", _SINGLE),
        workloads=tuple(
            Workload(
                "Deployment",
                f"deployment{i}",
                2,
                # Also uses claim imex-channel (deploymentN-imex-channel, shared by both
                # replicas): one IMEX channel, no GPU.
                (Container("ctr", gpus=1, claim="gpus"),),
                label_selector=f"app=deployment{i}",
            )
            for i in range(4)
        ),
        status="cannot-run",
        reason=(
            "IMEX channels (class imex.nvidia.com, which not even NVIDIA's current chart "
            "defines; it now uses ComputeDomains) are not supported; it would also need "
            "8 whole GPUs"
        ),
        needs=("IMEX / ComputeDomains", "class imex.nvidia.com", "8 whole GPUs"),
    ),
    Example(
        name="gpu-test7",
        file="gpu-test7.yaml",
        source="demo/specs/quickstart/gpu-test7.yaml (resource.k8s.io/v1beta1 there)",
        namespace="gpu-test7",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Pod",
                "gpu-pod",
                1,
                (_ctr("ctr0", "gpu0", gpus=1), _ctr("ctr1", "gpu1", gpus=1)),
            ),
        ),
        checks=(Check("disjoint-devices", ("gpu-pod/ctr0", "gpu-pod/ctr1")),),
    ),
    Example(
        name="gpu-test8",
        file="gpu-test8.yaml",
        source="demo/specs/quickstart/gpu-test8.yaml (resource.k8s.io/v1beta1 there)",
        namespace="gpu-test8",
        device_classes=(_SINGLE,),
        workloads=(Workload("Pod", "gpu-pod", 1, (_ctr("ctr0", "twogpus", gpus=2),)),),
    ),
    Example(
        name="integer-sharing",
        file="integer-sharing.yaml",
        source="demo/specs/consumable-shares/integer-sharing.yaml",
        namespace="gpu-share-integer",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Deployment",
                "integer-sharing",
                4,
                (_ctr("ctr", "gpu", gpus=1),),
                label_selector="app=integer-sharing",
            ),
        ),
        reason="no 'shares' capacity here: each claim takes the shared GPUs' default 1Gi of memory",
        needs=("GPUs published with allowMultipleAllocations (DRAConsumableCapacity)",),
    ),
    Example(
        name="memory-sharing",
        file="memory-sharing.yaml",
        source="demo/specs/consumable-shares/memory-sharing.yaml",
        namespace="gpu-share-memory",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Deployment",
                "memory-sharing",
                2,
                (_ctr("ctr", "gpu", gpus=1),),
                label_selector="app=memory-sharing",
            ),
        ),
        reason="each claim takes 4Gi of a shared GPU's memory",
        needs=("GPUs published with allowMultipleAllocations (DRAConsumableCapacity)",),
    ),
    Example(
        name="unlimited-sharing",
        file="unlimited-sharing.yaml",
        source="demo/specs/consumable-shares/unlimited-sharing.yaml",
        namespace="gpu-share-unlimited",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Deployment",
                "unlimited-sharing",
                2,
                (_ctr("ctr", "gpu", gpus=1),),
                label_selector="app=unlimited-sharing",
            ),
        ),
        reason="each claim takes the shared GPUs' default 1Gi of memory (NVIDIA's: 0)",
        needs=("GPUs published with allowMultipleAllocations (DRAConsumableCapacity)",),
    ),
    Example(
        name="gpu-full",
        file="gpu-full.yaml",
        source="demo/specs/extended-resources/gpu-full.yaml",
        namespace="extended-resource-gpu-full",
        device_classes=(_SINGLE,),
        workloads=(
            Workload(
                "Pod",
                "gpu-full-pod",
                1,
                (Container("cuda-container", gpus=1, extended_resources={"nvidia.com/gpu": 1}),),
            ),
        ),
        checks=(
            Check(
                "extended-resource-claim",
                ("gpu-full-pod/cuda-container",),
                value="nvidia.com/gpu",
                note="generated claim <pod>-extended-resources-*, request container-0-request-0",
            ),
        ),
        needs=(
            "DRAExtendedResource (beta, on in Kubernetes 1.36)",
            "class gpu.nvidia.com carries extendedResourceName nvidia.com/gpu and no other "
            "class maps that name (our extended.gpu.dra.dev must not, in compat mode)",
            "no NVIDIA device plugin on the node",
        ),
    ),
    Example(
        name="mig-1g-12gb",
        file="mig-1g-12gb.yaml",
        source="demo/specs/extended-resources/mig-1g-12gb.yaml",
        namespace="extended-resource-mig-1g12gb",
        device_classes=("mig-1g-12gb.gpu.nvidia.com",),
        workloads=(
            Workload(
                "Pod",
                "mig-1g12gb-pod",
                1,
                (
                    Container(
                        "cuda-container",
                        mig_devices=1,
                        mig_profile="1g.12gb",
                        extended_resources={"nvidia.com/mig-1g.12gb": 1},
                    ),
                ),
            ),
        ),
        checks=(
            Check(
                "extended-resource-claim",
                ("mig-1g12gb-pod/cuda-container",),
                value="nvidia.com/mig-1g.12gb",
            ),
        ),
        status="cannot-run",
        reason=(
            "MIG profile 1g.12gb is a GH200 profile; no GPU of our simulated product catalogue "
            "has it, so the pod stays Pending (the DeviceClass itself is created fine)"
        ),
        needs=("GH200 (or another GPU with 1g.12gb) in MIG mode", "DRAExtendedResource"),
        cluster_objects=("DeviceClass/mig-1g-12gb.gpu.nvidia.com",),
    ),
)

BY_NAME: dict[str, Example] = {e.name: e for e in EXAMPLES}
#: Examples that run on the real-node tier in compat mode (`COMPAT_NODE`).
RUNNABLE: tuple[Example, ...] = tuple(e for e in EXAMPLES if e.status == "runs")
#: The others, by name, with the reason (needs-setup ones name the setup that would do).
CANNOT_RUN: dict[str, str] = {e.name: e.reason for e in EXAMPLES if e.status != "runs"}

__all__ = [
    "ATTRIBUTES_USED",
    "BUSYBOX",
    "BY_NAME",
    "CANNOT_RUN",
    "COMMAND",
    "COMPAT_NODE",
    "DEVICE_CLASSES_FILE",
    "EXAMPLES",
    "NVIDIA_DEVICE_CLASSES",
    "RUNNABLE",
    "SOURCE_REPO",
    "Check",
    "Container",
    "DeviceClassFact",
    "Example",
    "Workload",
]
