"""A small async Kubernetes API client: JSON over one aiohttp session.

The agent speaks raw JSON to a handful of endpoints, so it needs connection set-up
(in-cluster service account or kubeconfig), authentication and TLS, not generated models.
The ``kubernetes`` package's client imports every model of every API group on start-up
(tens of MiB that a node agent would carry for its whole life); this module imports none.

Credentials, in order: an explicit kubeconfig, the in-cluster service account (inside a pod),
then ``$KUBECONFIG`` or ``~/.kube/config``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from dra_driver.errors import DriverError

#: Where a pod's service account credentials are mounted.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Bound service account tokens rotate (the kubelet rewrites the file well before expiry), so
#: a token read from a file is read again after this many seconds.
TOKEN_REFRESH_SECONDS = 60.0

#: Called after every request with the HTTP method and the status code ("error" when no
#: answer came back); the agent counts them in a Prometheus metric.
RequestObserver = Callable[[str, str], None]

Query = Sequence[tuple[str, str]] | Mapping[str, str]


class KubeConfigError(DriverError):
    """No way to reach the API server was found; the message says which were tried."""


# ------------------------------------------------------------------------------ credentials


class TokenSource:
    """A bearer token, static or read from a file that is re-read periodically."""

    def __init__(
        self,
        token: str = "",
        path: str = "",
        refresh: float = TOKEN_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token = token
        self._path = path
        self._refresh = refresh
        self._clock = clock
        self._read_at: float | None = None
        if path:
            self._reload()  # fail early (at start-up) when the file is unreadable

    def _reload(self) -> None:
        self._token = Path(self._path).read_text().strip()
        self._read_at = self._clock()

    def token(self) -> str:
        """The current token; a file is re-read when the last read is too old."""
        if self._path and (self._read_at is None or self._clock() - self._read_at >= self._refresh):
            # A rotated file that is briefly unreadable must not break requests: keep the
            # old token until the next attempt.
            with contextlib.suppress(OSError):
                self._reload()
        return self._token

    def invalidate(self) -> None:
        """The server rejected the token: read the file again before the next request."""
        self._read_at = None


@dataclass
class Connection:
    """Everything needed to reach and authenticate to one API server."""

    server: str
    ssl_context: ssl.SSLContext | None = None
    token: TokenSource | None = None
    basic_auth: tuple[str, str] | None = None
    #: The name to verify the server certificate against, when not the host of ``server``.
    tls_server_name: str = ""
    #: Where the settings came from, for messages.
    source: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def _ssl_context(
    *,
    ca_file: str = "",
    ca_data: str = "",
    insecure: bool = False,
    cert_file: str = "",
    key_file: str = "",
    cert_data: bytes = b"",
    key_data: bytes = b"",
) -> ssl.SSLContext:
    """A client TLS context: the given CA (else the system's), optionally a client cert."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_file or ca_data:
        context = ssl.create_default_context(cafile=ca_file or None, cadata=ca_data or None)
    else:
        context = ssl.create_default_context()
    if cert_data or key_data:
        _load_cert_chain_from_memory(context, cert_data, key_data)
    elif cert_file or key_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def _load_cert_chain_from_memory(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``load_cert_chain`` only reads files: write the PEMs to a private directory briefly."""
    with tempfile.TemporaryDirectory(prefix="dra-kube-") as tmp:  # mode 0700
        cert_path = Path(tmp, "client.crt")
        key_path = Path(tmp, "client.key")
        for path, data in ((cert_path, cert), (key_path, key or cert)):
            # Created 0600 before any byte of the key is written.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(str(cert_path), str(key_path))


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=False)
    except ValueError as exc:
        raise KubeConfigError(f"{what} is not valid base64: {exc}") from None


def in_cluster_connection(
    sa_dir: Path = SERVICE_ACCOUNT_DIR, environ: Mapping[str, str] | None = None
) -> Connection:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``, token and CA."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST is not set: not running inside a pod")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    token_path = sa_dir / "token"
    ca_path = sa_dir / "ca.crt"
    try:
        token = TokenSource(path=str(token_path))
        context = _ssl_context(ca_file=str(ca_path))
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"reading the service account in {sa_dir}: {exc}") from None
    return Connection(
        server=f"https://{host}:{port}",
        ssl_context=context,
        token=token,
        source="in-cluster service account",
    )


# ------------------------------------------------------------------------------ kubeconfig


def _named(doc: Mapping[str, Any], section: str, key: str) -> dict[str, dict[str, Any]]:
    """``clusters``/``users``/``contexts`` of a kubeconfig as name -> entry."""
    out: dict[str, dict[str, Any]] = {}
    for item in doc.get(section) or []:
        if isinstance(item, dict) and isinstance(item.get(key), dict):
            out.setdefault(str(item.get("name", "")), item[key])
    return out


@dataclass
class KubeConfig:
    """The parts of one or more merged kubeconfig files that a client needs."""

    current_context: str = ""
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Which file each named entry came from: relative paths are relative to that file.
    origin: dict[tuple[str, str], Path] = field(default_factory=dict)

    @classmethod
    def load(cls, paths: Sequence[str | Path]) -> KubeConfig:
        """Merge files the way kubectl does: the first file to define a name or value wins."""
        merged = cls()
        for path in paths:
            path = Path(path).expanduser()
            try:
                doc = yaml.safe_load(path.read_text()) or {}
            except OSError as exc:
                raise KubeConfigError(f"reading {path}: {exc.strerror or exc}") from None
            except yaml.YAMLError as exc:
                raise KubeConfigError(f"{path} is not valid YAML: {exc}".splitlines()[0]) from None
            if not isinstance(doc, dict):
                raise KubeConfigError(f"{path} is not a kubeconfig (not a mapping)")
            merged.current_context = merged.current_context or str(doc.get("current-context") or "")
            for section, key, target in (
                ("contexts", "context", merged.contexts),
                ("clusters", "cluster", merged.clusters),
                ("users", "user", merged.users),
            ):
                for name, entry in _named(doc, section, key).items():
                    if name not in target:
                        target[name] = entry
                        merged.origin[(section, name)] = path.parent
        return merged

    def connection(self, context: str = "") -> Connection:
        """Resolve ``context`` (default: the current one) into a :class:`Connection`."""
        name = context or self.current_context
        if not name:
            raise KubeConfigError("no context given and no current-context set")
        ctx = self.contexts.get(name)
        if ctx is None:
            raise KubeConfigError(f"context {name!r} not found")
        cluster_name = str(ctx.get("cluster") or "")
        cluster = self.clusters.get(cluster_name)
        if cluster is None:
            raise KubeConfigError(f"cluster {cluster_name!r} of context {name!r} not found")
        user_name = str(ctx.get("user") or "")
        user = self.users.get(user_name, {}) if user_name else {}
        if user_name and user_name not in self.users:
            raise KubeConfigError(f"user {user_name!r} of context {name!r} not found")

        server = str(cluster.get("server") or "").rstrip("/")
        if not server:
            raise KubeConfigError(f"cluster {cluster_name!r} has no server")
        if cluster.get("proxy-url"):
            raise KubeConfigError(f"cluster {cluster_name!r}: proxy-url is not supported")
        for unsupported in ("exec", "auth-provider"):
            if user.get(unsupported):
                raise KubeConfigError(
                    f"user {user_name!r}: {unsupported} credential plugins are not supported; "
                    "use token, tokenFile or a client certificate"
                )

        cluster_dir = self.origin.get(("clusters", cluster_name), Path.cwd())
        user_dir = self.origin.get(("users", user_name), Path.cwd())

        def rel(base: Path, value: Any) -> str:
            return str(base / Path(str(value)).expanduser()) if value else ""

        try:
            context_obj: ssl.SSLContext | None = None
            if urlsplit(server).scheme == "https":
                context_obj = _ssl_context(
                    ca_file=rel(cluster_dir, cluster.get("certificate-authority")),
                    ca_data=_b64(
                        str(cluster.get("certificate-authority-data") or ""),
                        f"cluster {cluster_name!r}: certificate-authority-data",
                    ).decode("ascii", "replace"),
                    insecure=bool(cluster.get("insecure-skip-tls-verify")),
                    cert_file=rel(user_dir, user.get("client-certificate")),
                    key_file=rel(user_dir, user.get("client-key")),
                    cert_data=_b64(
                        str(user.get("client-certificate-data") or ""),
                        f"user {user_name!r}: client-certificate-data",
                    ),
                    key_data=_b64(
                        str(user.get("client-key-data") or ""),
                        f"user {user_name!r}: client-key-data",
                    ),
                )
            token: TokenSource | None = None
            if user.get("token"):
                token = TokenSource(token=str(user["token"]))
            elif user.get("tokenFile"):
                token = TokenSource(path=rel(user_dir, user["tokenFile"]))
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(f"context {name!r}: {exc}") from None
        basic = None
        if user.get("username") and not token:
            basic = (str(user["username"]), str(user.get("password") or ""))
        return Connection(
            server=server,
            ssl_context=context_obj,
            token=token,
            basic_auth=basic,
            tls_server_name=str(cluster.get("tls-server-name") or ""),
            source=f"context {name!r}",
        )


def kubeconfig_paths(environ: Mapping[str, str] | None = None) -> list[str]:
    """``$KUBECONFIG`` (a list like ``PATH``) or ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [str(Path("~/.kube/config").expanduser())]


def load_connection(kubeconfig: str = "", context: str = "") -> Connection:
    """Find credentials: explicit kubeconfig, in-cluster, then ``$KUBECONFIG``/default."""
    if kubeconfig:
        paths, where = [kubeconfig], kubeconfig
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return in_cluster_connection()
        except KubeConfigError as exc:
            raise KubeConfigError(
                f"cannot load API server credentials from the in-cluster service account: "
                f"{exc}; set --kubeconfig (DRA_KUBECONFIG)"
            ) from None
    else:
        paths = kubeconfig_paths()
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        return KubeConfig.load(paths).connection(context)
    except KubeConfigError as exc:
        raise KubeConfigError(
            f"cannot load API server credentials from {where}: {exc}; "
            "set --kubeconfig (DRA_KUBECONFIG) or run inside a pod"
        ) from None


# ------------------------------------------------------------------------------ client


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
        """The body decoded as JSON."""
        return json.loads(self.body)


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
        # Without a context (an http:// server) TLS is never negotiated; True just keeps
        # aiohttp's verifying default should a redirect lead to https.
        connector = aiohttp.TCPConnector(
            ssl=connection.ssl_context if connection.ssl_context is not None else True
        )
        # trust_env=False: always connect directly. Proxy variables in the environment are not
        # applied, and a kubeconfig proxy-url is refused rather than silently ignored.
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)

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
        connection = load_connection(kubeconfig, context)
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
        await self._session.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._session.closed

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = dict(self.headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.token()}"
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

    def _kwargs(
        self, query: Query | None, body: Any, content_type: str, timeout: aiohttp.ClientTimeout
    ) -> dict[str, Any]:
        data = _encode(body)
        kwargs: dict[str, Any] = {
            "headers": self._headers(content_type if data is not None else None),
            "params": list(query.items()) if isinstance(query, Mapping) else list(query or ()),
            "data": data,
            "timeout": timeout,
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
    ) -> Response:
        """Send one request and read the whole answer; any status is returned, not raised.

        ``body`` is bytes, text or a JSON-serializable object. Connection failures and
        timeouts raise (``aiohttp.ClientError``, ``TimeoutError``, ``OSError``).
        """
        method = method.upper()
        kwargs = self._kwargs(query, body, content_type, aiohttp.ClientTimeout(total=timeout))
        try:
            async with self._session.request(method, self.server + path, **kwargs) as resp:
                data = await resp.read()
                answer = Response(resp.status, resp.headers, data, resp.reason or "")
        except Exception:  # cancellation is not a failed request: not counted
            self._observe(method, "error")
            raise
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
        kwargs = self._kwargs(query, body, content_type, timeout)
        try:
            resp = await self._session.request(method, self.server + path, **kwargs)
        except Exception:  # cancellation is not a failed request: not counted
            self._observe(method, "error")
            raise
        self._answered(method, resp.status)
        try:
            yield StreamResponse(resp)
        finally:
            resp.release()
