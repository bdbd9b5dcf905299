"""``dra-driver imex-daemon``: the process in each IMEX daemon pod of a ComputeDomain.

It runs the node's ``nvidia-imex`` (from the host's driver root) as its child and keeps its
nodes config equal to the domain's daemon pods:

- :class:`ImexDaemon`, the core: writes the daemon's config, starts it, restarts it when it
  exits (backing off), and on a new peer set rewrites the nodes config and sends SIGUSR1
  (debounced, and spaced as the daemon wants). It is fed peer sets by whoever follows them.
- :class:`DomainPods`, the follower: lists and watches the domain's daemon pods and the
  domain's nodes, and hands the core each new peer set: the daemons in its own NVLink clique.
- :func:`run_process`: the two together under SIGTERM, with the API client.

An IMEX domain cannot span NVLink cliques. The daemon learns its own clique from its claim's
CDI spec (``CLIQUE_ID``, written by the node's compute domain plugin from the node's
discovery, as the NVIDIA driver passes it) and each peer's from the clique label
(``nvidia.com/gpu.clique``) the same plugin puts on the peer's Node: the nodes of the domain
carry the domain's label, so one more watch (of those nodes only, read-only) tells a pod's
clique by its ``spec.nodeName``. Nothing is written: the daemon needs no right to change
pods. With an empty ``CLIQUE_ID`` (a node in no clique) no ``nvidia-imex`` runs, as with the
NVIDIA driver: the process waits for SIGTERM and its readiness probe passes, so the node's
entry in the domain's status turns Ready.

The readiness probe (``--check``) lives in :mod:`.imexconfig`, away from all of this.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import structlog

from dra_driver.computedomain.api import CLIQUE_LABEL, ApiNames, names_for
from dra_driver.computedomain.imexconfig import (
    CLIQUE_ENV,
    DAEMON,
    DEFAULT_DIR,
    SERVER_PORT,
    ImexConfig,
    ImexFiles,
    ToolNotFound,
    config_text,
    find_tool,
    host_configs,
    nodes_text,
    peer_set,
)
from dra_driver.errors import StartError
from dra_driver.settings import Settings, SettingsError

JSON = dict[str, Any]

#: Seconds a burst of pod events is given to settle before the nodes config is rewritten.
DEBOUNCE = 1.0
#: The daemon re-reads its nodes config at most once per 5 s and ignores a SIGUSR1 sent
#: sooner; the shell waits this long after the last one (and after a start, so the daemon
#: has its signal handlers in place).
RELOAD_GAP = 5.5
#: Restart back-off: the first delay, the cap, and how long a run must last to count as
#: healthy (the next failure starts from the first delay again).
RESTART_FIRST = 1.0
RESTART_CAP = 30.0
STABLE_RUN = 60.0
#: Seconds the daemon gets to exit on SIGTERM before it is killed.
STOP_TIMEOUT = 10.0
#: How often the daemon's log file is read for new lines.
LOG_POLL = 0.5

log = structlog.get_logger(__name__)


# -- decisions ---------------------------------------------------------------------------


def restart_delay(failures: int, first: float = RESTART_FIRST, cap: float = RESTART_CAP) -> float:
    """Seconds to wait before restarting after the ``failures``-th exit in a row."""
    return min(first * (1 << min(max(failures - 1, 0), 30)), cap)


def failures_after(previous: int, ran_for: float, stable: float = STABLE_RUN) -> int:
    """The count of exits in a row after one that came ``ran_for`` seconds into a run: a run
    that lasted counts as the first failure of a new series."""
    return 1 if ran_for >= stable else previous + 1


def reload_delay(now: float, last_reload: float, started: float, gap: float) -> float:
    """Seconds until a SIGUSR1 may be sent: ``gap`` after the last one and after the start."""
    return max(0.0, last_reload + gap - now, started + gap - now)


def describe_exit(code: int) -> str:
    """An exit status as people say it (asyncio gives a signal as a negative status)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def imex_log_level(line: str) -> str:
    """The level to forward one line of the daemon's log at (its own ``[LEVEL]`` tag)."""
    upper = line.upper()
    if "[ERROR]" in upper or "[FATAL]" in upper:
        return "error"
    if "[WARN" in upper:
        return "warning"
    return "info"


# -- the core ------------------------------------------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    # The daemon may read the file at any moment (a start, a SIGUSR1): never half of it.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


