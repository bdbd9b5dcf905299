"""CUDA's view from a container whose only source of driver files is the claim's CDI spec.

The node has no NVIDIA driver, so the test makes one: ``tests/driverroot.py`` builds real
shared objects with the driver's file names and sonames (``libcuda.so.<version>``, soname
``libcuda.so.1``, exporting ``cuInit``), its tools, GSP firmware, the kernel module's version
file and the daemons' sockets in a directory on the host, and the chart points the agent's
driver root there. A pod with a GPU claim then runs a Debian image (the driver's own, which
has Python and glibc's loader) whose loader cache knows nothing of the driver, and reports
what it sees: each library at its path in the image's library directories, ``dlopen`` of
``libcuda.so.1`` and ``libnvidia-ml.so.1`` by soname and a call into each, the tools, the
firmware and the sockets.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.driverroot import FIRMWARE, LIBRARIES, OLD_VERSION, SOCKETS, DriverRoot, make_driver_root
from tests.node.probe import Node, wait_until

pytestmark = pytest.mark.node

DRIVER_IMAGE = "localhost/dra-driver:dev"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"

# Runs in the container; prints one line: REPORT <json>.
REPORT = r"""
import ctypes, json, os, stat, subprocess, time
out = {}


def check(name, fn):
    try:
        out[name] = fn()
    except Exception as exc:  # reported, so the test says what failed
        out[name] = f"{type(exc).__name__}: {exc}"


def call(soname, symbol):
    return getattr(ctypes.CDLL(soname), symbol)()


def cache_knows_libcuda():
    with open("/etc/ld.so.cache", "rb") as cache:
        return b"libcuda" in cache.read()


libs = json.loads(os.environ["LIBS"])
dirs = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")
check("files", lambda: {f"{d}/{n}": os.path.isfile(f"{d}/{n}") for d in dirs for n in libs})
check("calls", lambda: {s: call(s, f) for s, f in (("libcuda.so.1", "cuInit"), ("libnvidia-ml.so.1", "nvmlInit_v2"))})
check("cache_knows_libcuda", cache_knows_libcuda)
check("smi", lambda: subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout.strip())
check("firmware", lambda: sorted(os.listdir(os.environ["FIRMWARE_DIR"])))
check("sockets", lambda: {p: stat.S_ISSOCK(os.stat(p).st_mode) for p in json.loads(os.environ["SOCKETS"])})
check("visible", lambda: os.environ.get("NVIDIA_VISIBLE_DEVICES"))
check("old", lambda: os.path.exists("/usr/lib/x86_64-linux-gnu/" + os.environ["OLD"]))
print("REPORT " + json.dumps(out), flush=True)
time.sleep(300)  # keep the claim prepared while the test looks at its status
"""


def _empty(directory: Path) -> None:
    """Remove what is in ``directory`` (a mount point: the directory itself stays)."""
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@pytest.fixture
def driver_root(node: Node) -> Iterator[DriverRoot]:
    # The chart's driverRoot on this node: an empty directory until now (no driver).
    root = node.base / "driver-root"
    _empty(root)
    made = make_driver_root(root)
    node.restart_driver()  # the agent finds the driver's files when it starts
    yield made
    _empty(root)
    node.restart_driver()


def _claim_and_pod(made: DriverRoot) -> list[dict[str, Any]]:
    libraries = [f"{name}.so.{made.version}" for name, _, _ in LIBRARIES]
    libraries += [soname for _, soname, _ in LIBRARIES]
    env = {
        "LIBS": json.dumps(libraries),
        "FIRMWARE_DIR": f"/lib/firmware/nvidia/{made.version}",
        "SOCKETS": json.dumps(["/" + s for s in SOCKETS]),
        "OLD": f"libcuda.so.{OLD_VERSION}",
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cuda-view"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
            "containers": [
                {
                    "name": "app",
                    "image": DRIVER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", REPORT],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    return [claim, pod]


def test_cuda_finds_the_driver_from_the_cdi_spec_alone(
    node: Node, driver_root: DriverRoot, namespace: str
) -> None:
    for obj in _claim_and_pod(driver_root):
        node.create(obj, namespace)

    def report() -> dict[str, Any] | None:
        try:
            log = node.core.read_namespaced_pod_log("cuda-view", namespace, container="app")
        except Exception:  # not started yet
            return None
        for line in (log or "").splitlines():
            if line.startswith("REPORT "):
                parsed: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
                return parsed
        return None

    try:
        seen = wait_until(report, "the container's report")
    except AssertionError as e:
        try:
            log = node.core.read_namespaced_pod_log("cuda-view", namespace, container="app")
        except Exception as exc:  # the log is only for the message
            log = f"(no log: {exc})"
        raise AssertionError(f"{e}\n{node.describe(namespace, 'cuda-view')}\n{log}") from None

    missing = [path for path, there in seen["files"].items() if not there]
    assert missing == [], seen
    # The loader resolves both sonames and the functions run (they return 0), although the
    # image's loader cache does not list the libraries: the mounts are in glibc's own
    # default directories.
    assert seen["calls"] == {"libcuda.so.1": 0, "libnvidia-ml.so.1": 0}, seen
    assert seen["cache_knows_libcuda"] is False
    assert seen["smi"] == f"nvidia-smi {driver_root.version}"
    assert seen["firmware"] == sorted(FIRMWARE)
    assert seen["sockets"] == {"/" + s: True for s in SOCKETS}
    assert seen["visible"] and seen["visible"].startswith("GPU-")
    # An older driver's library left on the host is not the loaded module's: not mounted.
    assert seen["old"] is False

    # The agent reports the prepared device on the claim (its service account may write
    # status.devices of its driver on claims of its node).
    claims = node.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")

    def device_status() -> list[Any] | None:
        status = claims.get(name="gpu", namespace=namespace).to_dict().get("status") or {}
        return status.get("devices") or None

    (reported,) = wait_until(device_status, "status.devices on the claim")
    assert reported["driver"] == "gpu.dra.dev"
