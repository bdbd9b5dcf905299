"""Kubeconfig ``exec`` credential plugins (the EKS, GKE and AKS way of logging in).

A kubeconfig user with an ``exec`` section names a command that prints an ``ExecCredential``
(``client.authentication.k8s.io/v1`` or ``v1beta1``) holding a bearer token or a client
certificate. The command is run when a credential is needed, its answer is kept until its
``expirationTimestamp`` (or, without one, until the server rejects it with 401), then it is
run again.

Inside the agent the plugin runs as a child process the event loop waits for
(:meth:`ExecRunner.credential_async`), never in the loop: a slow login must not stop gRPC answers
and heartbeats. Concurrent requests that need a fresh credential share one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.errors import DriverError

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")

#: A credential is renewed this many seconds before it expires, so that a request never
#: leaves with a token that expires on the way.
EXPIRY_MARGIN_SECONDS = 10.0

#: How long a plugin may take (an interactive login is not supported: there is no terminal).
PLUGIN_TIMEOUT_SECONDS = 60.0


_M = TypeVar("_M", bound=BaseModel)


class ExecPluginError(DriverError):
    """The plugin could not be run or printed no usable credential; the message says why."""


class _EnvVar(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    value: str = ""


class ExecConfig(BaseModel):
    """The ``user.exec`` section of a kubeconfig."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: list[_EnvVar] | None = None
    install_hint: str = Field("", alias="installHint")
    provide_cluster_info: bool = Field(False, alias="provideClusterInfo")


