"""The controller's view of the ComputeDomains: parsed once per change, found by UID."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver.computedomain import controller
from dra_driver.computedomain.api import OWN, ApiNames, Domain, read_domain
from dra_driver.computedomain.controller import DomainController, DomainView
from dra_driver.computedomain.objects import DaemonSettings
from dra_driver.kube import Response

SPEC = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}


def obj(name: str, uid: str, channel: int | str | None = None, spec: Any = SPEC) -> dict[str, Any]:
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


@pytest.mark.parametrize("written", ["0", "7", "2047", "0042"])
def test_a_channel_annotation_is_read(written: str) -> None:
    view = DomainView(OWN)
    view.listed([obj("a", "uid-a", written)])
    assert view.by_uid()["uid-a"].channel == int(written)


@pytest.mark.parametrize(
    "odd",
    [
        "\u00b2",  # superscript two: str.isdigit() is True, int() refuses it
        "\uff13",  # fullwidth three: int() would take it
        "\u0663",  # Arabic-Indic three, likewise
        "2048",  # beyond the kernel's channels
        "99999",
        "-1",
        "+3",
        " 3",
        "3\n",
        "",
        "three",
        "1" * 5000,
    ],
)
def test_an_odd_channel_annotation_is_no_channel(odd: str) -> None:
    """Anyone who may edit a domain may write its annotation: a value the controller did not
    write is logged and read as no channel (the planner gives one again), never raised out
    of the reflector's callback, which would end the controller for every domain."""
    view = DomainView(OWN)
    with capture_logs() as logs:
        view.listed([obj("a", "uid-a", odd)])
        view.event("MODIFIED", obj("a", "uid-a", odd))
    assert view.by_uid()["uid-a"].channel is None
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert warnings and all(e["domain"] == "team/a" for e in warnings)


def test_a_domain_that_cannot_be_read_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever goes wrong reading one domain is logged and that domain skipped: the others
    are still followed, and nothing is raised into the reflector."""
    unreadable = {"bad"}

    def read(o: dict[str, Any], names: ApiNames) -> Domain:
        if o["metadata"]["name"] in unreadable:
            raise RuntimeError("a bug in reading")
        return read_domain(o, names)

    monkeypatch.setattr(controller, "read_domain", read)
    view = DomainView(OWN)
    with capture_logs() as logs:
        view.listed([obj("a", "uid-a", 1), obj("bad", "uid-bad", 2)])
        assert sorted(view.by_uid()) == ["uid-a"]
        view.event("ADDED", obj("b", "uid-b"))
        view.event("MODIFIED", obj("bad", "uid-bad", 3))
        assert sorted(view.by_uid()) == ["uid-a", "uid-b"]
        unreadable.clear()
        view.event("MODIFIED", obj("bad", "uid-bad", 4))
        assert view.by_uid()["uid-bad"].channel == 4
        # Unreadable again: the old reading is dropped, not planned on as if still current.
        unreadable.add("bad")
        view.event("MODIFIED", obj("bad", "uid-bad", 5))
        assert sorted(view.by_uid()) == ["uid-a", "uid-b"]
    assert sorted(view.objects) == ["team/a", "team/b", "team/bad"]
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["domain"] for e in errors] == ["team/bad"] * 3


class Patches:
    """Answers every request with 200 and keeps the paths and bodies of the PATCHes."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        if method == "PATCH":
            self.patched.append((path, kw.get("body")))
        return Response(200, {}, b"{}")


@pytest.mark.parametrize("first", ["uid-b", "uid-a"])
async def test_of_two_domains_holding_one_channel_the_younger_gets_another(first: str) -> None:
    """A domain's manifest applied again under another name carries the channel annotation of
    the domain it was read from (and a channel written whose answer was lost is given again
    to the next domain): two live domains held one channel, forever. The older keeps it; the
    younger gets a free one, whichever is reconciled first."""
    copied = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "copy-channel"}}}
    older, younger = obj("first", "uid-b", 3), obj("copy", "uid-a", 3, spec=copied)
    older["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    younger["metadata"]["creationTimestamp"] = "2026-12-07T10:00:00Z"
    client = Patches()
    settings = DaemonSettings(namespace="dra-driver", image="img")
    work = DomainController(client, OWN, settings)  # type: ignore[arg-type]
    work.domains.listed([older, younger])
    domains = work.domains.by_uid()
    for uid in sorted(domains, key=lambda uid: uid != first):
        await work.reconcile(domains[uid])
    given = {
        path.rsplit("/", 1)[-1]: body["metadata"]["annotations"][OWN.channel_annotation]
        for path, body in client.patched
        if "/computedomains/" in path and "annotations" in body.get("metadata", {})
    }
    assert given == {"copy": "0"}
    template = [
        body
        for path, body in client.patched
        if path.endswith("/namespaces/team/resourceclaimtemplates/copy-channel")
    ]
    params = template[-1]["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["domainID"] == "uid-a" and params["channel"] == 0
