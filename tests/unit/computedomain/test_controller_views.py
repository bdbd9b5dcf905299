"""The controller's view of the ComputeDomains: parsed once per change, found by UID."""

from __future__ import annotations

from typing import Any

from dra_driver.computedomain.api import OWN
from dra_driver.computedomain.controller import DomainView

SPEC = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}


def obj(name: str, uid: str, channel: int | None = None, spec: Any = SPEC) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team", "name": name, "uid": uid}
    if channel is not None:
        meta["annotations"] = {OWN.channel_annotation: str(channel)}
    return {"kind": "ComputeDomain", "metadata": meta, "spec": spec}


def test_a_listing_is_parsed_and_found_by_uid() -> None:
    view = DomainView(OWN)
    view.listed([obj("a", "uid-a", 3), obj("b", "uid-b", spec={"numNodes": -1})])
    domains = view.by_uid()
    assert sorted(domains) == ["uid-a", "uid-b"]
    assert domains["uid-a"].channel == 3
    assert domains["uid-b"].spec is None and domains["uid-b"].spec_error
    assert view.synced.is_set()


def test_events_replace_and_remove_the_parsed_domain() -> None:
    view = DomainView(OWN)
    view.listed([obj("a", "uid-a")])
    view.event("MODIFIED", obj("a", "uid-a", 5))
    assert view.by_uid()["uid-a"].channel == 5
    view.event("ADDED", obj("b", "uid-b"))
    view.event("DELETED", obj("a", "uid-a", 5))
    assert sorted(view.by_uid()) == ["uid-b"]
    assert list(view.objects) == ["team/b"]


def test_a_domain_made_again_under_its_name_is_only_the_new_one() -> None:
    view = DomainView(OWN)
    view.listed([obj("a", "uid-old", 1)])
    view.event("DELETED", obj("a", "uid-old", 1))
    view.event("ADDED", obj("a", "uid-new"))
    assert list(view.by_uid()) == ["uid-new"]
    # A relist drops what the watch missed.
    view.listed([])
    assert view.by_uid() == {}