class ImexDaemon:
    """Runs one ``nvidia-imex`` with the peers it is given, until cancelled."""

    def __init__(
        self,
        binary: Path,
        config: ImexConfig,
        *,
        domain: str = "",
        logger: Any = None,
        debounce: float = DEBOUNCE,
        reload_gap: float = RELOAD_GAP,
        restart_first: float = RESTART_FIRST,
        restart_cap: float = RESTART_CAP,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.binary = binary
        self.config = config
        self.files = config.files
        self._domain = domain
        self._log = logger if logger is not None else log
        self._debounce = debounce
        self._reload_gap = reload_gap
        self._restart_first = restart_first
        self._restart_cap = restart_cap
        self._stop_timeout = stop_timeout
        self._peers: frozenset[str] = frozenset()
        self._peers_known = asyncio.Event()
        self._changed = asyncio.Event()
        #: The nodes config in the file, and the one the running daemon has read.
        self._written = ""
        self._loaded = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._started = 0.0
        self._last_reload = float("-inf")
        #: For observers (tests, logs): starts of the daemon and SIGUSR1s sent.
        self.starts = 0
        self.reloads = 0

    @property
    def pid(self) -> int | None:
        """The running daemon's process id (None between runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def set_peers(self, peers: Iterable[str]) -> None:
        """The domain's daemon addresses now (this one's may be among them or not)."""
        peers = frozenset(peers)
        self._peers_known.set()
        if peers != self._peers:
            self._peers = peers
            self._changed.set()

    def nodes(self) -> str:
        """The nodes config for the peers known now."""
        return nodes_text(self._peers, self.config.pod_ip)

    async def run(self) -> None:
        """Write the config, wait for the first peer set, run the daemon until cancelled;
        the daemon is stopped on the way out."""
        self.files.directory.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.files.config, config_text(self.config, domain=self._domain))
        # Started alone, the daemon would be ready at once and unready when told its peers.
        await self._peers_known.wait()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._supervise())
            group.create_task(self._follow_peers())

    def _write_nodes(self) -> None:
        text = self.nodes()
        if text != self._written:
            _write_atomically(self.files.nodes, text)
            self._written = text

    def _prepare_run(self) -> None:
        self._write_nodes()
        self._loaded = self._written
        # A fresh log per run: the forwarder reads each run's log from its start.
        self.files.log.write_bytes(b"")

    async def _supervise(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            self._prepare_run()
            proc = await asyncio.create_subprocess_exec(
                str(self.binary),
                "-c",
                str(self.files.config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            self._proc, self._started = proc, loop.time()
            self._last_reload = float("-inf")
            self.starts += 1
            self._log.info("nvidia-imex started", pid=proc.pid, peers=self._written.split())
            forward = asyncio.ensure_future(self._forward(proc))
            try:
                code = await proc.wait()
            except asyncio.CancelledError:
                await self._stop(proc)
                raise
            finally:
                # The daemon's last words (why it exited) are in its output and log.
                await asyncio.wait({forward}, timeout=4 * LOG_POLL)
                forward.cancel()
            ran_for = loop.time() - self._started
            failures = failures_after(failures, ran_for)
            delay = restart_delay(failures, self._restart_first, self._restart_cap)
            self._log.warning(
                "nvidia-imex exited, restarting",
                exit=describe_exit(code),
                exit_code=code,
                ran_for=round(ran_for, 1),
                restart_in=delay,
            )
            await asyncio.sleep(delay)

    def _log_lines(self, data: bytes) -> None:
        for raw in data.splitlines():
            line = raw.decode(errors="replace").rstrip()
            if line:
                getattr(self._log, imex_log_level(line))(line, source=DAEMON)

    async def _forward(self, proc: asyncio.subprocess.Process) -> None:
        """Forward the daemon's output and its log file into this process's log, until its
        output closes (it exited)."""

        async def output() -> None:
            assert proc.stdout is not None
            while True:
                try:
                    raw = await proc.stdout.readline()
                except ValueError:
                    # A line past the stream's limit (64 KiB) is dropped, and reading goes on:
                    # a daemon whose output is not read blocks once the pipe is full.
                    self._log.warning("nvidia-imex wrote a line too long to forward")
                    continue
                if not raw:
                    return
                self._log_lines(raw)

        reader = asyncio.ensure_future(output())
        offset, partial = 0, b""
        try:
            while True:
                # Looked at before reading: once the output is closed, this read is the last.
                finished = reader.done()
                data = _read_from(self.files.log, offset)
                offset += len(data)
                complete, _, partial = (partial + data).rpartition(b"\n")
                self._log_lines(complete)
                if finished:
                    self._log_lines(partial)
                    return
                await asyncio.wait({reader}, timeout=LOG_POLL)
        finally:
            reader.cancel()

    async def _follow_peers(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._changed.wait()
            await asyncio.sleep(self._debounce)
            self._changed.clear()
            if self.nodes() == self._loaded:
                continue
            # Again after each wait: the daemon may have been restarted meanwhile.
            while True:
                wait = reload_delay(loop.time(), self._last_reload, self._started, self._reload_gap)
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            self._changed.clear()  # what changed while waiting is in this rewrite
            self._write_nodes()
            proc = self._proc
            if proc is None or proc.returncode is not None or self._written == self._loaded:
                continue  # the next start reads the file as it is now, or it has it already
            proc.send_signal(signal.SIGUSR1)
            self._last_reload = loop.time()
            self._loaded = self._written
            self.reloads += 1
            self._log.info(
                "nodes config changed, nvidia-imex reloads it", peers=self._written.split()
            )

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        proc.terminate()
        try:
            code = await asyncio.wait_for(proc.wait(), self._stop_timeout)
        except TimeoutError:
            self._log.warning("nvidia-imex did not stop, killing it", timeout=self._stop_timeout)
            proc.kill()
            code = await proc.wait()
        self._log.info("nvidia-imex stopped", exit=describe_exit(code), exit_code=code)


# -- following the domain's pods --------------------------------------------------------------


class PodApi(Protocol):
    """The two requests the follower makes (:class:`~dra_driver.resourceslice.rawapi.RawApi`)."""

    async def list_objects(
        self, path: str, resource: str, field_selector: str = "", *, label_selector: str = ""
    ) -> JSON: ...

    def watch_objects(
        self,
        path: str,
        resource: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        label_selector: str = "",
    ) -> AsyncIterator[JSON]: ...


#: The domain's nodes carry its label; their clique label tells each peer's clique.
NODES_PATH = "/api/v1/nodes"


def _name(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def node_clique(node: JSON) -> str:
    """A Node's NVLink clique, from the label its compute domain plugin sets ("" none)."""
    return str(((node.get("metadata") or {}).get("labels") or {}).get(CLIQUE_LABEL, ""))


