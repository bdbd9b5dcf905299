"""Kubeconfig exec credential plugins: run, parse the ExecCredential, cache until expiry.

The plugins are small Python scripts written by the tests; each run appends a line to a
log file, so the tests see how often the plugin ran and with which environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web

from dra_driver.execcredential import (
    ExecPluginError,
    ExecRunner,
    parse_exec_config,
    parse_exec_credential,
)
from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import Connection, ExecTokenSource, KubeConfigError, load_connection
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, RawApi
from dra_driver.resourceslice.reflector import Reflector
from dra_driver.resourceslice.reporting import ApiErrorReporter
from tests.unit.kubeserver import Certs, _openssl, make_certs, serve
from tests.unit.test_kube import kubeconfig

V1 = "client.authentication.k8s.io/v1"


def plugin(
    tmp_path: Path, status: dict[str, Any], *, exit_code: int = 0, name: str = "plugin"
) -> Path:
    """An executable that logs its run (args, env) and prints an ExecCredential.

    A token containing ``{n}`` is numbered by the run, so renewals are visible.
    """
    log = tmp_path / f"{name}.log"
    script = tmp_path / name
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"log = {str(log)!r}\n"
        "n = (len(open(log).readlines()) if os.path.exists(log) else 0) + 1\n"
        "with open(log, 'a') as f:\n"
        "    f.write(json.dumps({'args': sys.argv[1:], 'info': os.environ.get('KUBERNETES_EXEC_INFO'),"
        " 'region': os.environ.get('REGION')}) + '\\n')\n"
        f"status = json.loads({json.dumps(json.dumps(status))})\n"
        "if 'token' in status: status['token'] = status['token'].replace('{n}', str(n))\n"
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', 'status': status}}))\n"
        "sys.stderr.write('plugin says no\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    return script


def runs(tmp_path: Path, name: str = "plugin") -> list[dict[str, Any]]:
    log = tmp_path / f"{name}.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def exec_user(command: str, **extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": V1, "command": command, **extra}}


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()

    def __call__(self) -> float:
        return self.now


def test_token_cached_until_expiration(tmp_path: Path) -> None:
    expiry = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
    script = plugin(tmp_path, {"token": "t{n}", "expirationTimestamp": rfc3339(expiry)})
    clock = Clock()
    config = parse_exec_config({"apiVersion": V1, "command": str(script)}, "u")
    runner = ExecRunner(config, user="u", base_dir=tmp_path, clock=clock)
    assert runner.credential().token == "t1"
    clock.now = expiry.timestamp() - 60
    assert runner.credential().token == "t1"  # still valid: no new run
    assert len(runs(tmp_path)) == 1
    clock.now = expiry.timestamp() - 5  # within the renewal margin
    assert runner.credential().token == "t2"
    assert len(runs(tmp_path)) == 2


def test_token_without_expiry_is_kept_until_rejected(tmp_path: Path) -> None:
    script = plugin(tmp_path, {"token": "t{n}"})
    config = parse_exec_config({"apiVersion": V1, "command": str(script)}, "u")
    runner = ExecRunner(config, user="u", base_dir=tmp_path)
    assert [runner.credential().token for _ in range(3)] == ["t1"] * 3
    runner.invalidate()
    assert runner.credential().token == "t2"


def test_args_env_and_exec_info(tmp_path: Path) -> None:
    plugin(tmp_path, {"token": "x"})
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "http://h:1", "extensions": {"audience": "k8s"}},
        user=exec_user(
            "./plugin",  # relative to the kubeconfig's directory
            args=["token", "--cluster", "c1"],
            env=[{"name": "REGION", "value": "eu-1"}],
            provideClusterInfo=True,
        ),
    )
    conn = load_connection(str(path))
    assert conn.token is not None and conn.token.token() == "x"
    (run,) = runs(tmp_path)
    assert run["args"] == ["token", "--cluster", "c1"] and run["region"] == "eu-1"
    info = json.loads(run["info"])
    assert info["apiVersion"] == V1 and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "http://h:1"
    assert info["spec"]["cluster"]["config"] == {"audience": "k8s"}


def test_exec_info_config_is_the_exec_extension_of_the_cluster(tmp_path: Path) -> None:
    """A kubeconfig lists a cluster's extensions by name (``- name: ..., extension: ...``);
    the plugin's ``spec.cluster.config`` is the one named client.authentication.k8s.io/exec,
    as client-go hands it over, not the whole list."""
    plugin(tmp_path, {"token": "x"})
    path = kubeconfig(
        tmp_path / "config",
        cluster={
            "server": "http://h:1",
            "extensions": [
                {"name": "example.com/other", "extension": {"ignored": True}},
                {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "k8s"}},
            ],
        },
        user=exec_user("./plugin", provideClusterInfo=True),
    )
    load_connection(str(path))
    (run,) = runs(tmp_path)
    assert json.loads(run["info"])["spec"]["cluster"]["config"] == {"audience": "k8s"}


def test_command_from_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin(tmp_path, {"token": "from-path"}, name="cloud-auth")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    path = kubeconfig(
        tmp_path / "config", cluster={"server": "http://h:1"}, user=exec_user("cloud-auth")
    )
    conn = load_connection(str(path))
    assert conn.token is not None and conn.token.token() == "from-path"


@pytest.mark.parametrize(
    ("user", "message"),
    [
        (
            exec_user("no-such-auth-plugin", installHint="install it with: get-plugin"),
            "credential plugin 'no-such-auth-plugin' not found in PATH (install it with: get-plugin)",
        ),
        (exec_user("./plugin"), "exited with status 3: plugin says no"),
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}},
            "exec.apiVersion 'client.authentication.k8s.io/v1alpha1' is not one of",
        ),
        ({"exec": {"apiVersion": V1}}, "exec.command: Field required"),
    ],
    ids=["not-found", "failing", "old-api", "no-command"],
)
def test_plugin_errors_are_one_line(tmp_path: Path, user: dict[str, Any], message: str) -> None:
    plugin(tmp_path, {"token": "x"}, exit_code=3)
    path = kubeconfig(tmp_path / "config", cluster={"server": "http://h:1"}, user=user)
    with pytest.raises(KubeConfigError) as err:
        load_connection(str(path))
    assert message in str(err.value)
    assert "user 'u'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("not json", "not JSON"),
        (
            json.dumps({"apiVersion": V1, "kind": "Status", "status": {}}),
            "a Status, not an ExecCredential",
        ),
        (
            json.dumps(
                {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "kind": "ExecCredential",
                    "status": {"token": "t"},
                }
            ),
            "answered with client.authentication.k8s.io/v1beta1",
        ),
        (
            json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {}}),
            "neither a token nor",
        ),
        (
            json.dumps(
                {
                    "apiVersion": V1,
                    "kind": "ExecCredential",
                    "status": {"clientCertificateData": "x"},
                }
            ),
            "without its key",
        ),
        (
            json.dumps(
                {
                    "apiVersion": V1,
                    "kind": "ExecCredential",
                    "status": {"token": "t", "expirationTimestamp": "soon"},
                }
            ),
            "status.expirationTimestamp",
        ),
    ],
)
def test_bad_exec_credentials(output: str, message: str) -> None:
    with pytest.raises(ExecPluginError, match=message):
        parse_exec_credential(output, V1)


def test_client_certificate_from_plugin_authenticates(tmp_path: Path) -> None:
    certs: Certs = make_certs(tmp_path / "certs")
    plugin(
        tmp_path,
        {
            "clientCertificateData": Path(certs.client_cert).read_text(),
            "clientKeyData": Path(certs.client_key).read_text(),
        },
    )
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://h", "certificate-authority-data": certs.b64(certs.ca)},
        user=exec_user("./plugin"),
    )
    conn = load_connection(str(path))
    assert conn.token is None  # the certificate is the credential
    assert conn.ssl_context is not None
    assert len(runs(tmp_path)) == 1


async def test_requests_carry_the_plugin_token_and_renew_on_401(tmp_path: Path) -> None:
    plugin(
        tmp_path,
        {"token": "t{n}", "expirationTimestamp": rfc3339(datetime.now(UTC) + timedelta(hours=1))},
    )
    async with serve() as server:

        async def whoami(request: web.Request) -> web.Response:
            ok = request.headers.get("Authorization") == "Bearer t2"
            return web.json_response({}, status=200 if ok else 401)

        server.routes[("GET", "/whoami")] = whoami
        path = kubeconfig(
            tmp_path / "config", cluster={"server": server.url}, user=exec_user("./plugin")
        )
        async with await KubeClient.create(str(path)) as client:
            assert (await client.request("GET", "/whoami")).status == 401  # t1 rejected
            assert (await client.request("GET", "/whoami")).status == 200  # t2 from a new run
            assert (await client.request("GET", "/whoami")).status == 200  # t2 cached
    assert len(runs(tmp_path)) == 2


async def test_a_plugin_failing_at_renewal_fails_the_request_like_a_lost_connection(
    tmp_path: Path,
) -> None:
    """A renewal that fails while the agent runs (the cloud login briefly down) fails that
    request the way a lost connection does, so callers retry; it is not a start-up error
    that ends the watch for good."""
    script = plugin(tmp_path, {"token": "x"}, exit_code=3)
    runner = ExecRunner(
        parse_exec_config({"apiVersion": V1, "command": str(script)}, "u"),
        user="u",
        base_dir=tmp_path,
    )
    async with serve() as server:
        server.json("GET", "/whoami", 200, {})
        connection = Connection(server=server.url, token=ExecTokenSource(runner))
        async with KubeClient(connection) as client:
            with pytest.raises(CONNECTION_ERRORS) as err:
                await client.request("GET", "/whoami")
            assert "exited with status 3" in str(err.value)
            reflector = Reflector(
                lambda: RawApi(client).list_objects("/whoami", "things"),
                lambda version, timeout: RawApi(client).watch_objects(
                    "/whoami", "things", "", version, timeout
                ),
                resource="things",
                on_listed=lambda items: None,
                on_event=lambda kind, obj: None,
                log=structlog.get_logger(),
                reporter=ApiErrorReporter(structlog.get_logger()),
            )
            task = asyncio.create_task(reflector.run())
            await asyncio.sleep(0.3)
            alive = not task.done()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert alive, "the watch ended on a failed credential renewal"


def certificate_plugin(tmp_path: Path, certs: Certs, first_expiry: str | None) -> None:
    """A plugin that gives client certificates, no token: the test CA's client certificate
    (CN test-user) with ``first_expiry`` on its first run, a second one (CN second-user)
    valid for an hour on later runs."""
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-new", *key, "-keyout", "second.key", "-out", "second.csr",
             "-subj", "/CN=second-user", cwd=certs.dir)  # fmt: skip
    (certs.dir / "second.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "second.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "second.crt", "-days", "2",
             "-extfile", "second.ext", cwd=certs.dir)  # fmt: skip
    pems = [
        (certs.client_cert.read_text(), certs.client_key.read_text()),
        ((certs.dir / "second.crt").read_text(), (certs.dir / "second.key").read_text()),
    ]
    log = tmp_path / "plugin.log"
    later = rfc3339(datetime.now(UTC) + timedelta(hours=1))
    script = tmp_path / "plugin"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os\n"
        f"log = {str(log)!r}\n"
        "n = (len(open(log).readlines()) if os.path.exists(log) else 0) + 1\n"
        "open(log, 'a').write('{}\\n')\n"
        f"pems = {pems!r}\n"
        "cert, key = pems[0] if n == 1 else pems[1]\n"
        "status = {'clientCertificateData': cert, 'clientKeyData': key}\n"
        f"expiry = {first_expiry!r} if n == 1 else {later!r}\n"
        "if expiry: status['expirationTimestamp'] = expiry\n"
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', 'status': status}}))\n"
    )
    script.chmod(0o755)


def client_cert_server_tls(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    context.load_verify_locations(certs.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def common_name(peercert: Any) -> str:
    return str(dict(x[0] for x in peercert["subject"])["commonName"])


async def test_a_client_certificate_from_the_plugin_is_renewed_when_it_expires(
    tmp_path: Path,
) -> None:
    """A plugin that gives short-lived client certificates (no token) runs again when its
    certificate expires, and the new certificate is presented, as client-go does."""
    certs: Certs = make_certs(tmp_path / "certs")
    certificate_plugin(tmp_path, certs, rfc3339(datetime.now(UTC) + timedelta(seconds=5)))
    async with serve(client_cert_server_tls(certs)) as server:
        server.json("GET", "/version", 200, {})
        path = kubeconfig(
            tmp_path / "config",
            cluster={"server": server.url, "certificate-authority-data": certs.b64(certs.ca)},
            user=exec_user("./plugin"),
        )
        async with await KubeClient.create(str(path)) as client:
            assert (await client.request("GET", "/version")).ok
    assert common_name(server.seen[0]["peercert"]) == "second-user"
    assert len(runs(tmp_path)) == 2


async def test_a_client_certificate_the_server_refuses_is_renewed(tmp_path: Path) -> None:
    """A plugin certificate without an expiry is kept until the server refuses it (401);
    the next request runs the plugin again and presents the new certificate on a new
    connection (not on the kept-alive one that carries the refused certificate)."""
    certs: Certs = make_certs(tmp_path / "certs")
    certificate_plugin(tmp_path, certs, None)
    async with serve(client_cert_server_tls(certs)) as server:

        async def whoami(request: web.Request) -> web.Response:
            assert request.transport is not None
            name = common_name(request.transport.get_extra_info("peercert"))
            return web.json_response({}, status=200 if name == "second-user" else 401)

        server.routes[("GET", "/whoami")] = whoami
        path = kubeconfig(
            tmp_path / "config",
            cluster={"server": server.url, "certificate-authority-data": certs.b64(certs.ca)},
            user=exec_user("./plugin"),
        )
        async with await KubeClient.create(str(path)) as client:
            assert (await client.request("GET", "/whoami")).status == 401
            assert (await client.request("GET", "/whoami")).status == 200
            assert (await client.request("GET", "/whoami")).status == 200
    assert len(runs(tmp_path)) == 2
