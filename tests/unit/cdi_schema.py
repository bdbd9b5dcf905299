"""Validate CDI specs against the CDI project's JSON schema (tests/data/cdi-schema)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "data" / "cdi-schema"


@cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


def schema_errors(spec: dict[str, Any]) -> list[str]:
    """Every schema violation of ``spec``."""
    return [e.message for e in _validator().iter_errors(spec)]
