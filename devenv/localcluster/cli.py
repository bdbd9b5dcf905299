"""``python -m devenv.localcluster up|down|status``: a cluster that outlives the command.

``up`` records the cluster's processes in ``.cache/cluster/state.json`` so that ``down``
(another process) can stop them; ``make cluster`` and ``make cluster-down`` call these.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devenv.localcluster.cluster import LocalCluster, stop_rank
from devenv.localcluster.flags import parse_node_spec
from devenv.localcluster.processes import (
    ClusterError,
    ManagedProcess,
    pid_alive,
    process_identity,
    repo_root,
)

STATE_FILE = "state.json"
#: Marks a directory `up` made, so a later `up` may clear it.
BASE_MARK = ".localcluster"


def state_dir() -> Path:
    return repo_root() / ".cache" / "cluster"


def _load_state() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir() / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data


def _running(state: dict[str, Any]) -> dict[str, int]:
    """The recorded processes that still run: alive, and the same processes that were
    recorded (a PID taken by another process since, after a reboot say, is not ours to stop).
    A state without identities (written by an older `up`) is trusted by PID alone."""
    identities: dict[str, str | None] = state.get("identities") or {}
    return {
        name: int(pid)
        for name, pid in (state.get("processes") or {}).items()
        if pid_alive(int(pid))
        and (name not in identities or process_identity(int(pid)) == identities[name])
    }


def _running_state() -> dict[str, Any] | None:
    """The saved state of a background cluster that still has live processes."""
    state = _load_state()
    if state and _running(state):
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
    try:
        nodes = [parse_node_spec(spec) for spec in args.node]
    except ValueError as e:
        print(f"error: --node: {e}", file=sys.stderr)
        return 2
    base = Path(args.base_dir) if args.base_dir else state_dir() / "run"
    if args.base_dir and not _clearable(base):
        print(
            f"error: --base-dir {base} holds files that are not a cluster's:"
            " name a new or empty directory",
            file=sys.stderr,
        )
        return 2
    if base.is_dir() and any(base.iterdir()):
        shutil.rmtree(base)
    base.mkdir(parents=True, exist_ok=True)
    (base / BASE_MARK).touch()
    cluster = LocalCluster(base_dir=base, keep=True, verbosity=args.v)
    try:
        cluster.start()
        for name, labels in nodes:
            cluster.add_node(name, labels)
    except BaseException as e:
        # No state is saved for a cluster that did not come up, so `down` could not stop
        # it later: stop it now (its files stay, the logs explain the failure).
        cluster.stop()
        if not isinstance(e, ClusterError):
            raise
        print(f"error: {e}", file=sys.stderr)
        print(f"logs: {cluster.logs_dir}", file=sys.stderr)
        return 1
    save_state(cluster)
    print(f"Kubernetes {cluster.version} control plane running at {cluster.server}")
    print(f"logs: {cluster.logs_dir}")
    for name, node in cluster.nodes.items():
        print(f"node {name}: root {node.root_dir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _clearable(base: Path) -> bool:
    """Whether `up` may remove ``base``: absent, empty, or made by an earlier `up` (the
    default directory always is). A mistyped ``--base-dir`` must not cost a user's files."""
    if base.is_symlink():
        return False  # dangling or not, removing it would not remove what it names
    if not base.exists():
        return True
    if not base.is_dir():
        return False
    return (base / BASE_MARK).is_file() or not any(base.iterdir())


def _cmd_down(args: argparse.Namespace) -> int:
    state = _load_state()
    if state is None:
        print("no cluster state found; nothing to stop")
        return 0
    # nodes and extras first, etcd last
    ordered = sorted(_running(state).items(), key=lambda kv: stop_rank(kv[0]))
    for name, pid in ordered:
        ManagedProcess(name, [], Path(os.devnull), pid=pid).stop()
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
    running = _running(state)
    for name, pid in state.get("processes", {}).items():
        print(f"{name:32} pid {pid:<8} {'running' if name in running else 'stopped'}")
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.localcluster", description="local Kubernetes control plane"
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