class _Status(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    token: str = ""
    client_certificate_data: str = Field("", alias="clientCertificateData")
    client_key_data: str = Field("", alias="clientKeyData")
    expiration_timestamp: datetime | None = Field(None, alias="expirationTimestamp")


class _ExecCredential(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: str
    status: _Status


@dataclass(frozen=True)
class Credential:
    """What one run of the plugin gave: a token and/or a client certificate (PEM)."""

    token: str = ""
    client_certificate: bytes = b""
    client_key: bytes = b""
    #: Wall-clock expiry (seconds since the epoch); None: valid until rejected.
    expires_at: float | None = None


def _validate(model: type[_M], raw: Any, what: str) -> _M:
    """``raw`` as ``model``; the error names ``what`` and the first bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ExecPluginError(f"{what}{where}: {err['msg']}") from None


def parse_exec_config(raw: Mapping[str, Any], user: str) -> ExecConfig:
    """Validate a kubeconfig ``exec`` section; the message names the user and the field."""
    config = _validate(ExecConfig, raw, f"user {user!r}: exec.")
    if config.api_version not in API_VERSIONS:
        raise ExecPluginError(
            f"user {user!r}: exec.apiVersion {config.api_version!r} is not one of "
            + ", ".join(API_VERSIONS)
        )
    return config


def parse_exec_credential(stdout: str, api_version: str) -> Credential:
    """Parse what the plugin printed: an ExecCredential of the requested API version."""
    try:
        doc = json.loads(stdout)
    except ValueError as exc:
        raise ExecPluginError(f"the plugin's output is not JSON: {exc}") from None
    cred = _validate(_ExecCredential, doc, "the plugin's ExecCredential: ")
    if cred.kind != "ExecCredential":
        raise ExecPluginError(f"the plugin printed a {cred.kind}, not an ExecCredential")
    if cred.api_version != api_version:
        raise ExecPluginError(
            f"the plugin answered with {cred.api_version}, but {api_version} was asked for"
        )
    status = cred.status
    if bool(status.client_certificate_data) != bool(status.client_key_data):
        raise ExecPluginError(
            "the plugin gave a client certificate without its key, or the reverse"
        )
    if not status.token and not status.client_certificate_data:
        raise ExecPluginError("the plugin's ExecCredential has neither a token nor a certificate")
    expiry = status.expiration_timestamp
    return Credential(
        token=status.token,
        client_certificate=status.client_certificate_data.encode(),
        client_key=status.client_key_data.encode(),
        expires_at=expiry.timestamp() if expiry is not None else None,
    )


#: The cluster extension a kubeconfig passes to exec plugins as ``spec.cluster.config``.
EXEC_EXTENSION = "client.authentication.k8s.io/exec"


def _exec_extension(extensions: Any) -> Any:
    """The ``config`` for the plugin: a kubeconfig lists a cluster's extensions by name
    (``- name: ..., extension: ...``), and the plugin gets the one named
    :data:`EXEC_EXTENSION`, as client-go hands it over. A mapping is passed as it is."""
    if isinstance(extensions, list):
        for item in extensions:
            if isinstance(item, dict) and item.get("name") == EXEC_EXTENSION:
                return item.get("extension") or {}
        return {}
    return extensions or {}


def _exec_info(config: ExecConfig, cluster: Mapping[str, Any]) -> str:
    """The KUBERNETES_EXEC_INFO the plugin reads: API version, no terminal, maybe the cluster."""
    spec: dict[str, Any] = {"interactive": False}
    if config.provide_cluster_info:
        spec["cluster"] = {
            "server": cluster.get("server", ""),
            "tls-server-name": cluster.get("tls-server-name", ""),
            "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify")),
            "certificate-authority-data": cluster.get("certificate-authority-data", ""),
            "proxy-url": cluster.get("proxy-url", ""),
            "config": _exec_extension(cluster.get("extensions")),
        }
    return json.dumps({"apiVersion": config.api_version, "kind": "ExecCredential", "spec": spec})


class ExecRunner:
    """Runs one user's plugin and keeps its credential until it expires."""

    def __init__(
        self,
        config: ExecConfig,
        *,
        user: str,
        base_dir: Path,
        cluster: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._user = user
        self._base_dir = base_dir
        self._cluster = dict(cluster or {})
        self._environ = environ
        self._clock = clock
        self._cached: Credential | None = None
        #: The run in flight for :meth:`credential_async` (None: none yet).
        self._renewal: asyncio.Future[Credential] | None = None

    def _command(self) -> str:
        """A command with a slash is relative to the kubeconfig's directory; else from PATH."""
        command = self.config.command
        if os.sep in command:
            return str(self._base_dir / Path(command).expanduser())
        env = os.environ if self._environ is None else self._environ
        found = shutil.which(command, path=env.get("PATH"))
        if found is None:
            hint = f" ({self.config.install_hint.strip()})" if self.config.install_hint else ""
            raise ExecPluginError(
                f"user {self._user!r}: credential plugin {command!r} not found in PATH{hint}"
            )
        return found

    def _argv_env(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of one run."""
        env = dict(os.environ if self._environ is None else self._environ)
        env.update({e.name: e.value for e in self.config.env or []})
        env["KUBERNETES_EXEC_INFO"] = _exec_info(self.config, self._cluster)
        return [self._command(), *self.config.args], env

    def _not_started(self, argv: list[str], exc: OSError) -> ExecPluginError:
        return ExecPluginError(f"user {self._user!r}: running {argv[0]}: {exc.strerror or exc}")

    def _timed_out(self, argv: list[str]) -> ExecPluginError:
        return ExecPluginError(
            f"user {self._user!r}: {argv[0]} did not answer in {PLUGIN_TIMEOUT_SECONDS:.0f}s"
        )

    def _answer(self, argv: list[str], code: int, stdout: bytes, stderr: bytes) -> Credential:
        """The credential of a finished run; the message names the user and what failed."""
        if code != 0:
            last = (stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
            raise ExecPluginError(
                f"user {self._user!r}: {argv[0]} exited with status {code}: {last}"
            )
        try:
            return parse_exec_credential(stdout.decode(errors="replace"), self.config.api_version)
        except ExecPluginError as exc:
            raise ExecPluginError(f"user {self._user!r}: {exc}") from None

    def _run(self) -> Credential:
        """One run, blocking: for start-up (in a thread) and command-line tools."""
        argv, env = self._argv_env()
        try:
            proc = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PLUGIN_TIMEOUT_SECONDS,
                check=False,
            )
        except OSError as exc:
            raise self._not_started(argv, exc) from None
        except subprocess.TimeoutExpired:
            raise self._timed_out(argv) from None  # subprocess.run killed it
        return self._answer(argv, proc.returncode, proc.stdout, proc.stderr)

    async def _run_async(self) -> Credential:
        """One run as a child process the event loop waits for: the loop never blocks.

        A plugin that overruns the timeout, or a run whose waiters are all gone at shutdown,
        is killed and reaped.
        """
        argv, env = self._argv_env()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise self._not_started(argv, exc) from None
        try:
            async with asyncio.timeout(PLUGIN_TIMEOUT_SECONDS):
                stdout, stderr = await proc.communicate()
        except TimeoutError:
            raise self._timed_out(argv) from None
        finally:
            if proc.returncode is None:  # timed out or cancelled
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return self._answer(argv, proc.returncode, stdout, stderr)

    def _valid(self) -> Credential | None:
        """The cached credential unless none is cached or it (nearly) expired."""
        cached = self._cached
        if cached is None or (
            cached.expires_at is not None
            and self._clock() >= cached.expires_at - EXPIRY_MARGIN_SECONDS
        ):
            return None
        return cached

    def credential(self) -> Credential:
        """The cached credential, or a fresh one when none is cached or it (nearly) expired.

        Blocks while the plugin runs: never call it on the event loop (use
        :meth:`credential_async` there).
        """
        cached = self._valid()
        if cached is None:
            cached = self._cached = self._run()
        return cached

    async def credential_async(self) -> Credential:
        """:meth:`credential` for the event loop: the plugin runs while the loop goes on.

        Concurrent callers share one run; a caller that is cancelled leaves the run going for
        the others (and for the next caller, who gets its answer from the cache).
        """
        cached = self._valid()
        if cached is not None:
            return cached
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.ensure_future(self._renew())
            # Retrieved here so that a failure nobody waited for is not logged as lost.
            self._renewal.add_done_callback(_retrieve)
        return await asyncio.shield(self._renewal)

    async def _renew(self) -> Credential:
        credential = await self._run_async()
        self._cached = credential
        return credential

    def invalidate(self) -> None:
        """The server rejected the credential: run the plugin again next time."""
        self._cached = None


def _retrieve(task: asyncio.Future[Credential]) -> None:
    if not task.cancelled():
        task.exception()
