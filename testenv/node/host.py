"""Host plumbing of the real node: commands, mounts, cgroups, the pod network, and the
teardown of containers and shims. Needs root."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from nodeconfig import (
    API_SERVICE_IP,
    BRIDGE,
    CGROUP_PARENT,
    CGROUP_ROOT,
    IPTABLES_COMMENT,
    POD_GATEWAY,
    POD_SUBNET,
    Layout,
    NodeError,
)

# --------------------------------------------------------------------------------------
# Host setup and teardown
# --------------------------------------------------------------------------------------


def run(*argv: str | Path, check: bool = True, timeout: float = 300) -> str:
    """Run a command; its stdout, or NodeError with its stderr."""
    out = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and out.returncode != 0:
        cmd = " ".join(str(a) for a in argv)
        raise NodeError(f"{cmd}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def overlay_works(scratch: Path) -> bool:
    """Whether an overlay filesystem can be mounted with its layers on `scratch`."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        dirs = {n: Path(tmp) / n for n in ("lower", "upper", "work", "merged")}
        for d in dirs.values():
            d.mkdir()
        opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"])],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            return False
        run("umount", dirs["merged"])
    return True


def shared_mount(path: Path) -> None:
    """Make `path` a shared mount point of its own.

    The chart mounts the driver root with HostToContainer propagation, which needs a
    shared or slave source; this machine's / is private ("path "/" is mounted on "/" but
    it is not a shared or slave mount"). The simulated backend reads nothing from it.
    """
    path.mkdir(parents=True, exist_ok=True)
    run("mount", "--bind", path, path)
    run("mount", "--make-rshared", path)


def cgroup_hierarchies(*, unified: bool = False) -> list[Path]:
    """The mounted cgroup v1 hierarchies (the kubelet runs its pods under each), and the
    hybrid v2 one (runc makes the pods' cgroups there too) if `unified`."""
    return sorted(
        p
        for p in CGROUP_ROOT.iterdir()
        if p.is_dir() and (unified or p.name != "unified") and (p / "cgroup.procs").exists()
    )


def cgroup_pids(parent: str = CGROUP_PARENT) -> set[int]:
    """Every process under the cgroup `parent` (`CGROUP_PARENT`: the node's containers,
    whatever their parent)."""
    pids: set[int] = set()
    for h in cgroup_hierarchies(unified=True):
        for procs in (h / parent).rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_containers(timeout: float = 10.0, parent: str = CGROUP_PARENT) -> None:
    """SIGKILL the node's container processes (or those under the cgroup `parent`); killing
    their shims does not stop them."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(parent)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def create_cgroup_parent() -> None:
    """Create `CGROUP_PARENT` in every hierarchy; cpuset needs its CPUs and memory nodes."""
    for h in cgroup_hierarchies():
        d = h / CGROUP_PARENT
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def remove_cgroup_parent(parent: str = CGROUP_PARENT) -> None:
    """Remove the cgroup `parent` and everything under it, deepest first."""
    for h in cgroup_hierarchies(unified=True):
        top = h / parent
        if not top.exists():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def mounts_under(*roots: Path) -> list[Path]:
    """Mount points at or below `roots`, deepest first (the order to unmount them)."""
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].replace("\\040", " "))
        if any(point == r or r in point.parents for r in roots):
            found.append(point)
    return sorted(set(found), key=lambda p: -len(p.parts))


def unmount_all(*roots: Path) -> None:
    for point in mounts_under(*roots):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def iptables_rule(api_port: int) -> list[str]:
    """The nat rule that stands in for kube-proxy for the one Service pods need."""
    return [
        "PREROUTING",
        "-i",
        BRIDGE,
        "-d",
        API_SERVICE_IP,
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        IPTABLES_COMMENT,
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{api_port}",
    ]


def setup_network(api_port: int) -> None:
    """The pod bridge with the node's address, routing from it to loopback, and the API
    server's Service address."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    prefix = POD_SUBNET.split("/")[1]
    run("ip", "addr", "replace", f"{POD_GATEWAY}/{prefix}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1")
    remove_iptables_rules()
    run("iptables", "-t", "nat", "-A", *iptables_rule(api_port))


def remove_iptables_rules() -> None:
    """Delete our DNAT rule and the chains the CNI plugins made for our network."""
    if shutil.which("iptables-save") is None:
        return  # not installed yet (a fresh machine): no rule of ours can exist
    saved = run("iptables-save", "-t", "nat", check=False)
    for line in saved.splitlines():
        if line.startswith("-A ") and IPTABLES_COMMENT in line:
            args = line[3:].replace(f'"{IPTABLES_COMMENT}"', "COMMENT").split()
            args = [IPTABLES_COMMENT if a == "COMMENT" else a for a in args]
            run("iptables", "-t", "nat", "-D", *args, check=False)


def remove_network() -> None:
    remove_iptables_rules()
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


def kill_shims(layout: Layout) -> None:
    """Kill the container shims (and so the containers) of our containerd."""
    marker = str(layout.containerd_socket).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(proc.name), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    time.sleep(0.5)
    remove_stale_shim_sockets()


def remove_stale_shim_sockets() -> None:
    """Remove shim sockets nobody listens on (containerd keeps them in a fixed place)."""
    sockets = Path("/run/containerd/s")
    for path in sockets.glob("*") if sockets.is_dir() else []:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                continue
    for d in (sockets, sockets.parent):
        with contextlib.suppress(OSError):
            d.rmdir()


def sandbox_netns() -> list[Path]:
    """The network namespaces of our pods: those with an address on the pod network."""
    netns_dir = Path("/run/netns")
    prefix = POD_SUBNET.rsplit(".", 1)[0] + "."
    found = []
    for ns in sorted(netns_dir.glob("cni-*")) if netns_dir.is_dir() else []:
        addrs = run("ip", "-n", ns.name, "-br", "addr", check=False)
        if f" {prefix}" in addrs:
            found.append(ns)
    return found
