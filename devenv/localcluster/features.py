"""Whether a DRA feature is on in a local control plane, and if not, why.

A release's feature registry (``testenv feature-gates --list``) names its DRA gates with
their maturity and default; the control plane runs with all of them on or with the defaults
(``DRA_K8S_GATES``). A gate missing from the registry is either not there yet or graduated
and removed (Kubernetes drops a gate a few releases after GA), which :data:`GATE_SINCE`
tells apart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

#: The first release (minor) with each DRA gate the tests depend on, as an alpha feature.
GATE_SINCE: Mapping[str, int] = {
    "DRAAdminAccess": 32,
    "DRAConsumableCapacity": 34,
    "DRADeviceBindingConditions": 34,
    "DRADeviceTaints": 33,
    "DRAExtendedResource": 34,
    "DRAListTypeAttributes": 36,
    "DRANodeAllocatableResources": 36,
    "DRAPartitionableDevices": 33,
    "DRAPrioritizedList": 33,
    "DRAResourceClaimDeviceStatus": 32,
    "ResourceHealthStatus": 31,
}


def gate_off_reason(
    gate: str,
    *,
    version: str,
    minor: int,
    listed: Mapping[str, tuple[str, bool]],
    enabled: Collection[str],
) -> str | None:
    """Why ``gate`` is off in a control plane of ``version``, or None when it is on.

    ``listed``: the release's DRA gates -> (maturity, default); ``enabled``: those that are on.
    """
    if gate in enabled:
        return None
    if gate in listed:
        stage, _ = listed[gate]
        return f"feature gate {gate} ({stage.lower()}) is off by default in Kubernetes {version}"
    since = GATE_SINCE.get(gate)
    if since is None:
        raise KeyError(f"unknown DRA feature gate {gate}: add it to GATE_SINCE")
    if minor < since:
        return f"Kubernetes {version} has no {gate} (new in 1.{since})"
    return None  # graduated: the gate is gone and the feature always on
