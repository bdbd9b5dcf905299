"""A stand-in API server (aiohttp) and throwaway TLS certificates for client tests."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from dra_driver.kube import KubeClient, RequestObserver
from dra_driver.kubeconfig import Connection, TokenSource

Handler = Callable[[web.Request], Any]


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    def b64(self, path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(directory: Path) -> Certs:
    """Generate the certificates with the openssl command (skips the test without it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory,
    )  # fmt: skip
    for name, subject, ext in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "/CN=test-user/O=system:masters", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(
            "req", "-new", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", subject, cwd=directory,
        )  # fmt: skip
        (directory / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
            "-extfile", f"{name}.ext", cwd=directory,
        )  # fmt: skip
    return Certs(directory)


@dataclass
class FakeApiServer:
    """Routes ``(method, path)`` to handlers; records every request it saw."""

    url: str = ""
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)
    #: Answers every request no route matches (None: 404), e.g. a whole in-memory API.
    fallback: Handler | None = None
    #: Whether requests are recorded in :attr:`seen` (a long churn run would hoard them).
    record: bool = True

    def json(self, method: str, path: str, status: int, body: Any, **headers: str) -> None:
        """Answer ``method path`` with a JSON body."""

        async def handler(_: web.Request) -> web.Response:
            return web.json_response(body, status=status, headers=headers)

        self.routes[(method, path)] = handler

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        handler = self.routes.get((request.method, request.path)) or self.fallback
        if not self.record and handler is not None:
            result: web.StreamResponse = await handler(request)
            return result
        body = await request.read()
        transport = request.transport
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": list(request.query.items()),
                "headers": dict(request.headers),
                "body": body,
                "peercert": transport.get_extra_info("peercert") if transport else None,
            }
        )
        if handler is None:
            return web.json_response(
                {"kind": "Status", "reason": "NotFound", "message": f"{request.path} not found"},
                status=404,
            )
        result = await handler(request)
        return result


@asynccontextmanager
async def serve(
    ssl_context: ssl.SSLContext | None = None, keepalive: float = 75.0
) -> AsyncIterator[FakeApiServer]:
    """Run a :class:`FakeApiServer` on a free loopback port (HTTPS with ``ssl_context``);
    it closes a connection idle for ``keepalive`` seconds."""
    server = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server._dispatch)
    runner = web.AppRunner(app, keepalive_timeout=keepalive)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def plain_client(
    server: FakeApiServer, token: str = "", observer: RequestObserver | None = None
) -> KubeClient:
    """A client for a plain-HTTP stand-in server."""
    return KubeClient(
        Connection(server=server.url, token=TokenSource(token) if token else None),
        observer=observer,
    )
