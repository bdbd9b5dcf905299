"""The controller's worker on watch events: which domains an event of another object wakes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dra_driver.computedomain.api import OWN, read_domain
from dra_driver.computedomain.controller import DomainController, View
from dra_driver.computedomain.objects import DaemonSettings
from dra_driver.kube import APPLY_PATCH, Response

SETTINGS = DaemonSettings(namespace="dra-driver", image="img")
NEW = "uid-new"
OLD = "uid-old"
DOMAIN = {
    "kind": "ComputeDomain",
    "metadata": {
        "namespace": "team",
        "name": "train",
        "uid": NEW,
        "finalizers": [OWN.finalizer],
        "annotations": {OWN.channel_annotation: "4"},
    },
    "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "train-channel"}}},
    "status": {"status": "NotReady", "nodes": []},
}
#: The template of the same name made for a domain deleted just before (its teardown runs).
OLD_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"namespace": "team", "name": "train-channel", "labels": {OWN.domain_label: OLD}},
}


class Recording:
    """Answers every request with 200 and keeps the paths of the applies."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        if kw.get("content_type") == APPLY_PATCH:
            self.applied.append(path)
        return Response(200, {}, b"{}")


def deliver(work: DomainController, view: View, kind: str, obj: dict[str, Any]) -> None:
    """One watch event, handed over as the controller's reflectors hand it over."""
    view.event(kind, obj)
    work._queue_for(obj)


@contextlib.asynccontextmanager
async def working(client: Recording) -> AsyncIterator[DomainController]:
    """The controller's worker (no resync in the test's time) with the new domain and the old
    domain's template listed, the domain queued and handled once."""
    work = DomainController(client, OWN, SETTINGS, resync=3600)  # type: ignore[arg-type]
    work.domains.listed([DOMAIN])
    work.templates.listed([OLD_TEMPLATE])
    task = asyncio.create_task(work._work())
    try:
        work._queue(NEW)
        await asyncio.sleep(0.05)
        yield work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_template_name_freed_by_a_deleted_domain_is_taken_at_once() -> None:
    """A domain whose template name is still held by the template of a deleted domain waits
    (TemplateConflict); when that template is deleted, the domain makes its own at once, not
    only at the next resync."""
    client = Recording()
    async with working(client) as work:
        assert not [p for p in client.applied if p.endswith("/train-channel")]
        deliver(work, work.templates, "DELETED", OLD_TEMPLATE)
        await asyncio.sleep(0.05)
        template = "/namespaces/team/resourceclaimtemplates/train-channel"
        assert [p for p in client.applied if p.endswith(template)]


async def test_a_deleted_domain_leaves_nothing_behind_in_the_controller() -> None:
    """The Events told about a domain are remembered (so they are not repeated) only while the
    domain lives: a controller that runs for months sees many thousands of domains come and
    go."""
    async with working(Recording()) as work:
        assert any(key[0] == NEW for key in work._posted)  # the TemplateConflict Event
        deliver(work, work.domains, "DELETED", DOMAIN)
        await asyncio.sleep(0.05)
        assert not any(key[0] == NEW for key in work._posted)


async def test_a_domain_deleted_while_the_watch_was_away_leaves_nothing_behind() -> None:
    """A relist after a watch gap (410 Gone) drops a domain deleted meanwhile with no DELETED
    event: the channel given to it stayed taken in the controller, and its Events remembered,
    until the controller restarted. The relist (and each resync) lets them go."""
    async with working(Recording()) as work:
        work._assigned[NEW] = 4
        assert any(key[0] == NEW for key in work._posted)
        work.domains.listed([])  # as the reflector hands a relist over
        work._queue_all()
        await asyncio.sleep(0.05)
        assert NEW not in work._assigned
        assert not any(key[0] == NEW for key in work._posted)
        other = read_domain({"metadata": {"namespace": "team", "name": "b", "uid": "b"}}, OWN)
        assert work.taken_channels(other) == frozenset()  # channel 4 is free again
