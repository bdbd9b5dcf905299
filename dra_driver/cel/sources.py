"""Where ``match`` gets devices, classes and claims: files, simulated profiles or a cluster."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dra_driver.cel.match import Device, slice_devices
from dra_driver.errors import DriverError

JSON = dict[str, Any]


class SourceError(DriverError):
    """A file could not be read or holds the wrong kind of object."""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, as an editor shows it: ``line 3, column 5: <problem>``."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def load_objects(path: str | Path) -> list[JSON]:
    """Every object in a YAML (multi-document) or JSON file; ``List`` kinds are flattened."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise SourceError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        docs = [json.loads(text)] if file.suffix == ".json" else list(yaml.safe_load_all(text))
    except ValueError as exc:
        raise SourceError(f"{file} is not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise SourceError(f"{file} is not valid YAML: {_yaml_problem(exc)}") from None
    return list(_flatten(d for d in docs if d))


def _flatten(docs: Iterable[Any]) -> Iterable[JSON]:
    for doc in docs:
        if isinstance(doc, list):
            yield from _flatten(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            yield from _flatten(doc["items"])
        elif isinstance(doc, dict):
            yield doc


def load_all(path: str | Path, kinds: tuple[str, ...]) -> list[JSON]:
    """Every object of one of ``kinds`` in a file, in file order; at least one."""
    found = [obj for obj in load_objects(path) if obj.get("kind") in kinds]
    if not found:
        raise SourceError(f"{path}: no {' or '.join(kinds)} found")
    return found


def slice_file_devices(path: str | Path) -> list[Device]:
    """The devices of the ResourceSlices in a file."""
    slices = [o for o in load_objects(path) if o.get("kind") in ("ResourceSlice", None)]
    if not slices:
        raise SourceError(f"{path}: no ResourceSlice found")
    return slice_devices(slices)


def profile_devices(profile: str, node_name: str, driver: str) -> list[Device]:
    """The devices a simulated node with ``profile`` would publish."""
    from dra_driver.gpu.publish.catalog import simulated_devices

    return [
        Device(driver, node_name, str(d["name"]), d, node_name)
        for d in simulated_devices(profile, node_name)
    ]