class DomainPods:
    """Follows the daemon pods of one domain and reports their peer set on each change.

    With ``clique`` (this daemon's), it also follows the domain's nodes and reports only the
    daemons on nodes of that clique; nothing is reported before both are listed, so the
    daemon never starts with peers of another clique. ``clique`` None (the claim's CDI spec
    predates ``CLIQUE_ID``): every daemon of the domain, as before.
    """

    def __init__(
        self,
        api: PodApi,
        *,
        namespace: str,
        uid: str,
        names: ApiNames,
        on_peers: Callable[[frozenset[str]], None],
        clique: str | None = None,
        logger: Any = None,
    ) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        self._uid = uid
        self._label = names.domain_label
        self._selector = f"{names.domain_label}={uid}"
        self._on_peers = on_peers
        self._clique = clique
        self._log = logger if logger is not None else log
        self._pods: dict[str, JSON] | None = None
        #: Node name -> its clique; None until listed, or when not followed.
        self._nodes: dict[str, str] | None = None
        self._reported: frozenset[str] | None = None

    def listed(self, items: list[JSON]) -> None:
        """A full listing of the pods."""
        self._pods = {_name(p): p for p in items}
        self._report()

    def event(self, kind: str, obj: JSON) -> None:
        """One watch event of a pod."""
        pods = self._pods if self._pods is not None else {}
        if kind == "DELETED":
            pods.pop(_name(obj), None)
        else:
            pods[_name(obj)] = obj
        self._pods = pods
        self._report()

    def nodes_listed(self, items: list[JSON]) -> None:
        """A full listing of the domain's nodes."""
        self._nodes = {_name(n): node_clique(n) for n in items}
        self._report()

    def node_event(self, kind: str, obj: JSON) -> None:
        """One watch event of a node (one that leaves the domain is DELETED for the watch)."""
        nodes = self._nodes if self._nodes is not None else {}
        if kind == "DELETED":
            nodes.pop(_name(obj), None)
        else:
            nodes[_name(obj)] = node_clique(obj)
        self._nodes = nodes
        self._report()

    def _report(self) -> None:
        if self._pods is None or (self._clique is not None and self._nodes is None):
            return
        peers = peer_set(
            self._pods.values(), self._uid, self._label, self._nodes, self._clique or ""
        )
        if peers != self._reported:
            self._reported = peers
            self._log.info(
                "domain daemons", peers=sorted(peers), pods=len(self._pods), clique=self._clique
            )
            self._on_peers(peers)

    async def run(self) -> None:
        """List and watch until cancelled."""
        from dra_driver.resourceslice.reflector import Reflector
        from dra_driver.resourceslice.reporting import ApiErrorReporter

        def reflector(
            path: str,
            resource: str,
            on_listed: Callable[[list[JSON]], None],
            on_event: Callable[[str, JSON], None],
        ) -> Reflector:
            return Reflector(
                lambda: self._api.list_objects(path, resource, label_selector=self._selector),
                lambda version, timeout: self._api.watch_objects(
                    path, resource, "", version, timeout, label_selector=self._selector
                ),
                resource=resource,
                on_listed=on_listed,
                on_event=on_event,
                log=self._log,
                reporter=ApiErrorReporter(self._log),
            )

        async with asyncio.TaskGroup() as group:
            group.create_task(reflector(self._path, "pods", self.listed, self.event).run())
            if self._clique is not None:
                nodes = reflector(NODES_PATH, "nodes", self.nodes_listed, self.node_event)
                group.create_task(nodes.run())


