"""The local control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager.

See the package docstring for the directory layout.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devenv.localcluster.features import gate_off_reason
from devenv.localcluster.flags import (
    ADMIN_GROUPS,
    ADMIN_USER,
    DEFAULT_CONTROLLERS,
    apiserver_flags,
    controller_manager_flags,
    etcd_flags,
    kubelet_flags,
    render_kubeconfig,
    scheduler_flags,
    token_auth_line,
)
from devenv.localcluster.nodes import NodeHandle
from devenv.localcluster.probes import apiserver_request, http_ok, https_ok, node_ready
from devenv.localcluster.processes import (
    ClusterError,
    ManagedProcess,
    Ports,
    checked_binary,
    process_identity,
    run_testenv,
    wait_for,
)
from devenv.localcluster.releases import minor_of

PORT_ATTEMPTS = 3
#: Which feature gates the control plane runs with: ``all`` DRA gates of the release (and what
#: they need), or the release's ``default`` set, as a cluster that sets no gate runs.
GATE_MODES = ("all", "default")
GATES_ENV = "DRA_K8S_GATES"


def gate_mode_from_env() -> str:
    """``$DRA_K8S_GATES`` (``all`` or ``default``), ``all`` when unset."""
    mode = os.environ.get(GATES_ENV, "") or "all"
    if mode not in GATE_MODES:
        raise ClusterError(f"{GATES_ENV}={mode!r}: want one of {', '.join(GATE_MODES)}")
    return mode


def parse_gate_list(text: str) -> dict[str, tuple[str, bool]]:
    """``testenv feature-gates --list`` output -> gate -> (stage, default)."""
    gates: dict[str, tuple[str, bool]] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].startswith("default="):
            gates[parts[0]] = (parts[1], parts[2] == "default=true")
    return gates


CONTROL_PLANE_STOP_ORDER = ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd")


def stop_rank(name: str) -> int:
    """Stop order: nodes and extra processes, then the control plane, etcd last."""
    return CONTROL_PLANE_STOP_ORDER.index(name) + 1 if name in CONTROL_PLANE_STOP_ORDER else 0


@dataclass
class LocalCluster:
    """A local control plane built from upstream Kubernetes (see the package docstring).

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
    scheduler_extra_args: tuple[str, ...] = ()
    controller_manager_extra_args: tuple[str, ...] = ()
    gates: str = field(default_factory=gate_mode_from_env)

    token: str = field(default_factory=lambda: secrets.token_hex(16))
    ports: Ports | None = None
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    _owns_base: bool = False
    _answers: dict[str, str] = field(default_factory=dict)

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
        return checked_binary(self.binary)

    def _ask(self, query: str) -> str:
        """What the testenv binary reports about its release (asked once)."""
        if query not in self._answers:
            self._answers[query] = run_testenv(self._binary(), *query.split())
        return self._answers[query]

    @property
    def version(self) -> str:
        """The Kubernetes version of the control plane (from `testenv version`)."""
        return self._ask("version")

    @property
    def minor(self) -> int:
        """The Kubernetes minor version, e.g. 34."""
        return minor_of(self.version)

    @property
    def feature_gates(self) -> str:
        """The ``--feature-gates`` value: every DRA gate of the release, or none (defaults)."""
        return self._ask("feature-gates") if self.gates == "all" else ""

    @property
    def runtime_config(self) -> str:
        """The ``--runtime-config`` value enabling the release's DRA API versions (all gates
        only: with the defaults, the API versions served by default)."""
        return self._ask("runtime-config") if self.gates == "all" else ""

    @property
    def enabled_gates(self) -> frozenset[str]:
        """The DRA feature gates (and those they need) that are on in this control plane."""
        listed = parse_gate_list(self._ask("feature-gates --list"))
        if self.gates == "all":
            return frozenset(listed)
        return frozenset(name for name, (_, default) in listed.items() if default)

    def gate_stage(self, gate: str) -> str | None:
        """The release's maturity of a DRA gate (ALPHA, BETA, GA), None if it has no such gate."""
        found = parse_gate_list(self._ask("feature-gates --list")).get(gate)
        return found[0] if found else None

    def feature_off(self, gate: str) -> str | None:
        """Why the DRA feature of ``gate`` is off in this control plane, None when it is on."""
        return gate_off_reason(
            gate,
            version=self.version,
            minor=self.minor,
            listed=parse_gate_list(self._ask("feature-gates --list")),
            enabled=self.enabled_gates,
        )

    @property
    def known_controllers(self) -> frozenset[str]:
        """The controllers this release's kube-controller-manager knows."""
        return frozenset(self._ask("controllers").split())

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
            run_testenv(binary, "keys", "--dir", str(self.pki_dir), timeout=120)
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

    def _spawn(
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """Start a command of the testenv binary."""
        return self.spawn(name, [str(self._binary()), *args], env)

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
                http_ok(f"http://127.0.0.1:{self.ports.etcd_client}/health")
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

    def restart_controllers(self) -> None:
        """Restart kube-scheduler and kube-controller-manager.

        After a long API server outage their informers may wait out a relist backoff of up
        to a minute; a test that caused the outage restarts them so that the next test
        does not measure that wait.
        """
        for name in ("kube-scheduler", "kube-controller-manager"):
            self.stop_process(name)
        self._start_scheduler()
        self._start_controller_manager()

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
            extra=self.scheduler_extra_args,
        )
        proc = self._spawn("kube-scheduler", ["kube-scheduler", *flags])
        url = f"https://127.0.0.1:{self.ports.scheduler}/healthz"
        wait_for(lambda: https_ok(url), self.start_timeout, "kube-scheduler /healthz", proc)

    def _start_controller_manager(self) -> None:
        assert self.ports is not None
        flags = controller_manager_flags(
            port=self.ports.controller_manager,
            kubeconfig=self.kubeconfig,
            cert_dir=self.base / "controller-manager-certs",
            pki_dir=self.pki_dir,
            feature_gates=self.feature_gates,
            # A controller newer than the release would stop kube-controller-manager.
            controllers=tuple(c for c in self.controllers if c in self.known_controllers),
            verbosity=self.verbosity,
            extra=self.controller_manager_extra_args,
        )
        proc = self._spawn("kube-controller-manager", ["kube-controller-manager", *flags])
        url = f"https://127.0.0.1:{self.ports.controller_manager}/healthz"
        wait_for(
            lambda: https_ok(url), self.start_timeout, "kube-controller-manager /healthz", proc
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
        return node_ready(*self._apiserver_request(f"/api/v1/nodes/{name}"))

    # -- API access (no client library needed) --------------------------------------

    def _apiserver_request(self, path: str) -> tuple[int, bytes]:
        return apiserver_request(self.server, self.token, str(self.ca_file), path)

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
        for name in sorted(self.processes, key=stop_rank):
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
            "identities": {
                name: process_identity(p.pid)
                for name, p in self.processes.items()
                if p.pid is not None
            },
            "nodes": {name: str(n.root_dir) for name, n in self.nodes.items()},
        }
