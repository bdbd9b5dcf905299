"""Driver libraries and hooks for containers, from the NVIDIA Container Toolkit when present.

``nvidia-ctk cdi generate`` knows which driver libraries, binaries and hooks a host has; the
claim specs reuse its common edits instead of a hand-written library list. Without it, claims
get device nodes and environment only (enough for the demo; a production node should have it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import structlog

from dra_driver.cdi.spec import NO_EDITS, ContainerEdits, DeviceNode, Mount

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


def common_edits(driver_root: str = "/", executable: str = "nvidia-ctk") -> ContainerEdits:
    """The common edits ``nvidia-ctk`` generates for this host, or none (logged once)."""
    path = shutil.which(executable)
    if path is None:
        log.warning(
            "nvidia-ctk not found: CDI specs carry device nodes and environment only; "
            "install the NVIDIA Container Toolkit for driver libraries and hooks"
        )
        return NO_EDITS
    cmd = [path, "cdi", "generate", "--format=json", f"--driver-root={driver_root}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
        spec = json.loads(proc.stdout)
        edits = edits_from_json(spec.get("containerEdits") or {})
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        log.error(
            "nvidia-ctk cdi generate failed; using device nodes only",
            error=str(exc),
            stderr=stderr[-500:],
        )
        return NO_EDITS
    log.info("using nvidia-ctk common edits", mounts=len(edits.mounts), hooks=len(edits.hooks))
    return edits
