"""The controller's worker when the API server refuses a write: what is retried, how soon, and
what the domain's owner sees."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from dra_driver.computedomain import controller
from dra_driver.computedomain.api import OWN
from dra_driver.computedomain.controller import DomainController
from dra_driver.computedomain.objects import DaemonSettings
from dra_driver.kube import APPLY_PATCH, Response

UID = "uid-train"
DOMAIN = {
    "kind": "ComputeDomain",
    "metadata": {"namespace": "team", "name": "train", "uid": UID},
    "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "train-channel"}}},
}


class RefusingApply:
    """Answers every request with 200, except the apply of the domain's channel template."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.applies = 0
        self.events: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        if path.endswith("/events"):
            self.events.append(kw["body"])
        elif kw.get("content_type") == APPLY_PATCH and path.endswith("/train-channel"):
            self.applies += 1
            status = {"kind": "Status", "message": f"refused with {self.status}"}
            return Response(self.status, {}, json.dumps(status).encode())
        return Response(200, {}, b"{}")


async def _worker_runs(client: RefusingApply, seconds: float) -> None:
    """The controller's worker, with views holding the domain and nothing else, for a while."""
    settings = DaemonSettings(namespace="dra-driver", image="img")
    work = DomainController(client, OWN, settings)  # type: ignore[arg-type]
    work.domains.listed([DOMAIN])
    work._queue(UID)
    task = asyncio.create_task(work._work())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("status", "refused"),
    [
        (422, True),  # invalid: the object will not change by itself
        (403, True),  # forbidden (a policy, a namespace being terminated)
        (400, True),
        (409, False),  # a conflict passes
        (429, False),  # so does throttling
        (500, False),  # and the API server's own failures
    ],
)
async def test_a_refused_apply_is_told_on_the_domain_and_not_retried_at_once(
    monkeypatch: pytest.MonkeyPatch, status: int, refused: bool
) -> None:
    """A refused apply stops the domain's reconcile before its status is written: without an
    Event nothing on the domain says why it never works, and retrying every RETRY_DELAY only
    gets the same answer. The resync (or a change) tries it again."""
    monkeypatch.setattr(controller, "RETRY_DELAY", 0.01)
    client = RefusingApply(status)
    await _worker_runs(client, 0.3)
    if refused:
        assert client.applies == 1
        [event] = client.events
        assert event["type"] == "Warning" and event["reason"] == "ApplyRefused"
        assert event["involvedObject"]["uid"] == UID
        assert "team/train-channel" in event["message"]
        assert f"{status} refused with {status}" in event["message"]
    else:
        assert client.applies > 3  # retried after RETRY_DELAY
        assert client.events == []


async def test_rounds_that_fail_while_the_api_server_is_away_share_one_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every watch event and resync of a domain while the API server fails is another failed
    round. Each used to schedule a retry of its own, and each retry the next: every event of an
    outage added a retry loop to the domain, without bound (a resync every 30 s alone, 120
    loops an hour). The rounds that fail meanwhile share the one retry scheduled."""
    monkeypatch.setattr(controller, "RETRY_DELAY", 0.3)
    client = RefusingApply(500)
    settings = DaemonSettings(namespace="dra-driver", image="img")
    work = DomainController(client, OWN, settings, resync=3600)  # type: ignore[arg-type]
    work.domains.listed([DOMAIN])
    task = asyncio.create_task(work._work())
    try:
        for _ in range(5):  # five events for the domain, each its own failed round
            work._queue(UID)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.4)  # the first retry is due at 0.3 s, the next at 0.6 s
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # The five rounds, then one retry (was: a retry for each failed round, ten in all).
    assert 5 <= client.applies <= 6
