"""Fixtures for end-to-end tests against a real local control plane.

One control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager built
from the upstream Go modules by ``testenv/``) is started per session. Tests get their
own namespace and unique node names, and start ``kubelet-dra`` nodes as they need them.

Options: ``--keep-cluster`` (or ``DRA_KEEP_CLUSTER=1``) leaves the control plane running
after the session and prints its kubeconfig. ``DRA_TESTENV_BIN`` points at a prebuilt
testenv binary; otherwise it is built with ``make testenv`` (needs Go) for the release
``DRA_K8S_VERSION`` names (default: the newest in ``testenv/versions``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import (
    ClusterError,
    LocalCluster,
    ManagedProcess,
    NodeHandle,
    binary_path,
    repo_root,
    save_state,
)
from devenv.localcluster.releases import release_cache, selected_release
from dra_driver.kube import KubeClient

E2E_MARK = "e2e"
_started: list[LocalCluster] = []


def _keep_cluster(config: pytest.Config) -> bool:
    try:
        opt = bool(config.getoption("--keep-cluster"))
    except ValueError:
        opt = False
    return opt or os.environ.get("DRA_KEEP_CLUSTER", "") not in ("", "0")


def _binary_needs_build() -> bool:
    """True unless a prebuilt binary is given or the cached one is up to date."""
    # Otherwise `make` decides whether anything needs doing.
    return not os.environ.get("DRA_TESTENV_BIN")


def _skip_reason() -> str | None:
    if os.environ.get("DRA_TESTENV_BIN"):
        if binary_path().is_file():
            return None
        return f"DRA_TESTENV_BIN={binary_path()} does not exist"
    if shutil.which("go") is None:
        if binary_path().is_file():
            return None  # a build from earlier; cannot refresh it without Go
        return "e2e tests need Go to build the testenv control plane (`make testenv`)"
    if shutil.which("make") is None and not binary_path().is_file():
        return "e2e tests need `make` to build the testenv control plane"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if E2E_MARK in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str | None:
    path = binary_path()
    if not path.is_file():
        return f"e2e control plane: testenv binary not built yet ({path})"
    try:
        out = subprocess.run([str(path), "version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    gates = os.environ.get("DRA_K8S_GATES") or "all"
    return f"e2e control plane: Kubernetes {out.stdout.strip()}, feature gates: {gates} ({path})"


#: Where a run writes each e2e test's outcome, for the compatibility table
#: (``make test-versions`` sets it; ``hack/compat_table.py`` reads the files).
REPORT_ENV = "DRA_E2E_REPORT"
_outcomes: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not os.environ.get(REPORT_ENV) or E2E_MARK not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if _outcomes.get(report.nodeid, {}).get("outcome") != "failed":
            _outcomes[report.nodeid] = {"outcome": report.outcome, "reason": reason}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path or not _outcomes:
        return
    report = {
        "version": os.environ.get("DRA_K8S_VERSION", ""),
        "gates": os.environ.get("DRA_K8S_GATES") or "all",
        "tests": _outcomes,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for c in _started:
        terminalreporter.write_sep("-", "e2e control plane")
        gates = "every DRA feature gate on" if c.gates == "all" else "default feature gates"
        terminalreporter.write_line(f"tests ran against Kubernetes {c.version} ({gates}) at {c.server}")
        if c.keep:
            terminalreporter.write_line(f"kept running; logs in {c.logs_dir}")
            if save_state(c):
                terminalreporter.write_line("stop it with `make cluster-down`")
            terminalreporter.write_line(f"export KUBECONFIG={c.kubeconfig}")


def _build_binary() -> None:
    if not _binary_needs_build():
        return
    root = repo_root()
    log = release_cache(root, selected_release(root)) / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.run(
            [
                "make",
                "--no-print-directory",
                "-C",
                str(root),
                "-f",
                "testenv/testenv.mk",
                "testenv",
                f"K8S={selected_release(root)}",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()[-30:]
        pytest.fail("`make testenv` failed:\n" + "\n".join(lines), pytrace=False)
    took = time.monotonic() - t0
    if took > 5:
        print(f"\nbuilt testenv in {took:.0f}s")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The session's control plane (started once; stopped at the end unless kept)."""
    _build_binary()
    keep = _keep_cluster(request.config)
    base = None
    if keep:
        base = repo_root() / ".cache" / "e2e-cluster" / time.strftime("%Y%m%d-%H%M%S")
    c = LocalCluster(base_dir=base, keep=keep)
    try:
        c.start()
    except ClusterError as e:
        pytest.fail(f"control plane did not start: {e}", pytrace=False)
    _started.append(c)
    try:
        yield c
    finally:
        if not keep:
            c.stop()


