"""How commands print objects: ``-o json`` and ``-o yaml`` the way kubectl does.

A list of Kubernetes objects is a ``v1 List`` in JSON (what ``kubectl apply -f -`` reads) and
a multi-document stream in YAML. Keys are camelCase, as in the Kubernetes API.
"""

from __future__ import annotations

import json
from typing import Any


def camel_keys(obj: Any) -> Any:
    """``obj`` with every ``snake_case`` mapping key turned into ``camelCase``."""
    if isinstance(obj, dict):
        return {_camel(str(k)): camel_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [camel_keys(v) for v in obj]
    return obj


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def as_list(items: list[Any]) -> dict[str, Any]:
    """Objects wrapped in a ``v1 List``, as ``kubectl get -o json`` prints several."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}


def print_objects(obj: Any, output: str) -> None:
    """Print one object or a list of objects as JSON or YAML."""
    if output == "json":
        print(json.dumps(as_list(obj) if isinstance(obj, list) else obj, indent=2))
    else:
        import yaml  # only here: the agent's start-up never prints YAML

        print(yaml.safe_dump_all(obj if isinstance(obj, list) else [obj], sort_keys=False), end="")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns aligned with two spaces, as kubectl prints them; one string per line."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
