"""A small async Kubernetes API client: JSON over one aiohttp session.

The agent speaks raw JSON to a handful of endpoints, so it needs connection set-up
(in-cluster service account or kubeconfig), authentication and TLS, not generated models.
The ``kubernetes`` package's client imports every model of every API group on start-up
(tens of MiB that a node agent would carry for its whole life); this module imports none.

Where the server is and which credentials to use come from :mod:`dra_driver.kubeconfig`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from dra_driver.kubeconfig import Connection, load_connection
from dra_driver.recursion import recursion_limit_at_least

#: Called after every request with the HTTP method and the status code ("error" when no
#: answer came back); the agent counts them in a Prometheus metric.
RequestObserver = Callable[[str, str], None]

Query = Sequence[tuple[str, str]] | Mapping[str, str]

#: Connections that requests share. HTTP/1.1 carries one request at a time per connection, so
#: concurrent claim reads wait for a free one here instead of each opening its own: a burst of
#: 64 prepares costs at most this many connections (and descriptors), not 64. The API server
#: answers a claim read in about a millisecond, so a few connections keep up with any burst
#: the kubelet sends.
REQUEST_POOL = 4
#: Seconds the pool's first connection is kept idle: a lone claim read after a quiet spell (the
#: next pod on a node) reuses it instead of paying a TCP and TLS handshake. Well below the API
#: server's own idle timeout (90 s); a GET the server closed under it is retried once.
WARM_KEEPALIVE = 30.0
#: Seconds the other pooled connections are kept idle. Short, so a burst's extra connections
#: close soon after it (aiohttp's cleanup pass closes them within twice this) and the agent
#: idles on one; a connection in steady use is never idle that long.
KEEPALIVE = 0.5


#: The API server's JSON decoder refuses objects nested deeper than this, so nothing it
#: serves is deeper; its 10 KiB bound on opaque parameters allows about half of it.
API_MAX_DEPTH = 10_000


def decode_json(raw: bytes | str) -> Any:
    """``raw`` decoded as JSON, however deep the API server let a user nest it.

    Python's decoder stops near a thousand levels; one claim nested deeper (opaque
    parameters allow thousands) must not make a listing or a watch of every claim
    unreadable. Only such a body pays for the raised recursion limit.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        with recursion_limit_at_least(API_MAX_DEPTH + 2 * sys.getrecursionlimit()):
            return json.loads(raw)


@dataclass(frozen=True)
class Response:
    """A complete answer from the API server."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    reason: str = ""

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body decoded as JSON (as deep as the API server may nest it)."""
        return decode_json(self.body)