# -- the process ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonOptions:
    """What ``imex-daemon`` was told besides its settings."""

    domain_uid: str
    domain: str
    pod_ip: str
    pod_namespace: str
    node: str
    port: int
    directory: Path
    #: The node's NVLink clique ("" none; None: the claim's CDI spec does not say).
    clique: str | None = None


def daemon_options(
    settings: Settings, ns: argparse.Namespace, environ: Mapping[str, str]
) -> DaemonOptions:
    """The options from the flags (or their DRA_* variables), else the downward API's
    variables the DaemonSet sets (POD_IP, POD_NAMESPACE, NODE_NAME); the clique from the
    claim's CDI spec (CLIQUE_ID)."""

    def value(attr: str, fallback: str = "") -> str:
        given = getattr(ns, attr, None)
        return str(given) if given not in (None, "") else environ.get(fallback, "")

    options = DaemonOptions(
        domain_uid=value("domain_uid"),
        domain=value("domain"),
        pod_ip=value("pod_ip", "POD_IP"),
        pod_namespace=value("pod_namespace", "POD_NAMESPACE"),
        node=settings.node_name or environ.get("NODE_NAME", ""),
        port=int(getattr(ns, "imex_port", None) or SERVER_PORT),
        directory=Path(value("imex_dir") or DEFAULT_DIR),
        clique=environ.get(CLIQUE_ENV),
    )
    missing = [
        flag
        for flag, given in (
            ("--domain-uid (DRA_DOMAIN_UID)", options.domain_uid),
            ("--pod-ip (POD_IP)", options.pod_ip),
            ("--pod-namespace (POD_NAMESPACE)", options.pod_namespace),
        )
        if not given
    ]
    if missing:
        raise SettingsError(
            f"{', '.join(missing)} required: the compute domain controller's DaemonSet sets them"
        )
    try:
        ipaddress.ip_address(options.pod_ip)
    except ValueError:
        raise SettingsError(f"--pod-ip: not an IP address (got {options.pod_ip!r})") from None
    if not 0 < options.port < 65536:
        raise SettingsError(f"--imex-port: not a port (got {options.port})")
    return options


async def run_process(settings: Settings, ns: argparse.Namespace) -> int:
    """Run the node's IMEX daemon for the domain until SIGTERM/SIGINT (then 0)."""
    from dra_driver.kube import KubeClient
    from dra_driver.resourceslice.rawapi import RawApi

    options = daemon_options(settings, ns, os.environ)
    domain = options.domain or options.domain_uid
    structlog.contextvars.bind_contextvars(domain=domain, node=options.node)
    bound = log.bind(domain=domain, node=options.node)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if options.clique == "":
        # As the NVIDIA driver: no clique, no NVLink fabric to broker; the probe passes.
        bound.info(
            "the node is in no NVLink clique (empty CLIQUE_ID): no nvidia-imex to run, "
            "waiting for SIGTERM"
        )
        await stop.wait()
        return 0
    if options.clique is None:
        bound.warning(
            "the daemon claim's CDI spec has no CLIQUE_ID (prepared by an older compute "
            "domain plugin): peering with every daemon of the domain, whatever its clique; "
            "delete this pod to have its claim prepared again"
        )
    try:
        binary = find_tool(settings.driver_root, DAEMON)
    except ToolNotFound as exc:
        raise StartError(str(exc)) from None
    for found in host_configs(settings.driver_root):
        bound.warning(
            "the host has an IMEX config: a host nvidia-imex service would hold the ports of "
            "the domain's daemon; disable it on nodes used for compute domains",
            config=str(found),
        )
    config = ImexConfig(
        pod_ip=options.pod_ip, files=ImexFiles(options.directory), port=options.port
    )
    core = ImexDaemon(binary, config, domain=domain, logger=bound)
    client = await KubeClient.create(settings.kubeconfig)
    follower = DomainPods(
        RawApi(client),
        namespace=options.pod_namespace,
        uid=options.domain_uid,
        names=names_for(settings.compat),
        on_peers=core.set_peers,
        clique=options.clique,
        logger=bound,
    )
    bound.info(
        "imex daemon starting", binary=str(binary), pod_ip=options.pod_ip, clique=options.clique
    )
    tasks: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(core.run()),
        asyncio.ensure_future(follower.run()),
    ]
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({*tasks, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                task.result()  # ended on its own: only by an error, which is raised here
        bound.info("stopping")
        return 0
    finally:
        for task in (*tasks, stopped):
            task.cancel()
        await asyncio.gather(*tasks, stopped, return_exceptions=True)
        await client.close()
