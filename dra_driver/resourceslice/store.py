"""The controller's copy of one node's slices of one driver, fed by list, watch and writes.

Watch events can arrive after the answer to our own write, so an older version of a slice
never replaces a newer one, and a late DELETED event of an earlier incarnation never removes
the slice that replaced it. The answer to a write can also arrive after the watch already
showed that slice deleted (or a listing showed it gone): such an answer is not stored, or the
controller would believe in a slice that no longer exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


def field_selector(node_name: str, driver: str) -> str:
    """The field selector for one node's slices of one driver."""
    return f"spec.nodeName={node_name},spec.driver={driver}"


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata, empty when missing or malformed."""
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def is_older(candidate: str, current: str) -> bool:
    """True if resourceVersion ``candidate`` is known to precede ``current``.

    resourceVersions are opaque; in practice they are etcd revisions (integers), and comparing
    them is the only way to drop a stale watch event that arrives after our own write's result.
    When either is not an integer nothing is assumed.
    """
    if candidate.isdigit() and current.isdigit():
        return int(candidate) < int(current)
    return False


def has_seen(seen: str, version: str) -> bool:
    """True if a view current to resourceVersion ``seen`` is known to include ``version``."""
    return version.isdigit() and seen.isdigit() and int(version) <= int(seen)


@dataclass
class SliceStore:
    """The slices of ``driver`` on ``node_name`` as last seen, by name."""

    driver: str
    node_name: str
    objects: dict[str, JSON] = field(default_factory=dict)

    def replace(self, items: Iterable[JSON]) -> None:
        """Start over from a listing."""
        self.objects = {
            str(meta(o).get("name")): o for o in items if meta(o).get("name") and self.is_ours(o)
        }

    def is_ours(self, obj: Mapping[str, Any]) -> bool:
        """Whether a slice belongs to this node and driver."""
        # The server filters by field selector already; this guards against a misbehaving proxy.
        spec = obj.get("spec") or {}
        return spec.get("driver") == self.driver and spec.get("nodeName") == self.node_name

    def remember(self, obj: JSON) -> None:
        """Store a slice unless the store already holds a newer version of the same object."""
        m = meta(obj)
        name = str(m.get("name", ""))
        if not name:
            return
        if not self.is_ours(obj):
            self.objects.pop(name, None)
            return
        current = self.objects.get(name)
        if current is not None:
            cur = meta(current)
            if cur.get("uid") == m.get("uid") and is_older(
                str(m.get("resourceVersion", "")), str(cur.get("resourceVersion", ""))
            ):
                return
        self.objects[name] = obj

    def remember_written(self, obj: JSON, seen: str) -> None:
        """Store the server's answer to our own write, unless the view (current to the
        resourceVersion ``seen``, from the watch or a listing) already moved past that answer
        and does not hold the object: it was deleted meanwhile, and its DELETED event is
        already handled."""
        m = meta(obj)
        current = self.objects.get(str(m.get("name", "")))
        held = current is not None and meta(current).get("uid") == m.get("uid")
        if not held and has_seen(seen, str(m.get("resourceVersion", ""))):
            return
        self.remember(obj)

    def forget(self, obj: Mapping[str, Any]) -> None:
        """Drop a deleted slice, unless the store holds a newer incarnation of that name."""
        m = meta(obj)
        name = str(m.get("name", ""))
        current = self.objects.get(name)
        # A late DELETED event of an older incarnation must not remove a recreated slice.
        if current is not None and meta(current).get("uid") in (None, m.get("uid")):
            del self.objects[name]
