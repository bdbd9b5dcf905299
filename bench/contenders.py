"""The drivers the node benchmark compares, and what it reads about their processes.

A contender is one kubelet plugin on the benchmark's node: this driver's agent, the Go
reference driver (kubernetes-sigs/dra-example-driver's ``dra-example-kubeletplugin``, built
outside this repository and passed by path), or the Python floor (``floor_plugin.py``: the
same claim read and syncs as the agent, nothing else). Each serves 72 GPUs named ``gpu-0`` ...
on the same ``kubelet-dra`` node under its own driver name, so one control plane serves all,
and writes its CDI specs to a directory of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devenv.localcluster import LocalCluster, ManagedProcess, NodeHandle
from devenv.simnode import driver_argv

REPO = Path(__file__).resolve().parent.parent

OURS_DRIVER = "gpu.dra.dev"
REFERENCE_DRIVER = "gpu.example.com"
FLOOR_DRIVER = "floor.example.com"
# The reference's shipped client defaults are 5 QPS / burst 10: its rate limiter, not its
# code, would then be measured. The recorded rounds lift them; one round keeps the defaults.
REFERENCE_CLIENT_FLAGS = ("--kube-api-qps=1000", "--kube-api-burst=2000")
#: The driver's image runs Python with these (see the Dockerfile), so the Python contenders do.
PYTHON_ENV = {"PYTHONOPTIMIZE": "2"}


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so a stopped benchmark still leaves its ``with`` blocks
    and takes its control plane and drivers down (a left-over API server would load the
    machine the next run measures on)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@dataclass
class Contender:
    """One kubelet plugin under test on ``node``."""

    label: str
    driver: str
    node: NodeHandle
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""
    proc: ManagedProcess | None = None

    @property
    def process_name(self) -> str:
        return f"{self.label}-{self.node.name}"

    @property
    def registration_socket(self) -> Path:
        return self.node.registry_dir / f"{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.node.plugin_dir(self.driver) / "dra.sock"

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.pid is not None
        return self.proc.pid

    def start(self, cluster: LocalCluster, extra: Sequence[str] = ()) -> float:
        """(Re)start the plugin; returns its start time (monotonic).

        The registration socket of an earlier run is removed first, so its appearance marks
        this run's.
        """
        self.stop(cluster)
        self.registration_socket.unlink(missing_ok=True)
        t0 = time.monotonic()
        self.proc = cluster.spawn(self.process_name, [*self.argv, *extra], self.env)
        return t0

    def stop(self, cluster: LocalCluster) -> None:
        cluster.stop_process(self.process_name)
        self.proc = None


def own_cdi_dir(node: NodeHandle, label: str) -> Path:
    """A CDI spec directory for one contender alone.

    The reference's CDI cache watches its spec directory and re-reads every spec in it on each
    change (the CDI library's default auto-refresh). In one shared directory it spent about
    half a core re-reading the other contenders' specs during their rounds, which slowed them.
    """
    path = node.cdi_dir.parent / f"cdi-{label}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ours(cluster: LocalCluster, node: NodeHandle, profile: str, metrics_port: int) -> Contender:
    """This driver's agent on the simulated profile ``profile``."""
    argv = driver_argv(
        cluster,
        node,
        profile,
        OURS_DRIVER,
        [f"--metrics-port={metrics_port}"],
        cdi_root=own_cdi_dir(node, "ours"),
    )
    return Contender("ours", OURS_DRIVER, node, argv, dict(PYTHON_ENV), _our_version())


def reference(
    cluster: LocalCluster,
    node: NodeHandle,
    binary: Path,
    devices: int,
    version: str,
    client_flags: Sequence[str] = REFERENCE_CLIENT_FLAGS,
) -> Contender:
    """The reference kubelet plugin with ``devices`` GPUs of its ``gpu`` profile."""
    argv = [
        str(binary),
        f"--node-name={node.name}",
        f"--kubeconfig={cluster.kubeconfig}",
        "--device-profile=gpu",
        f"--num-devices={devices}",
        f"--cdi-root={own_cdi_dir(node, 'reference')}",
        f"--kubelet-registrar-directory-path={node.registry_dir}",
        f"--kubelet-plugins-directory-path={node.plugins_dir}",
        *client_flags,
    ]
    return Contender("reference", REFERENCE_DRIVER, node, argv, version=version)


def floor(cluster: LocalCluster, node: NodeHandle, devices: int) -> Contender:
    """The Python floor (``bench/floor_plugin.py``) with ``devices`` GPUs."""
    argv = [
        sys.executable,
        str(Path(__file__).with_name("floor_plugin.py")),
        f"--driver-name={FLOOR_DRIVER}",
        f"--node-name={node.name}",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--registry-dir={node.registry_dir}",
        f"--plugins-dir={node.plugins_dir}",
        f"--cdi-root={own_cdi_dir(node, 'floor')}",
        f"--num-devices={devices}",
    ]
    return Contender("floor", FLOOR_DRIVER, node, argv, dict(PYTHON_ENV), "bench/floor_plugin.py")


def _our_version() -> str:
    """The checkout's commit, ``-dirty`` when files other than the benchmark's own results
    (``bench/results/``, ``docs/performance.md``, written as ``make bench`` goes) differ."""
    git = ["git", "-C", str(REPO)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [
                *git,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)bench/results",
                ":(exclude)docs/performance.md",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if changed else commit


#: Test suites, whose data includes files that are not meant to compile.
TESTS = r"/(test|tests|idle_test)/"


def compile_sources(root: Path = REPO) -> None:
    """Compile the agent's modules under ``root``, the installed packages and the standard
    library to bytecode of the image's optimization level, as building the image does.

    The benchmark runs the agent from a checkout; where PYTHONDONTWRITEBYTECODE is set (or
    the checkout is fresh) it would otherwise compile every module without that bytecode at
    each start, which the image never does, and start-up and memory would measure the compiler.
    """
    paths = sysconfig.get_paths()
    trees = [str(root / "dra_driver"), paths["stdlib"], paths["purelib"]]
    options = ["-q", "-j", "0", "-o", PYTHON_ENV["PYTHONOPTIMIZE"], "-x", TESTS]
    command = [sys.executable, "-m", "compileall", *options, *trees]
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)


# ------------------------------------------------------------------------------ process probes


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out = [pid]
    for p in out:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                out.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def _rollup(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        values[key] = int(value.split()[0])
    return values


def usage(pid: int) -> dict[str, int]:
    """RSS and PSS (KiB) of the process tree, and the main process's open descriptors."""
    rss = pss = 0
    for p in tree(pid):
        try:
            r = _rollup(p)
        except OSError:
            continue
        rss += r.get("Rss", 0)
        pss += r.get("Pss", 0)
    return {"rss_kib": rss, "pss_kib": pss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def api_connections(pid: int, port: int) -> int:
    """Established TCP connections of ``pid`` to the API server's ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if cols[3] == "01" and remote_port == port and cols[9] in inodes:
                count += 1
    return count


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat(5); the split above starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SyscallCounter:
    """Counts fsync-family system calls of a running process (all threads) with strace."""

    CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs")

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        trace = "trace=" + ",".join(self.CALLS)
        self._proc = subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(out), "-e", trace, "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attaching to every thread takes a moment

    def stop(self) -> int:
        """Detach and return how many of the calls were made while attached."""
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait(timeout=30)
        total = 0
        for line in self.out.read_text().splitlines():
            cols = line.split()
            if cols and cols[-1] in self.CALLS:
                # "% time seconds usecs/call calls [errors] syscall"
                total += int(cols[3])
        return total
