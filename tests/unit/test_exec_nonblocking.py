"""Exec credential plugins never freeze the event loop.

A plugin can take seconds (a cloud login over the network); while it runs, the agent must go on
answering the kubelet and beating its liveness heartbeat. Each test runs a "heartbeat" task
beside the work and measures the longest gap between its ticks: it has to stay far below the
plugin's run time. The plugins are small Python scripts (see ``test_execcredential.plugin``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from dra_driver import execcredential
from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import KubeConfigError
from tests.unit.kubeserver import FakeApiServer, serve
from tests.unit.test_execcredential import V1, exec_user, rfc3339, runs
from tests.unit.test_kube import kubeconfig

T = TypeVar("T")

#: How long the slow plugin takes; the loop may not stall for anything near it.
PLUGIN_SECONDS = 2.0
#: The longest tolerated gap between heartbeat ticks (generous: the machine may be loaded).
MAX_GAP = 0.5


def slow_plugin(tmp_path: Path, *, sleep: float, expires_in: float | None) -> Path:
    """A plugin that sleeps, logs its run and prints a numbered token ``t<n>``.

    ``expires_in`` seconds from now the token expires; below the renewal margin, every use
    of the token needs a new run.
    """
    log = tmp_path / "plugin.log"
    script = tmp_path / "plugin"
    status: dict[str, Any] = {}
    if expires_in is not None:
        status["expirationTimestamp"] = rfc3339(datetime.now(UTC) + timedelta(seconds=expires_in))
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"log = {str(log)!r}\n"
        f"open({str(tmp_path / 'plugin.pid')!r}, 'w').write(str(os.getpid()))\n"
        f"time.sleep({sleep})\n"
        "n = (len(open(log).readlines()) if os.path.exists(log) else 0) + 1\n"
        "with open(log, 'a') as f:\n"
        "    f.write(json.dumps({'args': sys.argv[1:]}) + '\\n')\n"
        f"status = json.loads({json.dumps(json.dumps(status))})\n"
        "status['token'] = f't{n}'\n"
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', 'status': status}}))\n"
    )
    script.chmod(0o755)
    return script


async def with_heartbeat(work: Awaitable[T]) -> tuple[T, float]:
    """Run ``work`` beside a task ticking every 10 ms; its result and the longest gap."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    gaps: list[float] = []

    async def heartbeat() -> None:
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - before)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)  # the heartbeat is ticking before the work starts
    try:
        result = await work
    finally:
        done.set()
        await beat
    return result, max(gaps)


def whoami_route(server: FakeApiServer) -> None:
    async def whoami(request: web.Request) -> web.Response:
        return web.json_response({"auth": request.headers.get("Authorization", "")})

    server.routes[("GET", "/whoami")] = whoami


async def test_renewing_an_expired_token_does_not_stall_the_loop(tmp_path: Path) -> None:
    slow_plugin(tmp_path, sleep=PLUGIN_SECONDS, expires_in=5)  # within the renewal margin
    async with serve() as server:
        whoami_route(server)
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user=exec_user("./plugin")
        )
        async with await KubeClient.create(str(path)) as client:
            answer, gap = await with_heartbeat(client.request("GET", "/whoami"))
    assert answer.json() == {"auth": "Bearer t2"}  # a fresh run's token
    assert gap < MAX_GAP, f"the event loop stalled for {gap:.2f}s while the plugin ran"


async def test_creating_a_client_does_not_stall_the_loop(tmp_path: Path) -> None:
    slow_plugin(tmp_path, sleep=PLUGIN_SECONDS, expires_in=3600)
    path = kubeconfig(
        tmp_path / "config", cluster={"server": "http://h:1"}, user=exec_user("./plugin")
    )
    client, gap = await with_heartbeat(KubeClient.create(str(path)))
    await client.close()
    assert len(runs(tmp_path)) == 1  # still run once at start: a broken plugin fails early
    assert gap < MAX_GAP, f"the event loop stalled for {gap:.2f}s while the plugin ran"


async def test_concurrent_requests_share_one_plugin_run(tmp_path: Path) -> None:
    slow_plugin(tmp_path, sleep=0.5, expires_in=5)  # every use needs a renewal
    async with serve() as server:
        whoami_route(server)
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user=exec_user("./plugin")
        )
        async with await KubeClient.create(str(path)) as client:
            answers = await asyncio.gather(*(client.request("GET", "/whoami") for _ in range(5)))
    assert [a.json()["auth"] for a in answers] == ["Bearer t2"] * 5
    assert len(runs(tmp_path)) == 2  # the start-up run and one renewal for all five


async def test_a_cancelled_request_does_not_waste_the_run(tmp_path: Path) -> None:
    slow_plugin(tmp_path, sleep=0.5, expires_in=None)
    async with serve() as server:
        whoami_route(server)
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user=exec_user("./plugin")
        )
        async with await KubeClient.create(str(path)) as client:
            assert client.connection.token is not None
            client.connection.token.invalidate()  # as after a 401
            first = asyncio.create_task(client.request("GET", "/whoami"))
            await asyncio.sleep(0.2)  # the renewal is running
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            answer = await client.request("GET", "/whoami")
    assert answer.json() == {"auth": "Bearer t2"}
    assert len(runs(tmp_path)) == 2  # the cancelled request's run served the next one


async def test_a_hanging_plugin_is_killed_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_plugin(tmp_path, sleep=0.1, expires_in=5)
    async with serve() as server:
        whoami_route(server)
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user=exec_user("./plugin")
        )
        async with await KubeClient.create(str(path)) as client:
            slow_plugin(tmp_path, sleep=60, expires_in=5)  # the renewal hangs
            monkeypatch.setattr(execcredential, "PLUGIN_TIMEOUT_SECONDS", 1.0)
            with pytest.raises(KubeConfigError) as err:
                await with_heartbeat(client.request("GET", "/whoami"))
    assert "user 'u'" in str(err.value) and "did not answer in 1s" in str(err.value)
    pid = int((tmp_path / "plugin.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left behind
