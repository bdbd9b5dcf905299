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
    HOST_NODE_IP,
    IPTABLES_COMMENT,
    MAX_NODES,
    NODE_BRIDGE,
    NODE_NETWORK,
    POD_GATEWAY,
    POD_SUBNET,
    Layout,
    NodeError,
    NodeSpec,
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


def create_cgroup_parent(parent: str = CGROUP_PARENT) -> None:
    """Create the cgroup `parent` in every hierarchy; cpuset needs its CPUs and memory nodes."""
    for h in cgroup_hierarchies():
        d = h / parent
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


def iptables_rule(api_port: int, interface: str = BRIDGE) -> list[str]:
    """The nat rule that stands in for kube-proxy for the one Service pods need (traffic
    that comes in on `interface`)."""
    return [
        "PREROUTING",
        "-i",
        interface,
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
    for link in (BRIDGE, NODE_BRIDGE, *(NodeSpec(Path(), i).veth for i in range(1, MAX_NODES))):
        if Path("/sys/class/net", link).exists():
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


# --------------------------------------------------------------------------------------
# Further nodes: namespaces of their own, joined by the node bridge
# --------------------------------------------------------------------------------------


def setup_node_network(api_port: int) -> None:
    """The node bridge: the host's address on the node network, and the API server's
    Service address for what comes in from the other nodes (their kubelets and pods)."""
    if subprocess.run(["ip", "link", "show", NODE_BRIDGE], capture_output=True).returncode != 0:
        run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
    prefix = NODE_NETWORK.split("/")[1]
    run("ip", "addr", "replace", f"{HOST_NODE_IP}/{prefix}", "dev", NODE_BRIDGE)
    run("ip", "link", "set", NODE_BRIDGE, "up")
    Path(f"/proc/sys/net/ipv4/conf/{NODE_BRIDGE}/route_localnet").write_text("1")
    run("iptables", "-t", "nat", "-A", *iptables_rule(api_port, NODE_BRIDGE))


def _is_mount_point(path: Path) -> bool:
    return path in mounts_under(path)


def create_namespaces(spec: NodeSpec) -> None:
    """The node's network and mount namespaces, kept by bind mounts on `spec.netns_file` and
    `spec.mountns_file` (no process needs to hold them; ``down`` unmounts them).

    The mount namespace is a private copy of the host's: nothing mounted in either later
    propagates to the other. In it, the node's own directories are bind-mounted onto the
    paths node 0 uses (`NodeSpec.bind_mounts`); the driver root is made shared, as the
    chart's HostToContainer mount of it needs.
    """
    ns_dir = spec.netns_file.parent
    ns_dir.mkdir(parents=True, exist_ok=True)
    if not _is_mount_point(ns_dir):  # a namespace file must not propagate into itself
        run("mount", "--bind", ns_dir, ns_dir)
        run("mount", "--make-private", ns_dir)
    for f in (spec.netns_file, spec.mountns_file):
        f.touch()
    run(
        "unshare",
        f"--net={spec.netns_file}",
        f"--mount={spec.mountns_file}",
        "--propagation",
        "private",
        "true",
    )
    for own, view in spec.bind_mounts():
        own.mkdir(parents=True, exist_ok=True)
        view.mkdir(parents=True, exist_ok=True)
        run(*spec.enter(), "mount", "--bind", own, view)
    run(*spec.enter(), "mount", "--make-rshared", spec.view.driver_root)


def connect_node(spec: NodeSpec) -> None:
    """Join the node's network namespace to the node bridge: a veth whose node end is its
    ``eth0`` with the node's address, a default route to the host, forwarding on (its
    pods' traffic leaves through it), and the host's route to its pod subnet."""
    peer = f"{spec.veth}p"
    enter = ["nsenter", f"--net={spec.netns_file}", "--"]
    run("ip", "link", "add", spec.veth, "type", "veth", "peer", "name", peer)
    run("ip", "link", "set", peer, "netns", spec.netns_file)
    run("ip", "link", "set", spec.veth, "master", NODE_BRIDGE, "up")
    prefix = NODE_NETWORK.split("/")[1]
    run(*enter, "ip", "link", "set", "lo", "up")
    run(*enter, "ip", "link", "set", peer, "name", "eth0")
    run(*enter, "ip", "addr", "add", f"{spec.node_ip}/{prefix}", "dev", "eth0")
    run(*enter, "ip", "link", "set", "eth0", "up")
    run(*enter, "ip", "route", "add", "default", "via", HOST_NODE_IP)
    run(*enter, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
    run("ip", "route", "replace", spec.pod_subnet, "via", spec.node_ip, "dev", NODE_BRIDGE)


def node_cgroup_parents() -> list[str]:
    """The cgroup parents of every node there can be (those that exist are removed)."""
    return [NodeSpec(Path(), i).cgroup_parent for i in range(MAX_NODES)]


def kill_shims(*layouts: Layout) -> None:
    """Kill the container shims (and so the containers) of our containerds."""
    markers = [str(layout.containerd_socket).encode() for layout in layouts]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and any(m in cmdline for m in markers):
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
