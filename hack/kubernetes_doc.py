"""Regenerate the feature-gate table of docs/kubernetes.md from the release binaries.

Run ``make testenvs`` first (every release in testenv/versions built), then
``.venv/bin/python hack/kubernetes_doc.py``: each release's ``testenv feature-gates --list``
gives its DRA gates with maturity and default; the table replaces the text between the
``gates:begin`` and ``gates:end`` markers. What the driver does with each gate is kept here,
next to the table it annotates.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devenv.localcluster.releases import parse_versions, release_cache, versions_file  # noqa: E402

DOC = ROOT / "docs" / "kubernetes.md"
BEGIN, END = "<!-- gates:begin -->", "<!-- gates:end -->"

#: Gate -> what the driver does with it, and without it.
DRIVER: dict[str, str] = {
    "DynamicResourceAllocation": "required: resource.k8s.io/v1 itself",
    "DRAAdminAccess": "`adminAccess` requests prepared without touching sharing or MIG state "
    "(example `admin-access`); off: the example is skipped",
    "DRAConsumableCapacity": "GPUs shared by memory (`--shared-gpus`); off: those GPUs are "
    "published whole, with a Warning log line and a `DRAFeatureUnavailable` Node Event",
    "DRADeviceBindingConditions": "dynamic MIG placements carry binding conditions "
    "(`--mig-binding-conditions`): the MIG device is made before the pod is bound, a failure "
    "reschedules the pod (`tests/e2e/test_binding.py`); off: MIG devices are made at prepare, "
    "with a Node Event",
    "DRADeviceTaints": "unhealthy GPUs are tainted (`NoSchedule`, Xid / lost) and untainted "
    "when a re-check finds them healthy (`DeviceRecovered` Node Event); off: they are "
    "withdrawn from the slices instead, with a log line and a Node Event",
    "DRADeviceTaintRules": "not used (cluster admins' rules; the driver taints devices itself)",
    "DRAExtendedResource": "the `extended.gpu.dra.dev` class lets a pod ask for "
    "`nvidia.com/gpu: 1` (real-node tier)",
    "DRAPartitionableDevices": "dynamic MIG (`--dynamic-mig`: counters per GPU); off: whole "
    "GPUs and existing MIG devices only, with a log line and a Node Event",
    "DRAPrioritizedList": "nothing needed (example `prioritized-list`); off: the example is "
    "skipped",
    "DRAResourceClaimDeviceStatus": "the agent writes `status.devices` for prepared claims; "
    "a refused write is logged and preparing goes on",
    "ResourceHealthStatus": "health over the kubelet's gRPC stream; off: the kubelet does not "
    "ask, taints still apply",
    "DRAListTypeAttributes": "whole GPUs list the MIG profiles they support (`migProfiles`, "
    "`--list-attributes`), selectable with `.includes()` (`tests/e2e/test_list_attributes.py`); "
    "off: the API server refuses the lists and the agent publishes without them, with a Node "
    "Event",
    "DRANodeAllocatableResources": "`--node-overhead` declares the host resources each pod "
    "using a GPU costs the node, counted by the scheduler (`tests/e2e/test_node_overhead.py`, "
    "1.37 shape); off, or a node that does not declare it: not published, with a Node Event",
    "DRADerivedAttributes": "nothing to publish: a claim's own feature; the driver publishes "
    "the standard attributes it would derive (see below)",
    "DRADeviceCompatibilityGroups": "not used: the MIG counters already keep a whole GPU and "
    "its MIG devices apart (see below)",
    "DRAOptionalNodeOperations": "not used: every GPU claim needs its CDI spec (see below)",
    "DRAPartitionableDevicesType": "not used: MIG placements of one profile consume "
    "different memory-slice counters (see below)",
    "DRAResourcePoolStatus": "nothing to publish: the controller reads the driver's slices "
    "(see below)",
    "DRAResourceClaimGranularStatusAuthorization": "writing `status.devices` needs the "
    "`resourceclaims/driver` grant (`associated-node:patch` and `:update`) the chart and "
    "kustomize give",
    "DRASchedulerFilterTimeout": "scheduler only",
    "KubeletPodResourcesDynamicResources": "kubelet only",
    "ResourceHealthStatusMessage": "kubelet only",
    "DRAFractionalCapacityRange": "not used",
    "DRAWorkloadResourceClaims": "not used",
    "GenericWorkload": "not used (the test control plane serves its API when the gate is on)",
    "NodeDeclaredFeatures": "not used",
}


def gates(binary: Path) -> dict[str, tuple[str, str]]:
    """``testenv feature-gates --list`` as gate -> (maturity, default)."""
    out = subprocess.run(
        [str(binary), "feature-gates", "--list"], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        name, stage, default, *_ = line.split("\t")
        found[name] = (stage, default.removeprefix("default="))
    return found


def table() -> str:
    """The markdown table: a row per gate, a column per built release."""
    releases = parse_versions(versions_file(ROOT).read_text())
    columns = {}
    for version in releases:
        binary = release_cache(ROOT, version) / "bin" / "testenv"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run `make testenvs`")
        columns[version] = gates(binary)
    names = sorted({g for c in columns.values() for g in c}, key=lambda g: (g not in DRIVER, g))
    lines = [
        "| gate | " + " | ".join(releases) + " | the driver |",
        "|---|" + "---|" * len(releases) + "---|",
    ]
    for name in names:
        cells = []
        for version in releases:
            stage, default = columns[version].get(name, ("", ""))
            cells.append(
                f"{stage.lower()}, {'on' if default == 'true' else 'off'}" if stage else "-"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {DRIVER.get(name, '')} |")
    return "\n".join(lines)


def main() -> None:
    """Rewrite the table in docs/kubernetes.md."""
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    main()