class StreamResponse:
    """An answer whose body is read incrementally (watches)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.reason = response.reason or ""
        self.headers: Mapping[str, str] = response.headers

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    async def read(self) -> bytes:
        """The rest of the body at once (for error answers)."""
        return await self._response.read()

    async def lines(self) -> AsyncIterator[bytes]:
        """Non-empty lines of the body as they arrive; a final line needs no newline.

        Split by hand rather than with the stream's ``readline``, whose 128 KiB limit one
        watch event (a slice of many richly described devices) can exceed.
        """
        buffer = b""
        async for chunk in self._response.content.iter_any():
            buffer += chunk
            if b"\n" not in chunk:
                continue
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line
        if buffer.strip():
            yield buffer


def _encode(body: Any) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    # JSON is also valid YAML, so apply patches (application/apply-patch+yaml) go as JSON.
    return json.dumps(body, separators=(",", ":")).encode()


#: The content type of a server-side apply patch.
APPLY_PATCH = "application/apply-patch+yaml"


async def server_side_apply(
    client: Any,
    path: str,
    body: Any,
    *,
    field_manager: str,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> Response:
    """Apply ``body`` at ``path`` as ``field_manager``, taking over conflicting fields (the
    driver owns what it writes there). ``client`` is a :class:`KubeClient` or anything with
    its ``request``."""
    response: Response = await client.request(
        "PATCH",
        path,
        query=[("fieldManager", field_manager), ("force", "true")],
        body=body,
        content_type=APPLY_PATCH,
        timeout=timeout,
    )
    return response


class KubeClient:
    """Async client for one API server; create with :meth:`create`, close with :meth:`close`."""

    def __init__(
        self,
        connection: Connection,
        *,
        observer: RequestObserver | None = None,
        user_agent: str = "dra-driver",
    ) -> None:
        """Needs a running event loop (the session binds to it)."""
        self.connection = connection
        self.observer = observer
        self.server = connection.server
        headers = {"Accept": "application/json", "User-Agent": user_agent}
        headers.update(connection.headers)
        if connection.basic_auth is not None:
            raw = ":".join(connection.basic_auth).encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        self.headers = headers
        self._token = connection.token
        # The pool is one long-kept connection and REQUEST_POOL - 1 short-kept ones; a request
        # takes the long-kept one when it is free. The slots bound both together, so a request
        # that finds the long-kept one busy always finds a short-kept one free.
        self._slots = asyncio.Semaphore(REQUEST_POOL)
        self._warm = self._new_session(1, WARM_KEEPALIVE)
        self._warm_busy = False
        self._session = self._new_session(REQUEST_POOL - 1, KEEPALIVE)
        # Streams (watches) hold their connection for as long as they run; out of the
        # request pool, so a watch never waits for a claim read nor the other way round.
        self._streams = self._new_session(0, KEEPALIVE)
        #: Request pools replaced when an exec plugin renewed the client certificate (their
        #: kept-alive connections present the old one); closed at the next renewal or close.
        self._retired: list[aiohttp.ClientSession] = []

    def _new_session(self, limit: int, keepalive: float) -> aiohttp.ClientSession:
        """A session of at most ``limit`` connections (0: one per open stream)."""
        # Without a context (an http:// server) TLS is never negotiated; True just keeps
        # aiohttp's verifying default should a redirect lead to https.
        connector = aiohttp.TCPConnector(
            ssl=self.connection.ssl_context if self.connection.ssl_context is not None else True,
            limit=limit,
            keepalive_timeout=keepalive,
        )
        # trust_env=False: always connect directly. Proxy variables in the environment are not
        # applied, and a kubeconfig proxy-url is refused rather than silently ignored.
        return aiohttp.ClientSession(connector=connector, trust_env=False)

    @classmethod
    async def create(
        cls,
        kubeconfig: str = "",
        *,
        context: str = "",
        observer: RequestObserver | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> KubeClient:
        """Connect as the kubeconfig, in-cluster account or default kubeconfig says.

        ``headers`` are sent with every request (e.g. ``Impersonate-User``).
        """
        # In a thread: reading the files is quick, but an exec credential plugin runs once
        # here and may take seconds (a cloud login), which the event loop must not wait out.
        connection = await asyncio.to_thread(load_connection, kubeconfig, context)
        connection.headers.update(headers or {})
        return cls(connection, observer=observer)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections (idempotent)."""
        for session in (self._warm, self._session, self._streams, *self._retired):
            await session.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._warm.closed

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = dict(self.headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {await self._token.token_async()}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _observe(self, method: str, code: str) -> None:
        if self.observer is not None:
            self.observer(method, code)

    def _answered(self, method: str, status: int) -> None:
        self._observe(method, str(status))
        if status == 401 and self._token is not None:
            self._token.invalidate()  # a rotated token file may already hold a fresh one
        if status == 401 and self.connection.certificate is not None:
            self.connection.certificate.invalidate()

    async def _renew_pools(self) -> None:
        """Requests go to new connections, which present the renewed client certificate; the
        old pools' requests finish undisturbed (a credential lifetime before they are closed).
        Watches keep their connections, authenticated when they began."""
        retired, self._retired = self._retired, [self._warm, self._session]
        self._warm = self._new_session(1, WARM_KEEPALIVE)
        self._session = self._new_session(REQUEST_POOL - 1, KEEPALIVE)
        for session in retired:
            await session.close()

    async def _kwargs(
        self, query: Query | None, body: Any, content_type: str, limits: aiohttp.ClientTimeout
    ) -> dict[str, Any]:
        """The request's arguments; awaits the token (an exec plugin may have to run)."""
        certificate, context = self.connection.certificate, self.connection.ssl_context
        if certificate is not None and context is not None and await certificate.refresh(context):
            await self._renew_pools()
        data = _encode(body)
        kwargs: dict[str, Any] = {
            "headers": await self._headers(content_type if data is not None else None),
            "params": list(query.items()) if isinstance(query, Mapping) else list(query or ()),
            "data": data,
            "timeout": limits,
        }
        if self.connection.tls_server_name:
            kwargs["server_hostname"] = self.connection.tls_server_name
        return kwargs

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        # aiohttp enforces it per request, the way every caller here wants a deadline.
        timeout: float = 30.0,  # noqa: ASYNC109
        accept: str | None = None,
    ) -> Response:
        """Send one request and read the whole answer; any status is returned, not raised.

        ``body`` is bytes, text or a JSON-serializable object; ``accept`` asks for another
        media type than JSON. Connection failures and timeouts raise
        (``aiohttp.ClientError``, ``TimeoutError``, ``OSError``).
        """
        method = method.upper()
        kwargs = await self._kwargs(query, body, content_type, aiohttp.ClientTimeout(total=timeout))
        if accept is not None:
            kwargs["headers"]["Accept"] = accept
        if self._slots.locked():
            # The deadline covers the wait for a free connection, as it did aiohttp's own pool
            # wait: a lease renewal queued behind a burst of slow reads still fails in time.
            # (wait_for keeps a slot granted at the deadline; a free one needs no task.)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            except Exception:
                self._observe(method, "error")
                raise
            kwargs["timeout"] = aiohttp.ClientTimeout(total=max(deadline - loop.time(), 1e-3))
        else:
            await self._slots.acquire()
        warm = not self._warm_busy
        self._warm_busy |= warm
        session = self._warm if warm else self._session
        try:
            async with session.request(method, self.server + path, **kwargs) as resp:
                data = await resp.read()
                answer = Response(resp.status, resp.headers, data, resp.reason or "")
        except Exception:  # cancellation is not a failed request: not counted
            self._observe(method, "error")
            raise
        finally:
            if warm:
                self._warm_busy = False
            self._slots.release()
        self._answered(method, answer.status)
        return answer

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
    ) -> AsyncIterator[StreamResponse]:
        """Send one request and hand over the answer unread (``async with``).

        There is no total deadline; ``read_timeout`` bounds the silence between chunks, which
        is how a dead watch connection is noticed.
        """
        method = method.upper()
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        kwargs = await self._kwargs(query, body, content_type, timeout)
        try:
            resp = await self._streams.request(method, self.server + path, **kwargs)
        except Exception:  # cancellation is not a failed request: not counted
            self._observe(method, "error")
            raise
        self._answered(method, resp.status)
        try:
            yield StreamResponse(resp)
        finally:
            resp.release()
