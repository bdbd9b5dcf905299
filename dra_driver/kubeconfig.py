"""Where the API server is and how to authenticate to it: kubeconfig or service account.

Credentials, in order: an explicit kubeconfig, the in-cluster service account (inside a pod),
then ``$KUBECONFIG`` or ``~/.kube/config``. The result is a :class:`Connection`, which
:class:`~dra_driver.kube.KubeClient` turns into requests.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dra_driver.errors import StartError
from dra_driver.execcredential import ExecPluginError, ExecRunner, parse_exec_config

#: Where a pod's service account credentials are mounted.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Bound service account tokens rotate (the kubelet rewrites the file well before expiry), so
#: a token read from a file is read again after this many seconds.
TOKEN_REFRESH_SECONDS = 60.0


class KubeConfigError(StartError):
    """No way to reach the API server was found; the message says which were tried."""


class CredentialError(KubeConfigError, ConnectionError):
    """A request needed a fresh credential and the exec plugin failed to give one. Like a
    lost connection, the request failed and a later one may succeed (the plugin's cloud
    login was briefly away): callers that retry on connection errors retry on this too."""


class TokenSource:
    """A bearer token, static or read from a file that is re-read periodically (with both,
    the file's, and the static one while the file cannot be read)."""

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
        if path and token:
            # The token is the fallback while the file cannot be read (as in client-go).
            with contextlib.suppress(OSError):
                self._reload()
        elif path:
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

    async def token_async(self) -> str:
        """:meth:`token` for the event loop (reading a small file does not stall it)."""
        return self.token()

    def invalidate(self) -> None:
        """The server rejected the token: read the file again before the next request."""
        self._read_at = None


class ExecTokenSource(TokenSource):
    """A bearer token from a kubeconfig ``exec`` plugin, renewed when it expires."""

    def __init__(self, runner: ExecRunner) -> None:
        super().__init__()
        self._runner = runner

    def token(self) -> str:
        """The plugin's token, running the plugin again when the cached one expired.

        Blocks while the plugin runs: the client uses :meth:`token_async`.
        """
        try:
            return self._runner.credential().token
        except ExecPluginError as exc:
            raise CredentialError(str(exc)) from None

    async def token_async(self) -> str:
        """The plugin's token; a renewal runs while the event loop goes on, and concurrent
        requests wait for the same run."""
        try:
            return (await self._runner.credential_async()).token
        except ExecPluginError as exc:
            raise CredentialError(str(exc)) from None

    def invalidate(self) -> None:
        """The server rejected the token: ask the plugin for a new one."""
        self._runner.invalidate()


class ExecCertificate:
    """A client certificate from a kubeconfig ``exec`` plugin, renewed when it expires (or
    the server refuses it): the TLS context then presents the new one on new connections."""

    def __init__(self, runner: ExecRunner, cert: bytes, key: bytes) -> None:
        """``cert`` and ``key`` are what the context was made with."""
        self._runner = runner
        self._pem = (cert, key)

    async def refresh(self, context: ssl.SSLContext) -> bool:
        """Load a renewed certificate into ``context`` (the plugin runs when it expired);
        whether one was loaded (connections made before present the old one)."""
        try:
            credential = await self._runner.credential_async()
        except ExecPluginError as exc:
            raise CredentialError(str(exc)) from None
        pem = (credential.client_certificate, credential.client_key)
        if pem == self._pem or not credential.client_certificate:
            return False
        _load_cert_chain_from_memory(context, *pem)
        self._pem = pem
        return True

    def invalidate(self) -> None:
        """The server rejected the credential: ask the plugin for a new one."""
        self._runner.invalidate()


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
    #: The default namespace: the context's, or the service account's (empty: none given).
    namespace: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: The exec plugin's client certificate in ``ssl_context``, renewed as it expires.
    certificate: ExecCertificate | None = None


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


def _read_namespace(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


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
        namespace=_read_namespace(sa_dir / "namespace"),
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
        import yaml  # only here: in a pod the agent reads no file (in-cluster config)

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
        if user.get("auth-provider"):
            # Removed from kubectl too (1.26): the providers moved to exec plugins.
            raise KubeConfigError(
                f"user {user_name!r}: auth-provider is not supported; use the provider's exec "
                "credential plugin (e.g. gke-gcloud-auth-plugin, kubelogin)"
            )

        cluster_dir = self.origin.get(("clusters", cluster_name), Path.cwd())
        user_dir = self.origin.get(("users", user_name), Path.cwd())
        runner: ExecRunner | None = None
        exec_cert, exec_key = b"", b""
        if user.get("exec"):
            try:
                runner = ExecRunner(
                    parse_exec_config(user["exec"], user_name),
                    user=user_name,
                    base_dir=user_dir,
                    cluster=cluster,
                )
                # Run once now: a missing plugin fails at start, and a certificate it gives
                # goes into the TLS context.
                credential = runner.credential()
            except ExecPluginError as exc:
                raise KubeConfigError(str(exc)) from None
            exec_cert, exec_key = credential.client_certificate, credential.client_key

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
                    cert_data=exec_cert
                    or _b64(
                        str(user.get("client-certificate-data") or ""),
                        f"user {user_name!r}: client-certificate-data",
                    ),
                    key_data=exec_key
                    or _b64(
                        str(user.get("client-key-data") or ""),
                        f"user {user_name!r}: client-key-data",
                    ),
                )
            token: TokenSource | None = None
            if runner is not None and credential.token:
                token = ExecTokenSource(runner)
            elif user.get("tokenFile"):
                # The file wins over a token given too: it is re-read as it rotates.
                token = TokenSource(
                    token=str(user.get("token") or ""), path=rel(user_dir, user["tokenFile"])
                )
            elif user.get("token"):
                token = TokenSource(token=str(user["token"]))
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(f"context {name!r}: {exc}") from None
        basic = None
        if user.get("username") and not token:
            basic = (str(user["username"]), str(user.get("password") or ""))
        certificate = None
        if runner is not None and exec_cert and context_obj is not None:
            certificate = ExecCertificate(runner, exec_cert, exec_key)
        return Connection(
            server=server,
            ssl_context=context_obj,
            certificate=certificate,
            token=token,
            basic_auth=basic,
            tls_server_name=str(cluster.get("tls-server-name") or ""),
            source=f"context {name!r}",
            namespace=str(ctx.get("namespace") or ""),
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
