"""Who may hold a controller's Lease, and what a holder writes."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from dra_driver import leaderelection
from dra_driver.kube import Response
from dra_driver.leaderelection import LeaderElector, LostLease, lease_spec, may_take

NOW = datetime.datetime(2026, 11, 27, 3, 0, 0, tzinfo=datetime.UTC)


def lease(holder: str, seconds_ago: float, duration: Any = 15) -> dict[str, Any]:
    renewed = NOW - datetime.timedelta(seconds=seconds_ago)
    return {
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    }


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, True),  # no lease yet
        (lease("", 1), True),  # released
        (lease("me", 1), True),  # ours: renew
        (lease("other", 1), False),  # held and fresh
        (lease("other", 14.9), False),
        (lease("other", 15.1), True),  # expired
        (lease("other", 1, duration=None), True),  # unreadable: nobody can hold it
        ({"spec": {"holderIdentity": "other", "leaseDurationSeconds": 15}}, True),
    ],
)
def test_may_take(current: dict[str, Any] | None, expected: bool) -> None:
    assert may_take(current, "me", NOW) is expected


def test_taking_counts_a_transition_and_renewing_does_not() -> None:
    taken = lease_spec(lease("other", 20), "me", 15, NOW)
    assert taken["holderIdentity"] == "me" and taken["leaseTransitions"] == 1
    assert taken["acquireTime"] == taken["renewTime"] == "2026-11-27T03:00:00.000000Z"
    later = NOW + datetime.timedelta(seconds=2)
    renewed = lease_spec({"spec": taken}, "me", 15, later)
    assert renewed["leaseTransitions"] == 1
    assert renewed["acquireTime"] == taken["acquireTime"]
    assert renewed["renewTime"] == "2026-11-27T03:00:02.000000Z"
    assert lease_spec(None, "me", 15, NOW)["leaseTransitions"] == 0


class FakeLeases:
    """One Lease behind ``request``, as the API server keeps it (resourceVersion checks)."""

    def __init__(self, lease: dict[str, Any] | None = None) -> None:
        self.lease = lease
        self.version = 1
        self.puts: list[dict[str, Any]] = []
        #: PUTs after this many hang until their deadline (a stalled API server).
        self.hang_after: int | None = None
        #: Called before each GET answer (another replica renewing meanwhile).
        self.before_get: Any = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        timeout: float = 30.0,  # noqa: ASYNC109
        **_: Any,
    ) -> Response:
        if method == "GET":
            if self.before_get is not None:
                self.before_get(self)
            if self.lease is None:
                return Response(404, {}, b"{}")
            return Response(200, {}, json.dumps(self.lease).encode())
        if self.hang_after is not None and len(self.puts) >= self.hang_after:
            await asyncio.sleep(timeout)
            raise TimeoutError
        if method == "PUT" and body["metadata"]["resourceVersion"] != str(self.version):
            return Response(409, {}, b"{}")
        self.version += 1
        self.lease = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        self.puts.append(body)
        return Response(200, {}, b"{}")


def held_by_other(renewed: datetime.datetime, version: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "l", "resourceVersion": str(version)},
        "spec": {
            "holderIdentity": "other",
            "leaseDurationSeconds": 1,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def elector(api: FakeLeases, identity: str = "me", **timing: float) -> LeaderElector:
    """An elector of lease ns/l with short times (``timing`` overrides them)."""
    times = {"renew_deadline": 0.6, "renew_every": 0.1, "retry_every": 0.1, **timing}
    return LeaderElector(
        api,  # type: ignore[arg-type]
        namespace="ns",
        name="l",
        identity=identity,
        duration=1,
        **times,
    )


async def test_leader_stops_before_its_lease_expires_when_a_renewal_hangs() -> None:
    api = FakeLeases(held_by_other(datetime.datetime.now(datetime.UTC), 1))
    api.lease["spec"]["holderIdentity"] = ""  # type: ignore[index]
    api.hang_after = 3  # take, renew twice, then the API server stalls
    stopped_at: list[datetime.datetime] = []

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped_at.append(datetime.datetime.now(datetime.UTC))

    with pytest.raises(LostLease):
        await asyncio.wait_for(elector(api).run(work), 3)
    last = api.puts[-1]["spec"]
    expires = datetime.datetime.fromisoformat(last["renewTime"].replace("Z", "+00:00"))
    expires += datetime.timedelta(seconds=last["leaseDurationSeconds"])
    # Another replica may take the lease from `expires` on: this one must have stopped.
    assert stopped_at and stopped_at[0] < expires


async def test_a_live_leader_is_not_displaced_by_a_clock_that_runs_ahead() -> None:
    # The other leader renews on every look, but its clock is a minute behind ours.
    def renewing(api: FakeLeases) -> None:
        api.version += 1
        skewed = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=60)
        api.lease = held_by_other(skewed, api.version)

    api = FakeLeases()
    api.before_get = renewing
    started = asyncio.Event()

    async def work() -> None:
        started.set()

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(elector(api).run(work), 1.5)
    assert not api.puts and not started.is_set()


async def test_a_dead_leader_whose_clock_ran_ahead_is_replaced_after_one_duration() -> None:
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3600)
    api = FakeLeases(held_by_other(ahead, 1))

    async def work() -> None:
        pass

    await asyncio.wait_for(elector(api).run(work), 3)
    # Taken (and given up again once the work ended).
    assert [p["spec"]["holderIdentity"] for p in api.puts] == ["me", ""]


async def _leading(api: FakeLeases, work: Any) -> asyncio.Task[None]:
    """The elector running ``work`` once it holds the lease."""
    task = asyncio.create_task(elector(api).run(work))
    for _ in range(200):
        if api.lease is not None and api.lease["spec"]["holderIdentity"] == "me":
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the lease was never taken")


async def test_a_leader_stopped_gives_its_lease_up_so_a_standby_takes_it_at_once() -> None:
    api = FakeLeases()
    stopped = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    leader = await _leading(api, work)
    # A standby that has watched the lease held by the leader.
    standby = elector(api, "other", retry_every=0.05)
    standby_started = asyncio.Event()

    async def standby_work() -> None:
        standby_started.set()
        await asyncio.sleep(3600)

    waiting = asyncio.create_task(standby.run(standby_work))
    await asyncio.sleep(0.1)
    assert not standby_started.is_set()
    # SIGTERM: the process cancels the controller.
    leader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leader
    assert stopped.is_set()
    # The standby acts well before the lease's duration (1 s) would have passed.
    await asyncio.wait_for(standby_started.wait(), 0.6)
    assert api.lease["spec"]["holderIdentity"] == "other"  # type: ignore[index]
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def test_a_stopped_leader_never_releases_a_lease_another_replica_holds() -> None:
    api = FakeLeases()

    async def work() -> None:
        await asyncio.sleep(3600)

    leader = await _leading(api, work)
    # The lease was deleted and another replica created it meanwhile.
    api.version += 1
    api.lease = held_by_other(datetime.datetime.now(datetime.UTC), api.version)
    puts = len(api.puts)
    leader.cancel()
    with contextlib.suppress(asyncio.CancelledError, LostLease):
        await leader
    assert len(api.puts) == puts
    assert api.lease["spec"]["holderIdentity"] == "other"


async def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    api = FakeLeases()
    stopped_at: list[float] = []
    loop = asyncio.get_running_loop()

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped_at.append(loop.time())

    leader = await _leading(api, work)

    # The lease was deleted and another replica created it first; it renews as it works.
    def renewing(api: FakeLeases) -> None:
        api.version += 1
        api.lease = held_by_other(datetime.datetime.now(datetime.UTC), api.version)

    api.before_get = renewing
    taken_at = loop.time()
    with pytest.raises(LostLease):
        await asyncio.wait_for(leader, 3)
    # Within a renewal or two (0.1 s each), not at the renew deadline (0.6 s): the other
    # replica acts already.
    assert stopped_at and stopped_at[0] - taken_at < 0.45


async def test_a_lease_the_api_server_refuses_is_logged_not_waited_on_in_silence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Role lacks the Lease (a customised chart, an admission webhook): 403 on every read.
    monkeypatch.setattr(leaderelection, "log", structlog.get_logger(leaderelection.__name__))
    api = FakeLeases()

    async def forbidden(method: str, path: str, **_: Any) -> Response:
        return Response(403, {}, b'{"message": "leases is forbidden"}', "Forbidden")

    api.request = forbidden  # type: ignore[method-assign]

    async def work() -> None:
        pass

    with capture_logs() as logs, contextlib.suppress(TimeoutError):
        await asyncio.wait_for(elector(api).run(work), 0.3)
    refused = [e for e in logs if e["event"] == "lease request refused"]
    assert refused and refused[0]["status"] == 403 and refused[0]["log_level"] == "warning"
    assert "forbidden" in refused[0]["error"]
