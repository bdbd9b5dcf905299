"""The API client: kubeconfig and in-cluster credentials, TLS, requests, watches, metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from dra_driver import kube
from dra_driver.kube import KEEPALIVE, REQUEST_POOL, KubeClient
from dra_driver.kubeconfig import (
    Connection,
    KubeConfig,
    KubeConfigError,
    TokenSource,
    _ssl_context,
    in_cluster_connection,
    load_connection,
)
from tests.unit.kubeserver import Certs, FakeApiServer, make_certs, plain_client, serve


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def server_tls(certs: Certs, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        context.load_verify_locations(certs.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def kubeconfig(
    path: Path,
    *,
    cluster: dict[str, Any],
    user: dict[str, Any],
    current: str | None = "ctx",
    extra_contexts: list[dict[str, Any]] | None = None,
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]
        + (extra_contexts or []),
    }
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


# ------------------------------------------------------------------------------ kubeconfig


def test_token_user(tmp_path: Path, certs: Certs) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://127.0.0.1:6443/", "certificate-authority": str(certs.ca)},
        user={"token": "abc"},
    )
    conn = load_connection(str(path))
    assert conn.server == "https://127.0.0.1:6443"
    assert conn.token is not None and conn.token.token() == "abc"
    assert conn.ssl_context is not None
    assert conn.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_token_file_is_relative_to_the_kubeconfig(tmp_path: Path, certs: Certs) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://h", "certificate-authority-data": certs.b64(certs.ca)},
        user={"tokenFile": "tok"},
    )
    conn = KubeConfig.load([path]).connection()
    assert conn.token is not None and conn.token.token() == "from-file"


def test_token_file_wins_over_a_token_as_in_client_go(tmp_path: Path) -> None:
    """With both ``token`` and ``tokenFile`` client-go sends what the file holds (re-read as
    it rotates) and falls back on the token only while the file cannot be read."""
    (tmp_path / "tok").write_text("rotated\n")
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "http://h"},
        user={"token": "snapshot", "tokenFile": "tok"},
    )
    conn = KubeConfig.load([path]).connection()
    assert conn.token is not None and conn.token.token() == "rotated"
    (tmp_path / "tok").unlink()
    conn = KubeConfig.load([path]).connection()  # no file (yet): not an error
    assert conn.token is not None and conn.token.token() == "snapshot"


def test_client_certificate_data(tmp_path: Path, certs: Certs) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://h", "certificate-authority-data": certs.b64(certs.ca)},
        user={
            "client-certificate-data": certs.b64(certs.client_cert),
            "client-key-data": certs.b64(certs.client_key),
        },
    )
    conn = load_connection(str(path))
    assert conn.token is None
    assert conn.ssl_context is not None
    # The key went through a temporary file that is gone again.
    assert not list(Path(tempfile.gettempdir()).glob("dra-kube-*/client.key"))


def test_mismatched_client_key_is_a_config_error(tmp_path: Path, certs: Certs) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://h"},
        user={
            "client-certificate-data": certs.b64(certs.client_cert),
            "client-key-data": certs.b64(certs.server_key),
        },
    )
    with pytest.raises(KubeConfigError, match=r"^cannot load API server credentials from .*ctx"):
        load_connection(str(path))


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://h", "insecure-skip-tls-verify": True},
        user={},
    )
    conn = load_connection(str(path))
    assert conn.ssl_context is not None
    assert conn.ssl_context.verify_mode == ssl.CERT_NONE
    assert not conn.ssl_context.check_hostname


def test_given_context_and_missing_context(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "http://h:8080"},
        user={"username": "admin", "password": "pw"},
        current=None,
        extra_contexts=[{"name": "other", "context": {"cluster": "c", "user": "u"}}],
    )
    config = KubeConfig.load([path])
    with pytest.raises(KubeConfigError, match="no current-context"):
        config.connection()
    with pytest.raises(KubeConfigError, match="context 'nope' not found"):
        config.connection("nope")
    conn = config.connection("other")
    assert conn.basic_auth == ("admin", "pw")
    assert conn.ssl_context is None


def test_auth_provider_is_rejected_by_name(tmp_path: Path) -> None:
    """(exec plugins are supported: tests/unit/test_execcredential.py.)"""
    user = {"auth-provider": {"name": "oidc"}}
    path = kubeconfig(tmp_path / "config", cluster={"server": "https://h"}, user=user)
    with pytest.raises(KubeConfigError) as err:
        load_connection(str(path))
    message = str(err.value)
    assert "user 'u': auth-provider is not supported; use the provider's exec" in message
    assert "\n" not in message
    assert message.startswith(f"cannot load API server credentials from {path}")


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"reading .*/absent: No such file"):
        load_connection(str(tmp_path / "absent"))
    (tmp_path / "bad").write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="not valid YAML") as err:
        load_connection(str(tmp_path / "bad"))
    assert "\n" not in str(err.value)


def test_kubeconfig_env_list_merges_first_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(tmp_path / "a", cluster={"server": "http://first"}, user={"token": "1"})
    second = kubeconfig(
        tmp_path / "b", cluster={"server": "http://second"}, user={"token": "2"}, current="x"
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    conn = load_connection()
    assert conn.server == "http://first"
    assert conn.token is not None and conn.token.token() == "1"


def test_order_explicit_then_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = kubeconfig(tmp_path / "a", cluster={"server": "http://explicit"}, user={})
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert load_connection(str(explicit)).server == "http://explicit"
    # In a pod without a readable service account the message names the in-cluster source.
    monkeypatch.setattr("dra_driver.kubeconfig.SERVICE_ACCOUNT_DIR", tmp_path / "nothing")
    with pytest.raises(KubeConfigError, match="from the in-cluster service account"):
        load_connection()


def test_in_cluster(tmp_path: Path, certs: Certs) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(certs.ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    conn = in_cluster_connection(tmp_path, env)
    assert conn.server == "https://[fd00::1]:6443"
    assert conn.token is not None and conn.token.token() == "sa-token"
    assert conn.namespace == ""  # no namespace file
    (tmp_path / "namespace").write_text("gpu-ops\n")
    assert in_cluster_connection(tmp_path, env).namespace == "gpu-ops"
    with pytest.raises(KubeConfigError, match="not running inside a pod"):
        in_cluster_connection(tmp_path, {})


def test_token_file_is_reread_after_the_refresh_interval(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("one")
    source = TokenSource(path=str(path), refresh=60, clock=lambda: now[0])
    path.write_text("two")
    now[0] = 59
    assert source.token() == "one"
    now[0] = 60
    assert source.token() == "two"
    path.unlink()  # mid-rotation: keep the last good token
    now[0] = 200
    assert source.token() == "two"
    path.write_text("three")
    source.invalidate()
    assert source.token() == "three"


# ------------------------------------------------------------------------------ requests


@pytest.fixture
async def tls_server(certs: Certs) -> AsyncIterator[FakeApiServer]:
    async with serve(server_tls(certs)) as server:
        yield server


async def test_request_over_tls_with_token(
    tls_server: FakeApiServer, certs: Certs, tmp_path: Path
) -> None:
    tls_server.json("GET", "/api/v1/nodes/n1", 200, {"kind": "Node", "metadata": {"name": "n1"}})
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": tls_server.url, "certificate-authority": str(certs.ca)},
        user={"token": "secret"},
    )
    calls: list[tuple[str, str]] = []
    async with await KubeClient.create(
        str(path), observer=lambda verb, code: calls.append((verb, code))
    ) as client:
        response = await client.request("get", "/api/v1/nodes/n1", query={"a": "1"})
        assert response.status == 200 and response.ok
        assert response.json()["metadata"]["name"] == "n1"
        missing = await client.request("GET", "/api/v1/nodes/n2")
        assert missing.status == 404 and missing.json()["reason"] == "NotFound"
    seen = tls_server.seen[0]
    assert seen["headers"]["Authorization"] == "Bearer secret"
    assert seen["headers"]["Accept"] == "application/json"
    assert seen["query"] == [("a", "1")]
    assert calls == [("GET", "200"), ("GET", "404")]
    assert client.closed


async def test_patch_sends_body_and_content_type(tls_server: FakeApiServer, certs: Certs) -> None:
    tls_server.json("PATCH", "/x", 200, {})
    conn = Connection(server=tls_server.url, ssl_context=_ssl_context(ca_data=certs.ca.read_text()))
    async with KubeClient(conn) as client:
        await client.request(
            "PATCH",
            "/x",
            query=[("fieldManager", "d"), ("force", "true")],
            body={"a": [1]},
            content_type="application/apply-patch+yaml",
        )
        await client.request("GET", "/x")
    patch, get = tls_server.seen
    assert patch["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert json.loads(patch["body"]) == {"a": [1]}
    assert patch["query"] == [("fieldManager", "d"), ("force", "true")]
    assert "Authorization" not in patch["headers"]
    assert "Content-Type" not in get["headers"]  # no body, no content type


async def test_client_certificate_authenticates(certs: Certs, tmp_path: Path) -> None:
    async with serve(server_tls(certs, require_client_cert=True)) as server:
        server.json("GET", "/version", 200, {"major": "1"})
        path = kubeconfig(
            tmp_path / "config",
            cluster={"server": server.url, "certificate-authority-data": certs.b64(certs.ca)},
            user={
                "client-certificate-data": certs.b64(certs.client_cert),
                "client-key-data": certs.b64(certs.client_key),
            },
        )
        async with await KubeClient.create(str(path)) as client:
            assert (await client.request("GET", "/version")).json() == {"major": "1"}
        subject = dict(x[0] for x in server.seen[0]["peercert"]["subject"])
        assert subject["commonName"] == "test-user"


async def test_untrusted_server_is_a_connection_error(
    tls_server: FakeApiServer, tmp_path: Path
) -> None:
    # No CA given: the system trust store does not know the test CA.
    path = kubeconfig(tmp_path / "config", cluster={"server": tls_server.url}, user={})
    calls: list[tuple[str, str]] = []
    async with await KubeClient.create(
        str(path), observer=lambda verb, code: calls.append((verb, code))
    ) as client:
        with pytest.raises(aiohttp.ClientError):
            await client.request("GET", "/version")
    assert calls == [("GET", "error")]
    assert tls_server.seen == []


async def test_insecure_skip_tls_verify_connects(tls_server: FakeApiServer, tmp_path: Path) -> None:
    tls_server.json("GET", "/version", 200, {})
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": tls_server.url, "insecure-skip-tls-verify": True},
        user={},
    )
    async with await KubeClient.create(str(path)) as client:
        assert (await client.request("GET", "/version")).ok


async def test_default_headers_and_token_rotation_on_401(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old")
    async with serve() as server:

        async def whoami(request: web.Request) -> web.Response:
            ok = request.headers.get("Authorization") == "Bearer new"
            return web.json_response({}, status=200 if ok else 401)

        server.routes[("GET", "/whoami")] = whoami
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user={"tokenFile": "token"}
        )
        async with await KubeClient.create(
            str(path), headers={"Impersonate-User": "nobody"}
        ) as client:
            token_file.write_text("new")
            assert (await client.request("GET", "/whoami")).status == 401
            assert (await client.request("GET", "/whoami")).status == 200
        assert server.seen[0]["headers"]["Impersonate-User"] == "nobody"


async def test_request_timeout(tmp_path: Path) -> None:
    async with serve() as server:
        # Answered only after the client gave up; released then so the server stops at once.
        answer = asyncio.Event()

        async def slow(_: web.Request) -> web.Response:
            await answer.wait()
            return web.json_response({})

        server.routes[("GET", "/slow")] = slow
        try:
            async with plain_client(server) as client, asyncio.timeout(5):
                # A client that ignored its timeout is cancelled here, which pytest.raises
                # lets through; asyncio.timeout then fails the test.
                with pytest.raises(TimeoutError):
                    await client.request("GET", "/slow", timeout=0.2)
        finally:
            answer.set()


async def test_stream_yields_lines_of_any_length() -> None:
    big = {"type": "ADDED", "object": {"data": "x" * 300_000}}
    async with serve() as server:

        async def watch(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(json.dumps({"type": "BOOKMARK"}).encode() + b"\n\n")
            payload = json.dumps(big).encode() + b"\n"
            for i in range(0, len(payload), 7000):  # one event over many chunks
                await response.write(payload[i : i + 7000])
            await response.write(b'{"type": "DELETED"}')  # last line without a newline
            await response.write_eof()
            return response

        server.routes[("GET", "/watch")] = watch
        async with (
            plain_client(server, token="t") as client,
            client.stream("GET", "/watch", query=[("watch", "true")], read_timeout=5) as response,
        ):
            assert response.ok
            lines = [json.loads(line) async for line in response.lines()]
    assert [e["type"] for e in lines] == ["BOOKMARK", "ADDED", "DELETED"]
    assert lines[1] == big
    assert server.seen[0]["headers"]["Authorization"] == "Bearer t"


async def test_stream_error_body_is_readable() -> None:
    async with (
        serve() as server,
        plain_client(server) as client,
        client.stream("GET", "/nothing") as response,
    ):
        assert response.status == 404
        assert json.loads(await response.read())["reason"] == "NotFound"


async def test_concurrent_requests_share_a_bounded_pool_beside_a_stream() -> None:
    """A burst of concurrent reads uses at most REQUEST_POOL connections, the same ones again
    in the next burst, and an open watch neither takes one of them nor waits for them."""
    peers: set[tuple[str, int]] = set()
    in_flight = peak = 0
    watch_open = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, peak
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return web.json_response({})

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        watch_open.set()
        await asyncio.sleep(30)
        return response

    async with serve() as server, plain_client(server) as client:
        server.routes[("GET", "/claim")] = slow
        server.routes[("GET", "/watch")] = watch
        async with client.stream("GET", "/watch"):
            await watch_open.wait()
            for _ in range(2):
                answers = await asyncio.gather(
                    *(client.request("GET", "/claim") for _ in range(32))
                )
                assert all(a.status == 200 for a in answers)
    assert peak == REQUEST_POOL
    assert len(peers) == REQUEST_POOL


# ------------------------------------------------------------------------------ the agent


@pytest.mark.parametrize(
    "prefixes",
    [
        # The generated client costs tens of MiB at import.
        ("kubernetes.aio.client", "kubernetes.client"),
        # The CEL engine (the match and explain-claim commands) costs about 7 MiB and a third
        # of a second of start-up under load.
        ("dra_driver.cel.", "lark", "celpy"),
    ],
)
def test_agent_does_not_import_what_it_does_not_use(prefixes: tuple[str, ...]) -> None:
    code = (
        "import sys, dra_driver.agent, dra_driver.cli\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({prefixes!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"the agent imports {out}"


def test_basic_auth_header() -> None:
    async def build() -> dict[str, str]:
        async with KubeClient(Connection(server="http://h", basic_auth=("a", "b"))) as client:
            return client.headers

    headers = asyncio.run(build())
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"a:b").decode()


async def test_after_a_burst_one_connection_stays_for_the_next_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst's extra connections close within twice KEEPALIVE: the agent idles on one
    connection, which the next lone read reuses (no new handshake) until WARM_KEEPALIVE."""
    monkeypatch.setattr(kube, "WARM_KEEPALIVE", 4 * KEEPALIVE)
    transports: list[asyncio.BaseTransport] = []

    async def slow(request: web.Request) -> web.Response:
        assert request.transport is not None
        transports.append(request.transport)
        await asyncio.sleep(0.02)
        return web.json_response({})

    def open_ones() -> set[asyncio.BaseTransport]:
        return {t for t in transports if not t.is_closing()}

    async with serve() as server, plain_client(server) as client:
        server.routes[("GET", "/claim")] = slow
        await asyncio.gather(*(client.request("GET", "/claim") for _ in range(16)))
        assert len(open_ones()) == REQUEST_POOL
        await asyncio.sleep(2 * KEEPALIVE + 0.3)
        (kept,) = open_ones()
        await client.request("GET", "/claim")
        assert transports[-1] is kept
        await asyncio.sleep(2 * kube.WARM_KEEPALIVE + 0.3)
        assert not open_ones()


