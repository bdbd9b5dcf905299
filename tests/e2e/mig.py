"""Fixtures for dynamic MIG end to end: a node with one simulated H100 in dynamic MIG mode.

Registered through conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.simnode import GpuNode
from dra_driver import faults
from tests.e2e.conftest import wait_until
from tests.e2e.gpu import published_devices

DRIVER = "gpu.dra.dev"
MIG_CLASS = "mig.gpu.dra.dev"
DYNAMIC = ["--dynamic-mig=true"]
SINGLE_H100 = """\
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
gpus:
  - {product: NVIDIA H100 80GB HBM3, pciBusId: "0000:1b:00.0", pcieRoot: pci0000:15, numaNode: 0}
"""


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "single-h100.yaml"
    path.write_text(SINGLE_H100)
    return str(path)


@pytest.fixture(scope="module")
def device_classes(kube_api: Any) -> None:
    from kubernetes import client as k

    api = k.ResourceV1Api(kube_api)
    for name, kind in ((DRIVER, "gpu"), (MIG_CLASS, "mig")):
        expr = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'
        body: Any = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        try:
            api.create_device_class(body)
        except k.exceptions.ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture
def mig_node(
    gpu_node: Callable[..., GpuNode], kube_api: Any, profile: str
) -> Callable[..., GpuNode]:
    """``mig_node(points="")``: a node with one H100 and the driver in dynamic MIG mode."""

    def make(points: str = "") -> GpuNode:
        env = {faults.ENV: points} if points else {}
        node = gpu_node(profile, prefix="mig", extra=DYNAMIC, env=env)
        wait_until(
            lambda: len(published_devices(kube_api, node.name)) == 26, 30, "placements published"
        )
        return node

    return make
