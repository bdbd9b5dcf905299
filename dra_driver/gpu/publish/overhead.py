"""The host resources a GPU costs its node, declared so the scheduler accounts for them.

A pod using a GPU costs the node more than its containers ask for: pinned host memory of
the CUDA context, an MPS control daemon, the driver's per-process state. With node-allocatable
resources (resource.k8s.io/v1 ``nodeAllocatableResources``, DRANodeAllocatableResources, the
shape of Kubernetes 1.37) each device declares that overhead per pod; the scheduler subtracts
it from the node's allocatable resources and the kubelet adds it to the pod's cgroup.

``--node-overhead memory=512Mi,cpu=100m`` is parsed here, pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.quantity import QuantityError, parse_quantity

FIELD = "nodeAllocatableResources"
_NAMES = re.compile(r"^(cpu|memory|ephemeral-storage|hugepages-[0-9]+[KMGTPE]i?)$")


class OverheadError(DriverError):
    """--node-overhead is not a list of node resources and quantities."""


def parse_overhead(text: str) -> dict[str, str]:
    """``"memory=512Mi,cpu=100m"`` -> {"memory": "512Mi", "cpu": "100m"} (empty: none)."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _NAMES.match(name):
            raise OverheadError(
                f"--node-overhead: {item!r} must be RESOURCE=QUANTITY with a node resource "
                "(cpu, memory, ephemeral-storage, hugepages-<size>), e.g. memory=512Mi"
            )
        try:
            amount = parse_quantity(value)
        except QuantityError as exc:
            raise OverheadError(f"--node-overhead: {name}: {exc}") from None
        if amount.sign() <= 0:
            raise OverheadError(f"--node-overhead: {name}: {value} must be more than 0")
        if name in out:
            raise OverheadError(f"--node-overhead: {name} is given twice")
        out[name] = value
    return out


def overhead_fields(overhead: Mapping[str, str]) -> dict[str, Any]:
    """The device fields that declare ``overhead`` per pod (nothing for none)."""
    if not overhead:
        return {}
    return {FIELD: {name: {"overhead": {"perPod": value}} for name, value in overhead.items()}}