@pytest.fixture(scope="session")
def kube_api(cluster: LocalCluster) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` for the admin kubeconfig."""
    from kubernetes import config as kconfig

    client = kconfig.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def kube_client(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    """The driver's API client for the admin kubeconfig, bound to the test's loop."""
    async with await KubeClient.create(str(cluster.kubeconfig)) as client:
        yield client


def _short_id() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name(prefix)`` -> a DNS-label name unique to this test and call."""

    def make(prefix: str) -> str:
        return f"{prefix}-{_short_id()}"[:63].strip("-")

    return make


def _test_slug(request: pytest.FixtureRequest, limit: int = 30) -> str:
    name = request.node.name.lower()
    slug = "".join(c if c.isalnum() else "-" for c in name)
    slug = "-".join(filter(None, slug.split("-")))
    return slug[:limit].strip("-") or "test"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube_api: Any) -> Iterator[str]:
    """A fresh namespace for the test (with its default ServiceAccount); deleted afterwards."""
    from kubernetes import client as k

    core = k.CoreV1Api(kube_api)
    name = f"e2e-{_test_slug(request, 40)}-{_short_id()}"
    core.create_namespace({"metadata": {"name": name, "labels": {"e2e": "true"}}})
    # Pod admission needs the default ServiceAccount, which a controller creates. Right after
    # a test restarted the API server, the controller's watch may still be backing off; the
    # test is not about that controller, so the account is created here if it is late.
    ensure_default_service_account(core, name)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except Exception as e:  # the cluster may be gone already
            print(f"deleting namespace {name}: {e}")


def ensure_default_service_account(core: Any, namespace: str, wait: float = 15.0) -> None:
    """Wait `wait` seconds for the controller to create `namespace`'s default ServiceAccount,
    then create it here (pod admission needs it; the controller is not under test)."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _exists(lambda: core.read_namespaced_service_account("default", namespace)):
            return
        time.sleep(0.2)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    except ApiException as e:
        if e.status != 409:  # the controller got there first
            raise


@pytest.fixture
def node_name(unique_name: Callable[[str], str]) -> str:
    """A node name unique to this test."""
    return unique_name("node")


@pytest.fixture
def make_node(
    cluster: LocalCluster, kube_api: Any, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., NodeHandle]]:
    """``make_node(name=None, labels=None, **kw)`` starts a kubelet-dra node (Ready on return).

    Nodes are stopped and their Node objects deleted when the test ends.
    """
    from kubernetes import client as k

    made: list[str] = []

    def make(
        name: str | None = None, labels: Mapping[str, str] | None = None, **kw: Any
    ) -> NodeHandle:
        node = cluster.add_node(name or unique_name("node"), labels, **kw)
        made.append(node.name)
        return node

    yield make
    core = k.CoreV1Api(kube_api)
    for name in made:
        cluster.stop_node(name)
        try:
            core.delete_node(name)
        except Exception as e:
            print(f"deleting node {name}: {e}")


@dataclass
class PluginHandle:
    """A running ``testenv testplugin`` registered on a node."""

    driver: str
    node: NodeHandle
    process: ManagedProcess

    @property
    def plugin_dir(self) -> Path:
        return self.node.plugin_dir(self.driver)

    def calls(self) -> list[dict[str, Any]]:
        """The prepare/unprepare calls the plugin received so far."""
        try:
            lines = (self.plugin_dir / "calls.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self.node.cdi_dir / f"{self.driver}-claim_{claim_uid}.json"


@pytest.fixture
def start_testplugin(cluster: LocalCluster) -> Iterator[Callable[..., PluginHandle]]:
    """``start_testplugin(node, driver, devices=2)`` runs the trivial test DRA plugin."""
    started: list[str] = []

    def start(node: NodeHandle, driver: str, devices: int = 2, *extra: str) -> PluginHandle:
        name = f"testplugin-{node.name}-{driver}"
        proc = cluster.spawn(
            name,
            [
                str(binary_path() if cluster.binary is None else cluster.binary),
                "testplugin",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--driver-name={driver}",
                f"--node-name={node.name}",
                f"--registry-dir={node.registry_dir}",
                f"--plugin-dir={node.plugin_dir(driver)}",
                f"--cdi-dir={node.cdi_dir}",
                f"--devices={devices}",
                *extra,
            ],
        )
        started.append(name)
        return PluginHandle(driver, node, proc)

    yield start
    for name in started:
        cluster.stop_process(name)


# ------------------------------------------------------------------------------------
# small polling helpers shared by e2e tests
# ------------------------------------------------------------------------------------


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy and return that; fail on timeout."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as e:
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc})" if last_exc else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}{detail}", pytrace=False)
        time.sleep(interval)


def _exists(read: Callable[[], Any]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a typed client method and return the JSON body as plain data.

    Avoids the client's model classes, which may lag behind the server's API.
    """
    resp = call(*args, _preload_content=False, **kwargs)
    return json.loads(resp.data)


def gone(read: Callable[[], Any]) -> bool:
    """True once `read()` raises 404."""
    return not _exists(read)


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Any]:
    """``wait_until(check, timeout, what)``: poll until truthy, fail the test on timeout."""
    return wait_until


# Fixtures of the driver's own end-to-end tests (GPU nodes, the DeviceClass).
from tests.e2e.gpu import gpu_class, gpu_node  # noqa: E402, F401
from tests.e2e.mig import device_classes, mig_node, profile  # noqa: E402, F401
