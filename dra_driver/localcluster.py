"""A local Kubernetes control plane for tests and the demo.

`LocalCluster` runs the binaries of the ``testenv`` Go module (``make testenv``) as
subprocesses on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, plus one ``kubelet-dra`` process per node (the kubelet's
own DRA manager and plugin watcher, without containers). It knows nothing about
GPUs. Everything lives in one base directory::

    <base>/pki/            service-account keys, CA, serving certificate
    <base>/etcd/           etcd data
    <base>/logs/<name>.log one log per component
    <base>/kubeconfig      admin kubeconfig (static token in system:masters)
    <base>/nodes/<name>/   kubelet root dir of a node: plugins_registry/, plugins/,
                           cdi/, pods/<namespace>_<name>.json records, health.json

Command line (used by ``make cluster`` / ``make cluster-down``)::

    python -m dra_driver.localcluster up [--node NAME[:k=v,...]]...
    python -m dra_driver.localcluster down
    python -m dra_driver.localcluster status
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.errors import DriverError

__all__ = [
    "DEFAULT_CONTROLLERS",
    "ClusterError",
    "LocalCluster",
    "ManagedProcess",
    "NodeHandle",
    "Ports",
    "apiserver_flags",
    "binary_path",
    "controller_manager_flags",
    "etcd_flags",
    "kubelet_flags",
    "parse_node_spec",
    "pick_free_ports",
    "render_kubeconfig",
    "repo_root",
    "save_state",
    "scheduler_flags",
    "tail",
    "token_auth_line",
    "wait_for",
]

#: Controllers kube-controller-manager runs. Names are those of the pinned release.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "resourcepoolstatusrequest-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "job-controller",
    "validatingadmissionpolicy-status-controller",
)

ADMIN_USER = "testenv-admin"
ADMIN_GROUPS = ("system:masters",)
SERVICE_CIDR = "10.0.0.0/24"
LOG_TAIL_LINES = 40
STATE_FILE = "state.json"
PORT_ATTEMPTS = 3
CONTROL_PLANE_STOP_ORDER = ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd")


class ClusterError(DriverError, RuntimeError):
    """A control-plane component failed to start or a wait timed out."""


# --------------------------------------------------------------------------------------
# Pure helpers (unit-tested)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the control-plane components."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*pick_free_ports(5))


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return `count` distinct free TCP ports on `host`.

    All sockets are held open until every port is chosen, so the ports are distinct;
    another process may still grab one before it is used (callers retry on failure).
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def token_auth_line(token: str, user: str, uid: str, groups: Sequence[str]) -> str:
    """One line of a kube-apiserver ``--token-auth-file`` (CSV: token,user,uid,"groups")."""
    for part in (token, user, uid, *groups):
        if not part or any(c in part for c in ',"\n'):
            raise ValueError(f"invalid token file field {part!r}")
    line = f"{token},{user},{uid}"
    if groups:
        line += ',"' + ",".join(groups) + '"'
    return line


def render_kubeconfig(
    server: str,
    token: str,
    *,
    ca_data: bytes | None = None,
    cluster: str = "testenv",
    user: str = "admin",
) -> str:
    """Render a kubeconfig with one cluster, one token user and one current context.

    Without `ca_data` the server certificate is not verified.
    """
    cluster_entry: dict[str, Any] = {"server": server}
    if ca_data is None:
        cluster_entry["insecure-skip-tls-verify"] = True
    else:
        cluster_entry["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def etcd_flags(data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    return [
        "--data-dir",
        str(data_dir),
        "--listen-client-url",
        f"http://127.0.0.1:{client_port}",
        "--listen-peer-url",
        f"http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync",
    ]


def apiserver_flags(
    *,
    port: int,
    etcd_port: int,
    pki_dir: Path,
    cert_dir: Path,
    token_file: Path,
    feature_gates: str,
    runtime_config: str,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """Flags for the upstream kube-apiserver, secure port on loopback only."""
    flags = [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Endpoints may not be loopback addresses; nothing here needs them.
        "--endpoint-reconciler-type=none",
        # Close open watches on SIGTERM so a stop/restart takes ~1 s, not the 60 s
        # request timeout.
        "--shutdown-watch-termination-grace-period=2s",
        # Front-proxy settings, so delegated authentication in the scheduler and the
        # controller manager finds a complete extension-apiserver-authentication map.
        f"--requestheader-client-ca-file={pki_dir / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--allow-privileged=true",
        "--profiling=false",
        f"--v={verbosity}",
    ]
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    if runtime_config:
        flags.append(f"--runtime-config={runtime_config}")
    return flags + list(extra)


def _component_common(
    *, port: int, kubeconfig: Path, cert_dir: Path, feature_gates: str, verbosity: int
) -> list[str]:
    flags = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--v={verbosity}",
    ]
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    return flags


def scheduler_flags(
    *,
    port: int,
    kubeconfig: Path,
    cert_dir: Path,
    feature_gates: str,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    return _component_common(
        port=port,
        kubeconfig=kubeconfig,
        cert_dir=cert_dir,
        feature_gates=feature_gates,
        verbosity=verbosity,
    ) + list(extra)


def controller_manager_flags(
    *,
    port: int,
    kubeconfig: Path,
    cert_dir: Path,
    pki_dir: Path,
    feature_gates: str,
    controllers: Iterable[str] = DEFAULT_CONTROLLERS,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    common = _component_common(
        port=port,
        kubeconfig=kubeconfig,
        cert_dir=cert_dir,
        feature_gates=feature_gates,
        verbosity=verbosity,
    )
    return [
        *common,
        "--use-service-account-credentials=false",
        f"--controllers={','.join(controllers)}",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}",
        f"--root-ca-file={pki_dir / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *extra,
    ]


def kubelet_flags(
    *,
    kubeconfig: Path,
    node_name: str,
    root_dir: Path,
    labels: Mapping[str, str],
    cdi_dirs: Sequence[Path],
    feature_gates: str,
    verbosity: int = 2,
    extra: Sequence[str] = (),
) -> list[str]:
    flags = [
        f"--kubeconfig={kubeconfig}",
        f"--node-name={node_name}",
        f"--root-dir={root_dir}",
        f"--v={verbosity}",
    ]
    for key, value in sorted(labels.items()):
        flags.append(f"--node-label={key}={value}")
    for d in cdi_dirs:
        flags.append(f"--cdi-dir={d}")
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    return flags + list(extra)


def parse_node_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Parse ``NAME`` or ``NAME:k=v,k2=v2`` (the ``up --node`` syntax)."""
    name, _, rest = spec.partition(":")
    if not name:
        raise ValueError(f"empty node name in {spec!r}")
    labels: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad label {item!r} in {spec!r}: want key=value")
        labels[key] = value
    return name, labels


