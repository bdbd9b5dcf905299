"""CUDA's libraries reach a container from the claim's CDI spec alone, and its loader finds them.

The node's driver root is a simulated NVIDIA driver installation (tests/driverroot.py, made
by ``make node-up``): real shared objects with the real names and sonames, next to an older
driver's leftover ``libcuda.so.1``. The agent (Helm chart, ``driverRoot``) finds them and
writes them into the claim's CDI spec; containerd and runc mount them. The pod runs a glibc
image (the driver's own image: a Debian bookworm root whose ``/etc/ld.so.cache`` knows no
NVIDIA library) with two small programs built on the host from ``loadcheck.c``:

- ``dlopen-check`` opens ``libcuda.so.1`` and ``libnvidia-ml.so.1`` by name, as the CUDA
  runtime and NVML users do;
- ``linked-check`` is linked against both, so the loader must resolve them before ``main``.

Both run under the image's own dynamic loader. ``ldconfig -p`` alone would prove nothing: the
spec does not rebuild the image's cache (that takes a hook binary on the host), so the cache
is the control showing that the loader found the libraries without it, in its built-in
system directories. Last, the agent reports the prepared device in the claim's status.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.driverroot import BINARIES, FIRMWARE, OLD_VERSION, SOCKETS, VERSION
from tests.node.loadcheck import (
    CHECK_DIR,
    LOADED,
    TRIPLET_DIR,
    build,
    expected_libraries,
    loaded,
    script,
    search_of,
    sections,
)
from tests.node.probe import Node, mount_options, wait_until

pytestmark = pytest.mark.node

#: nvmlInit_v2 of the stand-in libnvidia-ml where its data is missing, as NVML answers without
#: a loaded driver (NVML_ERROR_DRIVER_NOT_LOADED): a container has the library, not the data.
NVML_WITHOUT_DRIVER = "9"
#: What each library's entry point returns in a container.
RESULTS = {"libnvidia-ml.so.1": NVML_WITHOUT_DRIVER}


def driver_library_dir(node: Node) -> Path:
    """Where the node's simulated driver root keeps its libraries (on the host)."""
    return node.base / "driver-root" / TRIPLET_DIR.lstrip("/")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def programs(node: Node) -> Iterator[Path]:
    """dlopen-check and linked-check, built on the host (the image has no compiler)."""
    libs = driver_library_dir(node)
    if not (libs / f"libcuda.so.{VERSION}").is_file():
        pytest.fail(f"no simulated driver root at {libs}: start the node with `make node-up`")
    build(node.base / "loadcheck", libs)
    yield node.base / "loadcheck"


def test_container_loader_resolves_the_driver_libraries(
    node: Node, namespace: str, programs: Path
) -> None:
    libs = driver_library_dir(node)
    expected = expected_libraries(libs)
    image = node.driver_pods()[0].spec.containers[0].image

    def loadcheck_pod(pod: dict[str, Any]) -> None:
        pod["spec"]["terminationGracePeriodSeconds"] = 2
        pod["spec"]["volumes"] = [
            {"name": "loadcheck", "hostPath": {"path": str(programs), "type": "Directory"}}
        ]
        (container,) = pod["spec"]["containers"]
        container.update(
            image=image,
            imagePullPolicy="Never",
            command=["sh", "-c", script(sorted(expected))],
            volumeMounts=[{"name": "loadcheck", "mountPath": CHECK_DIR, "readOnly": True}],
        )

    (pod,) = node.apply_example("single-gpu", namespace, probe=loadcheck_pod)
    log = node.log_until(namespace, pod, "CHECK-END")
    out = sections(log)

    # Each library under each of its names, in both directories: the driver root's file of
    # the kernel module's version (the older driver's libcuda.so.1 has another content).
    pairs = [line.split() for line in out["HASHES"]]
    hashes = {p[1]: p[0] for p in pairs if len(p) == 2}  # else "sha256sum: <path>: No such..."
    assert hashes == {path: sha256(real) for path, real in expected.items()}, log
    assert sha256(libs / f"libcuda.so.{OLD_VERSION}") not in hashes.values()
    # Nothing else of the driver's (no leftover of the old version), all read-only mounts.
    assert set(out["LIST"]) == set(expected), log
    for path in expected:
        assert "ro" in (mount_options(out["MOUNTS"], path) or []), (path, log)

    # The control: the image's own loader cache is real and knows none of them, and nothing
    # points the loader elsewhere.
    cache = "\n".join(out["LDCONFIG"])
    assert "libc.so.6" in cache, log
    assert "libcuda" not in cache and "libnvidia" not in cache, log
    assert not any(line.startswith("LD_LIBRARY_PATH=") for line in out["ENV"]), log

    # dlopen by soname, and a program linked against both: the loader gave the driver's
    # library of the kernel module's version from the system directory; its entry point ran.
    assert out["DLOPEN"][-1] == "exit=0", log
    assert out["LINKED"][-1] == "exit=0", log
    # The stand-in libnvidia-ml finds no GPU data in a container (it lives on the host, for
    # the agent): it answers as NVML does without a loaded driver (9). It ran all the same.
    assert f"CALLED cuInit=0 nvmlInit_v2={NVML_WITHOUT_DRIVER}" in out["LINKED"], log
    for section in ("DLOPEN", "LINKED"):
        found = loaded(out[section])
        assert set(found) == set(LOADED), log
        for soname, symbol in LOADED.items():
            assert found[soname]["real"] == f"{TRIPLET_DIR}/{soname}", log
            assert found[soname][symbol] == RESULTS.get(soname, "0"), log
            assert found[soname]["version"] == VERSION, log

    # How: the cache missed, the loader's built-in system search path had them.
    found = loaded(out["DLOPEN"])
    for soname in LOADED:
        search = search_of(out["TRACE"], soname)
        assert search[:1] == ["search cache=/etc/ld.so.cache"], out["TRACE"]
        assert search[1:2] and search[1].startswith("search path="), search
        assert search[1].endswith("(system search path)"), search
        assert f"trying file={found[soname]['path']}" in search, search

    # The tools, the firmware and the daemons' sockets came with them.
    tools = out["TOOLS"]
    assert f"NVIDIA-SMI version  : {VERSION}" in tools, log
    assert set(FIRMWARE) <= set(tools), log
    assert {f"socket /{s}" for s in SOCKETS} <= set(tools), log
    for binary in BINARIES:
        assert mount_options(out["MOUNTS"], f"/usr/bin/{binary}") is not None, log

    # The agent reports the prepared device on the claim (its service account may write
    # status.devices of its driver on claims of its node).
    claim = node.claim_names(namespace, pod)[0]
    claims = node.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")

    def device_status() -> list[Any] | None:
        status = claims.get(name=claim, namespace=namespace).to_dict().get("status") or {}
        return status.get("devices") or None

    (reported,) = wait_until(device_status, "status.devices on the claim")
    assert reported["driver"] == "gpu.dra.dev"
