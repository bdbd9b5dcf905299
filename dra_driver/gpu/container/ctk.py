"""Driver libraries and hooks for containers: the NVIDIA Container Toolkit's, else our own.

When ``nvidia-ctk`` is installed, ``nvidia-ctk cdi generate`` supplies the common edits (its
library list, and hooks that create symlinks and update the loader cache in the container).
Without it (or when it fails), :mod:`dra_driver.gpu.container.driverfiles` finds the driver's
files under the driver root and mounts them where the loader of any image finds them.

``nvidia-ctk`` runs in the agent's container and names paths as the agent sees them; the spec
is read by the container runtime on the host. Its host paths are therefore moved from the
driver root as the agent sees it to the same directory as the host sees it, and its hooks are
pointed at the host's hook binary when the agent can see one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from dra_driver.cdi.spec import ContainerEdits, DeviceNode, Mount
from dra_driver.gpu.container.driverfiles import discover_edits
from dra_driver.gpu.driverroot import resolve_in

log = structlog.get_logger(__name__)

#: Where the host may have the toolkit's hook binary, relative to the driver root: the
#: toolkit packages' default paths and the GPU Operator's toolkit directory. ``nvidia-ctk``
#: comes first: given its path, every toolkit version writes ``nvidia-ctk hook <name>``;
#: given ``nvidia-cdi-hook``'s, versions before v1.16 write ``nvidia-cdi-hook hook <name>``,
#: which that binary does not take.
HOOK_BINARIES = (
    "usr/bin/nvidia-ctk",
    "usr/local/nvidia/toolkit/nvidia-ctk",
    "usr/bin/nvidia-cdi-hook",
    "usr/local/nvidia/toolkit/nvidia-cdi-hook",
)


def edits_from_json(raw: dict[str, Any]) -> ContainerEdits:
    """Container edits from CDI JSON (the ``containerEdits`` object of a spec)."""
    return ContainerEdits(
        env=tuple(raw.get("env") or ()),
        device_nodes=tuple(
            DeviceNode(
                path=n["path"],
                host_path=n.get("hostPath"),
                type=n.get("type"),
                permissions=n.get("permissions"),
            )
            for n in raw.get("deviceNodes") or ()
        ),
        mounts=tuple(
            Mount(
                host_path=m["hostPath"],
                container_path=m["containerPath"],
                options=tuple(m.get("options") or ()),
                type=m.get("type"),
            )
            for m in raw.get("mounts") or ()
        ),
        hooks=tuple(raw.get("hooks") or ()),
    )


def host_path(path: str, driver_root: str, host_root: str) -> str:
    """``path`` as the host sees it: a path under ``driver_root`` (where this process sees the
    driver root) moved under ``host_root`` (where the host has it); any other path as is."""
    root = PurePosixPath(driver_root)
    candidate = PurePosixPath(path)
    if not candidate.is_relative_to(root):  # compares whole components: /driver-rootX is not
        return path
    return str(PurePosixPath(host_root) / candidate.relative_to(root))


def on_host(edits: ContainerEdits, driver_root: str, host_root: str) -> ContainerEdits:
    """``edits`` with every mount's and device node's host path as the host sees it."""

    def moved(path: str) -> str:
        return host_path(path, driver_root, host_root)

    return replace(
        edits,
        device_nodes=tuple(
            replace(n, host_path=moved(n.host_path)) if n.host_path else n
            for n in edits.device_nodes
        ),
        mounts=tuple(replace(m, host_path=moved(m.host_path)) for m in edits.mounts),
    )


def host_hook_binary(driver_root: Path, host_root: Path) -> str | None:
    """The host's path of a toolkit hook binary found under ``driver_root``, if any.

    Hooks run in the runtime's mount namespace on the host, so the spec must name a binary
    there; the agent's own ``nvidia-ctk`` path exists only in its image. The path is not
    resolved: the hook's arguments depend on the binary's name."""
    for relative in HOOK_BINARIES:
        found = resolve_in(driver_root, driver_root / relative)
        if found.is_file() and os.access(found, os.X_OK):
            return str(host_root / relative)
    return None


def common_edits(
    driver_root: str = "/",
    executable: str = "nvidia-ctk",
    *,
    host_root: Path = Path("/"),
    driver_version: str = "",
) -> ContainerEdits:
    """The common edits ``nvidia-ctk`` generates for this host, else the driver files found
    under ``driver_root`` of ``driver_version``; either way with host paths under
    ``host_root``, where the host has the driver root this process sees at ``driver_root``."""

    def own() -> ContainerEdits:
        return discover_edits(Path(driver_root), host_root, driver_version)

    path = shutil.which(executable)
    if path is None:
        log.info("nvidia-ctk not found: CDI specs mount the driver files found by the agent")
        return own()
    cmd = [path, "cdi", "generate", "--format=json", f"--driver-root={driver_root}"]
    hook = host_hook_binary(Path(driver_root), host_root)
    if hook is not None:
        # An absolute path is written into the hooks as is. The flag is named
        # --nvidia-cdi-hook-path since v1.16; --nvidia-ctk-path is its name since v1.12 and
        # stays an alias, so every nvidia-ctk that generates specs takes it.
        cmd.append(f"--nvidia-ctk-path={hook}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
        spec = json.loads(proc.stdout)
        edits = on_host(
            edits_from_json(spec.get("containerEdits") or {}), driver_root, str(host_root)
        )
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        log.error(
            "nvidia-ctk cdi generate failed; mounting the driver files found by the agent",
            error=str(exc),
            stderr=stderr[-500:],
        )
        return own()
    if hook is None and edits.hooks:
        log.warning(
            "no nvidia-ctk or nvidia-cdi-hook found under the driver root: the hooks name the"
            " agent image's path, which must hold that binary on the host too",
            hooks=sorted({str(h.get("path")) for h in edits.hooks}),
        )
    log.info("using nvidia-ctk common edits", mounts=len(edits.mounts), hooks=len(edits.hooks))
    return edits
