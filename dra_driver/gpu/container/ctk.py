"""Driver libraries and hooks for containers: the NVIDIA Container Toolkit's, else our own.

When ``nvidia-ctk`` is installed, ``nvidia-ctk cdi generate`` supplies the common edits (its
library list, and hooks that create symlinks and update the loader cache in the container).
Without it (or when it fails), :mod:`dra_driver.gpu.container.driverfiles` finds the driver's
files under the driver root and mounts them where the loader of any image finds them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import structlog

from dra_driver.cdi.spec import ContainerEdits, DeviceNode, Mount
from dra_driver.gpu.container.driverfiles import discover_edits

log = structlog.get_logger(__name__)


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


def common_edits(
    driver_root: str = "/",
    executable: str = "nvidia-ctk",
    *,
    host_root: Path = Path("/"),
    driver_version: str = "",
) -> ContainerEdits:
    """The common edits ``nvidia-ctk`` generates for this host, else the driver files found
    under ``driver_root`` (host paths under ``host_root``) of ``driver_version``."""

    def own() -> ContainerEdits:
        return discover_edits(Path(driver_root), host_root, driver_version)

    path = shutil.which(executable)
    if path is None:
        log.info("nvidia-ctk not found: CDI specs mount the driver files found by the agent")
        return own()
    cmd = [path, "cdi", "generate", "--format=json", f"--driver-root={driver_root}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
        spec = json.loads(proc.stdout)
        edits = edits_from_json(spec.get("containerEdits") or {})
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        log.error(
            "nvidia-ctk cdi generate failed; mounting the driver files found by the agent",
            error=str(exc),
            stderr=stderr[-500:],
        )
        return own()
    log.info("using nvidia-ctk common edits", mounts=len(edits.mounts), hooks=len(edits.hooks))
    return edits