async def test_a_read_on_a_connection_the_server_closed_is_answered() -> None:
    """The API server closes connections idle longer than its own timeout; the next read
    opens a new one instead of failing."""
    async with serve(keepalive=0.2) as server, plain_client(server) as client:
        server.json("GET", "/claim", 200, {"n": 1})
        for _ in range(3):
            assert (await client.request("GET", "/claim")).json() == {"n": 1}
            await asyncio.sleep(0.5)


async def test_the_deadline_covers_the_wait_for_a_free_connection() -> None:
    """With every pooled connection held by a slow read, a request with a short deadline
    fails at that deadline, not after its wait plus the deadline; one that gets a connection
    late has only what is left of its deadline."""
    release, never = asyncio.Event(), asyncio.Event()

    async def stuck(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    async def hung(_: web.Request) -> web.Response:
        await never.wait()
        return web.json_response({})

    async with serve() as server, plain_client(server) as client:
        server.routes[("GET", "/stuck")] = stuck
        server.routes[("GET", "/hung")] = hung
        server.json("GET", "/claim", 200, {})
        held = [asyncio.create_task(client.request("GET", "/stuck")) for _ in range(REQUEST_POOL)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.request("GET", "/claim", timeout=0.5)
        assert time.monotonic() - started < 1.0
        late = asyncio.create_task(client.request("GET", "/hung", timeout=1.0))
        await asyncio.sleep(0.7)
        release.set()  # the held reads finish; the late one gets a connection and hangs
        started = time.monotonic()
        await asyncio.gather(*held)
        with pytest.raises(TimeoutError):
            await late
        assert time.monotonic() - started < 0.6
        assert (await client.request("GET", "/claim", timeout=0.5)).ok
        never.set()  # lets the server's shutdown finish the hung handler