def repo_root() -> Path:
    """The repository root: the directory above the ``dra_driver`` package."""
    return Path(__file__).resolve().parent.parent


def binary_path() -> Path:
    """Where the testenv binary is: ``$DRA_TESTENV_BIN`` or ``.cache/testenv/bin/testenv``."""
    env = os.environ.get("DRA_TESTENV_BIN")
    if env:
        return Path(env)
    return repo_root() / ".cache" / "testenv" / "bin" / "testenv"


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


@dataclass
class ManagedProcess:
    """A subprocess in its own process group, logging to one file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    pid: int | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal the whole process group, escalate to SIGKILL after `timeout`."""
        if self.pid is None:
            return
        _kill_group(self.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                break
            time.sleep(0.05)
        else:
            _kill_group(self.pid, signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        # Anything left in the group (children) goes too.
        _kill_group(self.pid, signal.SIGKILL)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------


@dataclass
class NodeHandle:
    """A kubelet-dra node: its directories and process."""

    name: str
    root_dir: Path
    labels: dict[str, str]
    cdi_dirs: list[Path]
    process: ManagedProcess

    @property
    def registry_dir(self) -> Path:
        """Where plugins put their registration sockets (the kubelet's plugins_registry)."""
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """Parent of per-driver plugin directories (the kubelet's plugins/)."""
        return self.root_dir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        """The CDI spec directory with the highest priority (the last --cdi-dir)."""
        return self.cdi_dirs[-1]

    @property
    def records_dir(self) -> Path:
        return self.root_dir / "pods"

    @property
    def health_file(self) -> Path:
        return self.root_dir / "health.json"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def plugin_dir(self, driver: str) -> Path:
        return self.plugins_dir / driver

    def pod_record(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The record kubelet-dra wrote for a pod, or None if there is none."""
        path = self.records_dir / f"{namespace}_{name}.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data

    def wait_pod_record(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Poll until the pod record exists (and satisfies `predicate`)."""
        last: dict[str, Any] | None = None

        def check() -> bool:
            nonlocal last
            last = self.pod_record(namespace, name)
            return last is not None and (predicate is None or predicate(last))

        wait_for(check, timeout, f"pod record {namespace}/{name} on {self.name}", self.process)
        assert last is not None
        return last

    def health(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.health_file.read_text())
        except (OSError, ValueError):
            return None
        return data

    def alive(self) -> bool:
        return self.process.alive()


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    process: ManagedProcess | None = None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until it returns True; raise ClusterError with the log tail on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if process is not None and not process.alive():
            raise ClusterError(
                f"{process.name} exited (code {process.returncode()}) while waiting for {what}; "
                f"log {process.log_path}:\n{process.log_tail()}"
            )
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:.0f}s waiting for {what}"
            if process is not None:
                msg += f"; log {process.log_path}:\n{process.log_tail()}"
            raise ClusterError(msg)
        time.sleep(interval)


# --------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """A local control plane built from upstream Kubernetes (see module docstring).

    Use as a context manager or call `start()` / `stop()`. Without `base_dir` a temporary
    directory is used and removed by `stop()` unless `keep` is set; a given `base_dir` is
    never removed.
    """

    base_dir: Path | None = None
    binary: Path | None = None
    keep: bool = False
    verbosity: int = 2
    start_timeout: float = 120.0
    controllers: tuple[str, ...] = DEFAULT_CONTROLLERS
    apiserver_extra_args: tuple[str, ...] = ()

    token: str = field(default_factory=lambda: secrets.token_hex(16))
    ports: Ports | None = None
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    _owns_base: bool = False
    _version: str | None = None
    _feature_gates: str | None = None
    _runtime_config: str | None = None

    # -- paths ----------------------------------------------------------------------

    @property
    def base(self) -> Path:
        if self.base_dir is None:
            raise ClusterError("cluster not started")
        return self.base_dir

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.base / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.base / "logs"

    @property
    def server(self) -> str:
        if self.ports is None:
            raise ClusterError("cluster not started")
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    def log_path(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    # -- binary queries -------------------------------------------------------------

    def _binary(self) -> Path:
        path = self.binary or binary_path()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ClusterError(
                f"testenv binary not found at {path}; run `make testenv` "
                "(or set DRA_TESTENV_BIN to a built binary)"
            )
        return path

    def _query(self, *args: str) -> str:
        out = subprocess.run(
            [str(self._binary()), *args], capture_output=True, text=True, timeout=60
        )
        if out.returncode != 0:
            raise ClusterError(f"testenv {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout.strip()

    @property
    def version(self) -> str:
        """The Kubernetes version of the control plane (from `testenv version`)."""
        if self._version is None:
            self._version = self._query("version")
        return self._version

    @property
    def feature_gates(self) -> str:
        """The ``--feature-gates`` value enabling every DRA gate of the release."""
        if self._feature_gates is None:
            self._feature_gates = self._query("feature-gates")
        return self._feature_gates

    @property
    def runtime_config(self) -> str:
        if self._runtime_config is None:
            self._runtime_config = self._query("runtime-config")
        return self._runtime_config

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd, kube-apiserver, kube-scheduler and kube-controller-manager."""
        binary = self._binary()
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="dra-testenv-"))
            self._owns_base = True
        self.base_dir = self.base_dir.resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        try:
            self._run_keys(binary)
            (self.base / "tokens.csv").write_text(
                token_auth_line(self.token, ADMIN_USER, "testenv-admin-uid", ADMIN_GROUPS) + "\n"
            )
            os.chmod(self.base / "tokens.csv", 0o600)
            for attempt in range(PORT_ATTEMPTS):
                try:
                    self._start_components()
                    return
                except ClusterError as e:
                    # Another process may take a picked port before we bind it.
                    if "address already in use" not in str(e) or attempt + 1 == PORT_ATTEMPTS:
                        raise
                    self._stop_processes()
                    shutil.rmtree(self.base / "etcd", ignore_errors=True)
        except BaseException:
            # Keep the directory: the logs explain the failure.
            self.stop(keep=True)
            raise

    def _start_components(self) -> None:
        self.ports = Ports.pick()
        self._start_etcd()
        self.start_apiserver()
        self._write_kubeconfig()
        self._start_scheduler()
        self._start_controller_manager()

    def _run_keys(self, binary: Path) -> None:
        out = subprocess.run(
            [str(binary), "keys", "--dir", str(self.pki_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise ClusterError(f"testenv keys failed: {out.stderr.strip()}")

    def _spawn(
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        old = self.processes.get(name)
        if old is not None and old.alive():
            raise ClusterError(f"{name} is already running (pid {old.pid})")
        proc = ManagedProcess(name, [str(self._binary()), *args], self.log_path(name), env)
        proc.start()
        self.processes[name] = proc
        return proc

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        """Start any extra process (a driver, a plugin); `stop()` stops it too.

        It logs to ``<base>/logs/<name>.log``; `argv[0]` is the program.
        """
        old = self.processes.get(name)
        if old is not None and old.alive():
            raise ClusterError(f"{name} is already running (pid {old.pid})")
        proc = ManagedProcess(name, list(argv), self.log_path(name), env)
        proc.start()
        self.processes[name] = proc
        return proc

    def stop_process(self, name: str, timeout: float = 10.0) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop(timeout)

    def _start_etcd(self) -> None:
        assert self.ports is not None
        proc = self._spawn(
            "etcd",
            ["etcd", *etcd_flags(self.base / "etcd", self.ports.etcd_client, self.ports.etcd_peer)],
        )
        wait_for(
            lambda: (
                _http_ok(f"http://127.0.0.1:{self.ports.etcd_client}/health")
                if self.ports
                else False
            ),
            self.start_timeout,
            "etcd /health",
            proc,
        )

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port and etcd; waits for /readyz."""
        assert self.ports is not None
        flags = apiserver_flags(
            port=self.ports.apiserver,
            etcd_port=self.ports.etcd_client,
            pki_dir=self.pki_dir,
            cert_dir=self.base / "apiserver-certs",
            token_file=self.base / "tokens.csv",
            feature_gates=self.feature_gates,
            runtime_config=self.runtime_config,
            verbosity=min(self.verbosity, 2),
            extra=self.apiserver_extra_args,
        )
        proc = self._spawn("kube-apiserver", ["kube-apiserver", *flags])
        wait_for(
            lambda: self._apiserver_get("/readyz") == 200,
            self.start_timeout,
            "kube-apiserver /readyz",
            proc,
            interval=0.25,
        )

    def stop_apiserver(self, timeout: float = 15.0) -> None:
        """Stop kube-apiserver (etcd and everything else keep running)."""
        self.stop_process("kube-apiserver", timeout)

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def apiserver_running(self) -> bool:
        proc = self.processes.get("kube-apiserver")
        return proc is not None and proc.alive()

    def _write_kubeconfig(self) -> None:
        text = render_kubeconfig(self.server, self.token, ca_data=self.ca_file.read_bytes())
        self.kubeconfig.write_text(text)
        os.chmod(self.kubeconfig, 0o600)

    def _start_scheduler(self) -> None:
        assert self.ports is not None
        flags = scheduler_flags(
            port=self.ports.scheduler,
            kubeconfig=self.kubeconfig,
            cert_dir=self.base / "scheduler-certs",
            feature_gates=self.feature_gates,
            verbosity=self.verbosity,
        )
        proc = self._spawn("kube-scheduler", ["kube-scheduler", *flags])
        url = f"https://127.0.0.1:{self.ports.scheduler}/healthz"
        wait_for(lambda: _https_ok(url), self.start_timeout, "kube-scheduler /healthz", proc)

    def _start_controller_manager(self) -> None:
        assert self.ports is not None
        flags = controller_manager_flags(
            port=self.ports.controller_manager,
            kubeconfig=self.kubeconfig,
            cert_dir=self.base / "controller-manager-certs",
            pki_dir=self.pki_dir,
            feature_gates=self.feature_gates,
            controllers=self.controllers,
            verbosity=self.verbosity,
        )
        proc = self._spawn("kube-controller-manager", ["kube-controller-manager", *flags])
        url = f"https://127.0.0.1:{self.ports.controller_manager}/healthz"
        wait_for(
            lambda: _https_ok(url), self.start_timeout, "kube-controller-manager /healthz", proc
        )

    # -- nodes ----------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        cdi_dirs: Sequence[Path] | None = None,
        extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> NodeHandle:
        """Start a kubelet-dra process for node `name` with root dir ``<base>/nodes/<name>``.

        Waits until the Node object is Ready (unless `wait` is False).
        """
        if name in self.nodes and self.nodes[name].alive():
            raise ClusterError(f"node {name} is already running")
        root = self.base / "nodes" / name
        dirs = [Path(d) for d in cdi_dirs] if cdi_dirs else [root / "cdi"]
        for d in (root / "plugins_registry", root / "plugins", root / "pods", *dirs):
            d.mkdir(parents=True, exist_ok=True)
        flags = kubelet_flags(
            kubeconfig=self.kubeconfig,
            node_name=name,
            root_dir=root,
            labels=dict(labels or {}),
            cdi_dirs=dirs,
            feature_gates=self.feature_gates,
            verbosity=self.verbosity,
            extra=extra_args,
        )
        proc = self._spawn(f"kubelet-{name}", ["kubelet-dra", *flags])
        node = NodeHandle(name, root, dict(labels or {}), dirs, proc)
        self.nodes[name] = node
        if wait:
            wait_for(lambda: self._node_ready(name), self.start_timeout, f"node {name} Ready", proc)
        return node

    def stop_node(self, name: str, timeout: float = 10.0) -> None:
        """Stop the node's kubelet-dra (the Node object and its files stay)."""
        node = self.nodes.get(name)
        if node is not None:
            node.process.stop(timeout)
            self.processes.pop(node.process.name, None)

    def restart_node(self, name: str) -> NodeHandle:
        """Stop and start a node's kubelet-dra with the same root dir (a kubelet restart)."""
        node = self.nodes[name]
        self.stop_node(name)
        return self.add_node(name, node.labels, cdi_dirs=node.cdi_dirs)

    def node(self, name: str) -> NodeHandle:
        return self.nodes[name]

    def _node_ready(self, name: str) -> bool:
        status, body = self._apiserver_request(f"/api/v1/nodes/{name}")
        if status != 200:
            return False
        try:
            node = json.loads(body)
        except ValueError:
            return False
        conds = node.get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    # -- API access (no client library needed) --------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _apiserver_request(self, path: str) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=self._ssl_context()) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as e:
            return int(e.code), b""
        except (urllib.error.URLError, OSError):
            return 0, b""

    def _apiserver_get(self, path: str) -> int:
        return self._apiserver_request(path)[0]

    def healthy(self) -> dict[str, bool]:
        """Liveness of each control-plane component."""
        out: dict[str, bool] = {}
        for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
            proc = self.processes.get(name)
            out[name] = proc is not None and proc.alive()
        if out["kube-apiserver"]:
            out["kube-apiserver"] = self._apiserver_get("/readyz") == 200
        return out

    # -- teardown -------------------------------------------------------------------

    def stop(self, keep: bool | None = None) -> None:
        """Stop every process (nodes first) and remove the base dir unless kept."""
        keep = self.keep if keep is None else keep
        self._stop_processes()
        if not keep and self._owns_base and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _stop_processes(self) -> None:
        for name in sorted(self.processes, key=_stop_rank):
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
        for node in self.nodes.values():
            node.process.stop(timeout=1)

    # -- persistence for `up` / `down` ----------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "base_dir": str(self.base),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "version": self.version,
            "owns_base": self._owns_base,
            "processes": {name: p.pid for name, p in self.processes.items()},
            "nodes": {name: str(n.root_dir) for name, n in self.nodes.items()},
        }


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _https_ok(url: str) -> bool:
    """GET an https URL with a self-signed certificate (component /healthz)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


# --------------------------------------------------------------------------------------
# Command line: up / down / status
# --------------------------------------------------------------------------------------


def state_dir() -> Path:
    return repo_root() / ".cache" / "cluster"


def _load_state() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir() / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data


def _running_state() -> dict[str, Any] | None:
    """The saved state of a background cluster that still has live processes."""
    state = _load_state()
    if state and any(_pid_alive(int(p)) for p in state.get("processes", {}).values()):
        return state
    return None


def save_state(cluster: LocalCluster) -> bool:
    """Record `cluster` in ``.cache/cluster/state.json`` so ``down`` can stop it later.

    Returns False (and writes nothing) when another recorded cluster is still running.
    """
    if _running_state() is not None:
        return False
    sdir = state_dir()
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / STATE_FILE).write_text(json.dumps(cluster.state(), indent=2) + "\n")
    return True


def _cmd_up(args: argparse.Namespace) -> int:
    existing = _running_state()
    if existing:
        print(f"cluster already running; export KUBECONFIG={existing['kubeconfig']}")
        return 0
    sdir = state_dir()
    base = Path(args.base_dir) if args.base_dir else sdir / "run"
    if base.exists():
        shutil.rmtree(base)
    cluster = LocalCluster(base_dir=base, keep=True, verbosity=args.v)
    try:
        cluster.start()
        for spec in args.node:
            name, labels = parse_node_spec(spec)
            cluster.add_node(name, labels)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    save_state(cluster)
    print(f"Kubernetes {cluster.version} control plane running at {cluster.server}")
    print(f"logs: {cluster.logs_dir}")
    for name, node in cluster.nodes.items():
        print(f"node {name}: root {node.root_dir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _stop_rank(name: str) -> int:
    """Stop order: nodes and extra processes, then the control plane, etcd last."""
    return CONTROL_PLANE_STOP_ORDER.index(name) + 1 if name in CONTROL_PLANE_STOP_ORDER else 0


def _cmd_down(args: argparse.Namespace) -> int:
    state = _load_state()
    if state is None:
        print("no cluster state found; nothing to stop")
        return 0
    procs: dict[str, int] = state.get("processes", {})
    # nodes and extras first, etcd last
    ordered = sorted(procs.items(), key=lambda kv: _stop_rank(kv[0]))
    for name, pid in ordered:
        proc = ManagedProcess(name, [], Path(os.devnull), pid=int(pid))
        if proc.alive():
            proc.stop()
            print(f"stopped {name} (pid {pid})")
    if not args.keep_files:
        shutil.rmtree(state["base_dir"], ignore_errors=True)
    (state_dir() / STATE_FILE).unlink(missing_ok=True)
    return 0


def _cmd_status(_: argparse.Namespace) -> int:
    state = _load_state()
    if state is None:
        print("no cluster")
        return 1
    for name, pid in state.get("processes", {}).items():
        print(f"{name:32} pid {pid:<8} {'running' if _pid_alive(int(pid)) else 'stopped'}")
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dra_driver.localcluster", description="local Kubernetes control plane"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start in the background and print the KUBECONFIG path")
    up.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME[:k=v,...]",
        help="also start a kubelet-dra node (repeatable)",
    )
    up.add_argument("--base-dir", help="state directory (default .cache/cluster/run)")
    up.add_argument("-v", type=int, default=2, help="component log verbosity")
    down = sub.add_parser("down", help="stop the background cluster")
    down.add_argument("--keep-files", action="store_true", help="keep logs and data")
    sub.add_parser("status", help="show component processes")
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "up": _cmd_up,
        "down": _cmd_down,
        "status": _cmd_status,
    }
    return handlers[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
