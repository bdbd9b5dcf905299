"""The Container Device Interface spec: the model, its naming rules and its minimum version.

Container runtimes reject specs whose ``cdiVersion`` is newer than they know, so a spec states
the lowest version whose features it uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dra_driver.errors import DriverError

JSON = dict[str, Any]

# Used with fullmatch: "$" would also match before a trailing newline.
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CdiNameError(DriverError, ValueError):
    """A vendor, class or device name that CDI's naming rules reject."""


def check_kind(kind: str) -> tuple[str, str]:
    """Split ``vendor/class`` and check both parts."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR_OR_CLASS.fullmatch(vendor) or not _VENDOR_OR_CLASS.fullmatch(cls):
        raise CdiNameError(f"invalid CDI kind {kind!r}: want vendor/class")
    return vendor, cls


def check_device_name(name: str) -> str:
    """Device names start and end alphanumeric and may contain ``_.:-``."""
    if not _DEVICE_NAME.fullmatch(name):
        raise CdiNameError(f"invalid CDI device name {name!r}")
    return name


def qualified_name(kind: str, device: str) -> str:
    """The fully qualified device ID ``vendor/class=name`` the runtime resolves."""
    check_kind(kind)
    return f"{kind}={check_device_name(device)}"


def parse_qualified_name(device_id: str) -> tuple[str, str, str]:
    """``vendor/class=name`` -> (vendor, class, name), checking every part."""
    kind, sep, name = device_id.partition("=")
    if not sep:
        raise CdiNameError(f"invalid CDI device ID {device_id!r}: want vendor/class=name")
    vendor, cls = check_kind(kind)
    return vendor, cls, check_device_name(name)


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container."""

    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    permissions: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"path": self.path}
        for key, value in (
            ("hostPath", self.host_path),
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("permissions", self.permissions),
        ):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Mount:
    """A bind mount into the container."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type is not None:
            out["type"] = self.type
        return out


@dataclass(frozen=True)
class ContainerEdits:
    """Environment, device nodes, mounts and hooks (hooks stay raw JSON: nothing inspects them)."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[JSON, ...] = ()

    def to_json(self) -> JSON:
        out: JSON = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_json() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [dict(h) for h in self.hooks]
        return out


NO_EDITS = ContainerEdits()


@dataclass(frozen=True)
class Device:
    """One named device of a spec."""

    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class Spec:
    """A whole CDI spec file."""

    kind: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)

    def to_json(self) -> JSON:
        """The spec as written to disk, with its minimum ``cdiVersion``."""
        body: JSON = {
            "kind": self.kind,
            "devices": [
                {"name": d.name, "containerEdits": d.edits.to_json()} for d in self.devices
            ],
        }
        if self.edits.to_json():
            body["containerEdits"] = self.edits.to_json()
        return {"cdiVersion": minimum_version(body), **body}


def _all_edits(body: JSON) -> list[JSON]:
    return [
        body.get("containerEdits") or {},
        *[d.get("containerEdits") or {} for d in body["devices"]],
    ]


def minimum_version(body: JSON) -> str:
    """The lowest CDI version whose features the spec body uses."""
    edits = _all_edits(body)
    _, cls = check_kind(body["kind"])
    if any(e.get("netDevices") for e in edits):
        return "1.1.0"
    if any(e.get("intelRdt") or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if body.get("annotations") or any(d.get("annotations") for d in body["devices"]) or "." in cls:
        return "0.6.0"
    if any(not d["name"][:1].isalpha() for d in body["devices"]) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"
