"""A node of the local cluster: one kubelet-dra process and its directories."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.localcluster.processes import ManagedProcess, wait_for


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
