"""Benchmark: this driver's kubeconfig loader and API client against maintained libraries'.

The question it answers: could ``dra_driver/kubeconfig.py`` + ``dra_driver/execcredential.py``
(and the aiohttp :class:`~dra_driver.kube.KubeClient` on top) give way to lightkube's
(``lightkube.config.kubeconfig`` + ``lightkube.config.client_adapter``) or kubernetes_asyncio's
(``kubernetes_asyncio.config``) loader without costing the node agent memory, latency or
behaviour? Contenders:

* ``ours``: :meth:`KubeClient.create` and ``KubeClient.request``, JSON decoded by hand;
* ``lightkube-adapter``: ``KubeConfig.from_file().get()`` and ``client_adapter.AsyncClient``
  (the loader's own httpx client, raw GET, JSON decoded by httpx);
* ``lightkube-client``: ``lightkube.AsyncClient.get(ResourceClaim, ...)`` (typed models);
* ``k8s-asyncio-raw``: ``load_kube_config`` and the generated ``ResourceV1Api`` with
  ``_preload_content=False`` (aiohttp response, JSON decoded by hand);
* ``k8s-asyncio-typed``: the same API returning a ``V1ResourceClaim`` model;
* ``python``: the interpreter and this script's standard-library imports (the floor).

Each contender runs in a fresh interpreter, ``--runs`` times, interleaved: import time of its
client modules, RSS after the import, peak RSS (VmHWM) after loading a token kubeconfig and one
GET, then ``--requests`` sequential GETs of one ResourceClaim over TLS from a loopback aiohttp
server in another process (median and p99 over all runs). ``--on-agent`` repeats the memory
figures with ``dra_driver.agent`` imported first, i.e. what the agent process would carry.

``--behaviour`` runs small experiments instead, one interpreter per library, on what the unit
tests pin about exec credential plugins (API version, env, ``KUBERNETES_EXEC_INFO``, caching by
``expirationTimestamp``, renewal on 401, client certificates, a slow plugin not stalling the
event loop, one run shared by concurrent requests, a hanging plugin timed out, one-line errors)
and about contexts, ``$KUBECONFIG`` lists and in-cluster token rotation.

A contender whose library is not importable is listed as missing, not measured. The libraries
are not project dependencies; measure in a throwaway venv::

    python3.11 -m venv /tmp/kcbench
    /tmp/kcbench/bin/pip install lightkube kubernetes_asyncio -e .
    /tmp/kcbench/bin/python bench/bench_kubeconfig.py [--runs 5] [--requests 500] [--on-agent]
    /tmp/kcbench/bin/python bench/bench_kubeconfig.py --behaviour

Needs the ``openssl`` command (throwaway certificates). Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMESPACE = "bench"
NAME = "gpu-claim"
CLAIM_PATH = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{NAME}"
TOKEN = "bench-token"
#: The server process stops by itself after this long, whatever the parent does.
SERVER_LIFETIME_SECONDS = 1800.0
#: A child (one contender, one run) that takes longer than this has hung.
CHILD_TIMEOUT_SECONDS = 300.0

#: An allocated, reserved ResourceClaim as the API server returns it (valid for typed models).
CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "name": NAME,
        "namespace": NAMESPACE,
        "uid": "5f1d5c5e-2b7c-4a55-9a55-3b1c1d1e1f10",
        "resourceVersion": "123456",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "finalizers": ["resource.kubernetes.io/delete-protection"],
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "trainer-0",
                "uid": "0e0f0a0b-1c1d-4e4f-8a8b-9c9d9e9f0a0b",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    },
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.dra.dev",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "selectors": [
                            {
                                "cel": {
                                    "expression": 'device.capacity["gpu.dra.dev"].memory'
                                    '.compareTo(quantity("40Gi")) >= 0'
                                }
                            }
                        ],
                    },
                }
            ]
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.dra.dev", "pool": "node-1", "device": "gpu-3"}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [
            {"resource": "pods", "name": "trainer-0", "uid": "0e0f0a0b-1c1d-4e4f-8a8b-9c9d9e9f0a0b"}
        ],
    },
}


# ------------------------------------------------------------------------------ contenders


@dataclass(frozen=True)
class Contender:
    """One way to load a kubeconfig and GET the claim."""

    name: str
    #: Distributions that must be installed (their versions go in the report).
    distributions: tuple[str, ...]
    #: What the agent would import for its API client (timed in the child).
    modules: tuple[str, ...]
    description: str


CONTENDERS = (
    Contender("python", (), (), "interpreter + asyncio/ssl only (the floor)"),
    Contender("ours", ("dra-driver",), ("dra_driver.kube",), "KubeClient.create + request"),
    Contender(
        "lightkube-adapter",
        ("lightkube",),
        ("lightkube.config.kubeconfig", "lightkube.config.client_adapter"),
        "KubeConfig.from_file + client_adapter.AsyncClient (httpx), raw GET",
    ),
    Contender(
        "lightkube-client",
        ("lightkube",),
        ("lightkube", "lightkube.resources.resource_v1"),
        "lightkube.AsyncClient.get(ResourceClaim) (typed)",
    ),
    Contender(
        "k8s-asyncio-raw",
        ("kubernetes_asyncio",),
        ("kubernetes_asyncio.config", "kubernetes_asyncio.client"),
        "load_kube_config + ResourceV1Api(_preload_content=False), raw GET",
    ),
    Contender(
        "k8s-asyncio-typed",
        ("kubernetes_asyncio",),
        ("kubernetes_asyncio.config", "kubernetes_asyncio.client"),
        "load_kube_config + ResourceV1Api.read_namespaced_resource_claim (typed)",
    ),
)


def missing(contender: Contender) -> list[str]:
    """The distributions of ``contender`` that are not installed here."""
    out = []
    for dist in contender.distributions:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out.append(dist)
    return out


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


Get = Callable[[], Awaitable[Any]]
Close = Callable[[], Awaitable[Any]]


async def _open(name: str, kubeconfig: str) -> tuple[Get, Close]:
    """A GET of the claim (returning the decoded object) and a close, for contender ``name``."""
    if name == "ours":
        from dra_driver.kube import KubeClient

        client = await KubeClient.create(kubeconfig)

        async def get_ours() -> Any:
            answer = await client.request("GET", CLAIM_PATH)
            assert answer.status == 200, answer.status
            return answer.json()

        return get_ours, client.close
    if name == "lightkube-adapter":
        from lightkube.config import client_adapter
        from lightkube.config.kubeconfig import KubeConfig

        config = KubeConfig.from_file(kubeconfig).get()
        assert config is not None
        httpx_client = client_adapter.AsyncClient(
            config, client_adapter.ConnectionParams(trust_env=False)
        )

        async def get_adapter() -> Any:
            answer = await httpx_client.get(CLAIM_PATH)
            assert answer.status_code == 200, answer.status_code
            return answer.json()

        return get_adapter, httpx_client.aclose
    if name == "lightkube-client":
        import lightkube
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.resources.resource_v1 import ResourceClaim

        lk = lightkube.AsyncClient(KubeConfig.from_file(kubeconfig), trust_env=False)

        async def get_lightkube() -> Any:
            return await lk.get(ResourceClaim, NAME, namespace=NAMESPACE)

        return get_lightkube, lk.close
    if name in ("k8s-asyncio-raw", "k8s-asyncio-typed"):
        from kubernetes_asyncio import client as k8s
        from kubernetes_asyncio import config as k8s_config

        configuration = k8s.Configuration()
        await k8s_config.load_kube_config(
            kubeconfig, client_configuration=configuration, persist_config=False
        )
        api_client = k8s.ApiClient(configuration)
        api = k8s.ResourceV1Api(api_client)

        async def get_raw() -> Any:
            # An aiohttp response, not a model, with _preload_content=False.
            response: Any = await api.read_namespaced_resource_claim(
                NAME, NAMESPACE, _preload_content=False
            )
            try:
                assert response.status == 200, response.status
                return json.loads(await response.read())
            finally:
                response.release()

        async def get_typed() -> Any:
            return await api.read_namespaced_resource_claim(NAME, NAMESPACE)

        return (get_raw if name.endswith("raw") else get_typed), api_client.close
    raise ValueError(f"unknown contender {name!r}")


def _status_kib(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(name: str, kubeconfig: str, requests: int, on_agent: bool) -> dict[str, Any]:
    """One run of one contender in this (fresh) interpreter."""
    if on_agent:
        importlib.import_module("dra_driver.agent")
    contender = next(c for c in CONTENDERS if c.name == name)
    t0 = time.perf_counter()
    for module in contender.modules:
        importlib.import_module(module)
    import_s = time.perf_counter() - t0
    result: dict[str, Any] = {"import_s": import_s, "rss_import_kib": _status_kib("VmRSS")}
    if name == "python":
        result["hwm_first_kib"] = result["hwm_end_kib"] = _status_kib("VmHWM")
        result["latencies_ms"] = []
        return result

    async def body() -> None:
        t = time.perf_counter()
        get, close = await _open(name, kubeconfig)
        await get()
        result["load_first_get_s"] = time.perf_counter() - t
        result["hwm_first_kib"] = _status_kib("VmHWM")
        try:
            for _ in range(min(20, requests)):  # warm-up: connection pool, caches
                await get()
            latencies = []
            for _ in range(requests):
                t = time.perf_counter()
                await get()
                latencies.append((time.perf_counter() - t) * 1000)
            result["latencies_ms"] = latencies
        finally:
            await close()
        result["hwm_end_kib"] = _status_kib("VmHWM")

    asyncio.run(body())
    return result


# ------------------------------------------------------------------------------ certificates


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    def b64(self, name: str) -> str:
        import base64

        return base64.b64encode(self.path(name).read_bytes()).decode()


def make_certs(directory: Path) -> Certs:
    """Throwaway certificates made with the openssl command (as tests/unit/kubeserver.py)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    directory.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=bench-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    for name, subject, ext in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "/CN=bench-user/O=system:masters", "extendedKeyUsage=clientAuth"),
    ):
        openssl(
            "req", "-new", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject
        )  # fmt: skip
        (directory / f"{name}.ext").write_text(ext + "\n")
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return Certs(directory)


def server_ssl(certs: Certs, require_client_cert: bool = False) -> Any:
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.path("server.crt"), certs.path("server.key"))
    if require_client_cert:
        context.load_verify_locations(certs.path("ca.crt"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def kubeconfig_doc(
    server: str,
    user: dict[str, Any],
    *,
    ca_data: str = "",
    contexts: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca_data:
        cluster["certificate-authority-data"] = ca_data
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}, *contexts],
    }


def write_kubeconfig(path: Path, doc: dict[str, Any]) -> Path:
    # JSON is YAML: no yaml import needed in the parent.
    path.write_text(json.dumps(doc, indent=1))
    return path


# ------------------------------------------------------------------------------ the server


def serve(certs_dir: Path, port_file: Path) -> int:
    """The loopback API server for the latency runs (own process); stops by itself."""
    from aiohttp import web

    body = json.dumps(CLAIM).encode()

    async def claim(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        return web.Response(body=body, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get(CLAIM_PATH, claim)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl(Certs(certs_dir)))
        await site.start()
        port_file.write_text(str(runner.addresses[0][1]))  # noqa: ASYNC240 - tiny, once
        try:
            await asyncio.sleep(SERVER_LIFETIME_SECONDS)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return 0


def _start_server(certs: Certs, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = work / "port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(certs.dir), str(port_file)],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the bench API server did not start")
        time.sleep(0.05)
    return proc, f"https://127.0.0.1:{port_file.read_text()}"


# ------------------------------------------------------------------------------ measuring


def _run_child(name: str, kubeconfig: Path, requests: int, on_agent: bool) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", name, "--kubeconfig", str(kubeconfig)]
    argv += ["--requests", str(requests)] + (["--on-agent"] if on_agent else [])
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def _mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def measure(runs: int, requests: int, on_agent: bool, json_out: Path | None) -> int:
    available = [c for c in CONTENDERS if not missing(c)]
    for contender in CONTENDERS:
        if missing(contender):
            print(f"MISSING {contender.name}: not measured, install {' '.join(missing(contender))}")
    if on_agent and missing(CONTENDERS[1]):
        print("MISSING dra-driver: --on-agent needs it")
        on_agent = False
    work = Path(tempfile.mkdtemp(prefix="bench-kubeconfig-"))
    certs = make_certs(work / "certs")
    server, url = _start_server(certs, work)
    kubeconfig = write_kubeconfig(
        work / "config", kubeconfig_doc(url, {"token": TOKEN}, ca_data=certs.b64("ca.crt"))
    )
    modes = [False, True] if on_agent else [False]
    results: dict[tuple[str, bool], list[dict[str, Any]]] = {
        (c.name, mode): [] for c in available for mode in modes
    }
    try:
        # Interleaved rounds, so that every contender sees the same load.
        for _ in range(runs):
            for contender in available:
                for mode in modes:
                    results[(contender.name, mode)].append(
                        _run_child(contender.name, kubeconfig, requests, mode)
                    )
    finally:
        server.terminate()
        server.wait(timeout=10)

    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    print(
        "versions: "
        + ", ".join(
            f"{d} {version(d)}"
            for d in ("dra-driver", "aiohttp", "lightkube", "httpx2", "kubernetes_asyncio")
        )
    )
    print(f"{runs} runs per contender, {requests} sequential GETs per run (after 20 warm-up)\n")
    print("| contender | import (ms) | RSS after import (MiB) | peak RSS, load + 1 GET (MiB) "
          "| peak RSS after all GETs (MiB) | GET p50 (ms) | GET p99 (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for contender in available:
        rs = results[(contender.name, False)]
        lat = [x for r in rs for x in r["latencies_ms"]]
        row = {
            "import_ms": statistics.median(r["import_s"] for r in rs) * 1000,
            "rss_import_kib": statistics.median(r["rss_import_kib"] for r in rs),
            "hwm_first_kib": statistics.median(r["hwm_first_kib"] for r in rs),
            "hwm_end_kib": statistics.median(r["hwm_end_kib"] for r in rs),
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": _p99(lat) if lat else None,
        }
        summary[contender.name] = row
        p50 = f"{row['p50_ms']:.3f}" if lat else "-"
        p99 = f"{row['p99_ms']:.3f}" if lat else "-"
        print(
            f"| {contender.name} | {row['import_ms']:.0f} | {_mib(row['rss_import_kib'])} "
            f"| {_mib(row['hwm_first_kib'])} | {_mib(row['hwm_end_kib'])} | {p50} | {p99} |"
        )
    if on_agent:
        print("\nWith `dra_driver.agent` imported first (what the agent process carries):\n")
        print("| contender | added import (ms) | peak RSS, load + 1 GET (MiB) | vs ours (MiB) |")
        print("|---|---|---|---|")
        ours = statistics.median(r["hwm_first_kib"] for r in results[("ours", True)])
        for contender in available:
            rs = results[(contender.name, True)]
            hwm = statistics.median(r["hwm_first_kib"] for r in rs)
            imp = statistics.median(r["import_s"] for r in rs) * 1000
            summary[contender.name + "+agent"] = {"import_ms": imp, "hwm_first_kib": hwm}
            print(f"| {contender.name} | {imp:.0f} | {_mib(hwm)} | {(hwm - ours) / 1024:+.1f} |")
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=1))
    return 0


# ------------------------------------------------------------------------------ behaviour

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
LIBRARIES = {
    "ours": "dra-driver",
    "lightkube": "lightkube",
    "kubernetes_asyncio": "kubernetes_asyncio",
}

PLUGIN = """#!{python}
import json, os, sys, time, datetime
here = os.path.dirname(os.path.abspath(__file__))
spec = json.load(open(os.path.join(here, "spec.json")))
log = os.path.join(here, "runs.log")
n = (len(open(log).readlines()) if os.path.exists(log) else 0) + 1
with open(log, "a") as f:
    f.write(json.dumps({{"args": sys.argv[1:], "region": os.environ.get("REGION"),
                        "info": os.environ.get("KUBERNETES_EXEC_INFO")}}) + "\\n")
open(os.path.join(here, "plugin.pid"), "w").write(str(os.getpid()))
time.sleep(spec.get("sleep", 0))
status = {{}}
if "token" in spec:
    status["token"] = spec["token"].replace("{{n}}", str(n))
if "expires_in" in spec:
    at = datetime.datetime.now(datetime.timezone.utc)
    at += datetime.timedelta(seconds=spec["expires_in"])
    status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
if "cert" in spec:
    status["clientCertificateData"] = open(spec["cert"]).read()
    status["clientKeyData"] = open(spec["key"]).read()
print(json.dumps({{"apiVersion": spec["apiVersion"], "kind": "ExecCredential", "status": status}}))
sys.stderr.write("plugin says no\\nsecond line\\n")
sys.exit(spec.get("exit", 0))
"""


class _Plugin:
    """A credential plugin script in ``directory``; ``spec.json`` says what the next run does."""

    def __init__(self, directory: Path, api_version: str) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.api_version = api_version
        script = directory / "plugin"
        script.write_text(PLUGIN.format(python=sys.executable))
        script.chmod(0o755)
        self.set(token="t{n}")

    def set(self, **spec: Any) -> None:
        (self.dir / "spec.json").write_text(json.dumps({"apiVersion": self.api_version, **spec}))

    def runs(self) -> list[dict[str, Any]]:
        log = self.dir / "runs.log"
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


class _Server:
    """An in-process loopback API server: ``accept`` decides on the Authorization header."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.accept: Callable[[str], bool] = lambda _auth: True
        self.url = ""
        self._runner: Any = None

    async def start(self, ssl_context: Any = None) -> _Server:
        from aiohttp import web

        async def handler(request: web.Request) -> web.Response:
            auth = request.headers.get("Authorization", "")
            self.seen.append(auth)
            ok = self.accept(auth)
            return web.json_response(CLAIM if ok else {"kind": "Status"}, status=200 if ok else 401)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        scheme = "https" if ssl_context else "http"
        self.url = f"{scheme}://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


class _Lib:
    """One library's way to open a client from a kubeconfig and GET with it."""

    name = ""

    async def open(self, kubeconfig: Path, context: str | None = None) -> Any:
        raise NotImplementedError

    async def get(self, handle: Any) -> int:
        raise NotImplementedError

    async def close(self, handle: Any) -> None:
        raise NotImplementedError

    def namespace(self, handle: Any) -> str:
        raise NotImplementedError

    def server(self, handle: Any) -> str:
        raise NotImplementedError

    async def open_env(self) -> Any:
        """From ``$KUBECONFIG`` the library's own way."""
        raise NotImplementedError

    async def open_in_cluster(self, sa_dir: Path) -> Any:
        raise NotImplementedError


class _Ours(_Lib):
    name = "ours"

    async def open(self, kubeconfig: Path, context: str | None = None) -> Any:
        from dra_driver.kube import KubeClient

        return await KubeClient.create(str(kubeconfig), context=context or "")

    async def get(self, handle: Any) -> int:
        return int((await handle.request("GET", CLAIM_PATH)).status)

    async def close(self, handle: Any) -> None:
        await handle.close()

    def namespace(self, handle: Any) -> str:
        return str(handle.connection.namespace)

    def server(self, handle: Any) -> str:
        return str(handle.connection.server)

    async def open_env(self) -> Any:
        from dra_driver.kube import KubeClient

        return await KubeClient.create("")  # in-cluster, then $KUBECONFIG

    async def open_in_cluster(self, sa_dir: Path) -> Any:
        from dra_driver.kube import KubeClient
        from dra_driver.kubeconfig import in_cluster_connection

        return KubeClient(in_cluster_connection(sa_dir))


class _Lightkube(_Lib):
    name = "lightkube"

    async def _client(self, config: Any) -> Any:
        from lightkube.config import client_adapter

        # The handle: the httpx client and the SingleConfig it was made from.
        return client_adapter.AsyncClient(
            config, client_adapter.ConnectionParams(trust_env=False)
        ), config

    async def open(self, kubeconfig: Path, context: str | None = None) -> Any:
        from lightkube.config.kubeconfig import KubeConfig

        return await self._client(KubeConfig.from_file(kubeconfig).get(context))

    async def get(self, handle: Any) -> int:
        return int((await handle[0].get(CLAIM_PATH)).status_code)

    async def close(self, handle: Any) -> None:
        await handle[0].aclose()

    def namespace(self, handle: Any) -> str:
        return str(handle[1].namespace)

    def server(self, handle: Any) -> str:
        return str(handle[1].cluster.server)

    async def open_env(self) -> Any:
        from lightkube.config.kubeconfig import KubeConfig

        return await self._client(KubeConfig.from_env().get())

    async def open_in_cluster(self, sa_dir: Path) -> Any:
        from lightkube.config.kubeconfig import KubeConfig

        return await self._client(KubeConfig.from_service_account(sa_dir).get())


class _K8sAsyncio(_Lib):
    name = "kubernetes_asyncio"

    async def open(self, kubeconfig: Path, context: str | None = None) -> Any:
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        loader = await config.load_kube_config(
            str(kubeconfig), context, client_configuration=configuration, persist_config=False
        )
        # The handle: the API client and the loader (which knows the context).
        return client.ApiClient(configuration), loader

    async def get(self, handle: Any) -> int:
        response = await handle[0].call_api(
            CLAIM_PATH, "GET", auth_settings=["BearerToken"], _preload_content=False
        )
        response.release()
        return int(response.status)

    async def close(self, handle: Any) -> None:
        await handle[0].close()

    def namespace(self, handle: Any) -> str:
        return str(handle[1].current_context["context"].get("namespace") or "")

    def server(self, handle: Any) -> str:
        return str(handle[0].configuration.host)

    async def open_env(self) -> Any:
        return await self.open(Path(os.environ["KUBECONFIG"]))

    async def open_in_cluster(self, sa_dir: Path) -> Any:
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            token_filename=str(sa_dir / "token"),
            cert_filename=str(sa_dir / "ca.crt"),
        )
        return client.ApiClient(configuration), None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if "\n" not in text else text.replace("\n", "\\n") + "  [MULTI-LINE]"


async def _heartbeat_gap(work: Awaitable[Any]) -> tuple[Any, float]:
    """Run ``work`` beside a 10 ms ticker; its result (or exception) and the longest gap."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    gaps = [0.0]

    async def beat() -> None:
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - before)

    task = asyncio.create_task(beat())
    await asyncio.sleep(0)
    try:
        result: Any = await work
    except Exception as exc:
        result = exc
    finally:
        done.set()
        await task
    return result, max(gaps)


async def probe(lib: _Lib, work: Path) -> dict[str, str]:
    """Experiments on ``lib``; each answer starts with yes/no, then the evidence."""
    out: dict[str, str] = {}
    certs = make_certs(work / "certs")
    server = await _Server().start()
    tls_server = await _Server().start(server_ssl(certs, require_client_cert=True))
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # a relative plugin command must not resolve against the cwd
    counter = [0]

    def setup(
        api_version: str = V1, relative: bool = False, **exec_extra: Any
    ) -> tuple[_Plugin, Path]:
        """A plugin and a kubeconfig that runs it (by absolute path unless ``relative``)."""
        counter[0] += 1
        d = work / f"case{counter[0]}"
        plugin = _Plugin(d, api_version)
        command = "./plugin" if relative else str(d / "plugin")
        user = {"exec": {"apiVersion": api_version, "command": command, **exec_extra}}
        return plugin, write_kubeconfig(d / "config", kubeconfig_doc(server.url, user))

    async def attempt(kubeconfig: Path, gets: int = 1) -> tuple[list[int], Any]:
        handle = await lib.open(kubeconfig)
        try:
            return [await lib.get(handle) for _ in range(gets)], handle
        finally:
            await lib.close(handle)

    # -- exec API versions
    supported = []
    for api_version in (V1, V1BETA1):
        plugin, kc = setup(api_version)
        try:
            statuses, _ = await attempt(kc)
            used = server.seen[-1] if server.seen else ""
            supported.append(api_version)
            out[f"exec {api_version.rsplit('/', 1)[1]}"] = f"yes ({statuses[0]}, sent {used!r})"
        except Exception as exc:
            out[f"exec {api_version.rsplit('/', 1)[1]}"] = f"no: {_one_line(exc)}"
    if not supported:
        return out
    api = supported[0]

    # -- a relative command is relative to the kubeconfig's directory (kubectl's rule)
    plugin, kc = setup(api, relative=True)
    try:
        await attempt(kc)
        out["exec command relative to the kubeconfig"] = "yes (ran with the cwd elsewhere)"
    except Exception as exc:
        out["exec command relative to the kubeconfig"] = f"no: {_one_line(exc)}"

    # -- args, env, KUBERNETES_EXEC_INFO, provideClusterInfo
    plugin, kc = setup(
        api,
        args=["token", "--cluster", "c1"],
        env=[{"name": "REGION", "value": "eu-1"}],
        provideClusterInfo=True,
    )
    try:
        await attempt(kc)
        run = plugin.runs()[0]
        out["exec args and env"] = (
            "yes"
            if run["args"] == ["token", "--cluster", "c1"] and run["region"] == "eu-1"
            else f"no: {run}"
        )
        info = json.loads(run["info"]) if run["info"] else None
        out["KUBERNETES_EXEC_INFO set"] = f"yes: {run['info']}" if info else "no"
        if info:
            interactive = info.get("spec", {}).get("interactive")
            out["interactive: false"] = (
                "yes" if interactive is False else f"no: interactive={interactive!r}"
            )
            cluster = info.get("spec", {}).get("cluster")
            out["provideClusterInfo"] = (
                f"yes: server={cluster.get('server')}" if cluster else "no: spec.cluster absent"
            )
    except Exception as exc:
        out["exec args and env"] = f"no: {_one_line(exc)}"

    # -- caching until expirationTimestamp
    plugin, kc = setup(api)
    plugin.set(token="t{n}", expires_in=3600)
    try:
        statuses, _ = await attempt(kc, gets=3)
        out["token cached until expirationTimestamp"] = (
            f"{'yes' if len(plugin.runs()) == 1 else 'no'}: {len(plugin.runs())} run(s) for "
            f"{len(statuses)} GETs, token valid 1 h"
        )
    except Exception as exc:
        out["token cached until expirationTimestamp"] = f"no: {_one_line(exc)}"
    plugin, kc = setup(api)
    plugin.set(token="t{n}", expires_in=5)  # inside every library's renewal margin
    try:
        server.seen.clear()
        await attempt(kc, gets=3)
        renewed = len(set(server.seen)) > 1
        out["renewed before expirationTimestamp (no 401 needed)"] = (
            f"{'yes' if renewed else 'no'}: {len(plugin.runs())} run(s), tokens sent "
            f"{sorted(set(server.seen))} for 3 GETs, token expiring in 5 s"
        )
    except Exception as exc:
        out["renewed before expirationTimestamp (no 401 needed)"] = f"no: {_one_line(exc)}"

    # -- 401 -> run the plugin again
    plugin, kc = setup(api)
    plugin.set(token="t{n}")
    try:
        server.accept = lambda auth: auth != "Bearer t1"
        statuses, _ = await attempt(kc, gets=3)
        out["401 runs the plugin again"] = (
            f"{'yes' if 200 in statuses else 'no'}: statuses {statuses}, "
            f"{len(plugin.runs())} run(s)"
        )
    except Exception as exc:
        out["401 runs the plugin again"] = f"no: {_one_line(exc)}"
    finally:
        server.accept = lambda _auth: True

    # -- client certificate from the plugin
    counter[0] += 1
    d = work / f"case{counter[0]}"
    plugin = _Plugin(d, api)
    plugin.set(cert=str(certs.path("client.crt")), key=str(certs.path("client.key")))
    kc = write_kubeconfig(
        d / "config",
        kubeconfig_doc(
            tls_server.url,
            {"exec": {"apiVersion": api, "command": str(d / "plugin")}},
            ca_data=certs.b64("ca.crt"),
        ),
    )
    try:
        statuses, _ = await attempt(kc)
        out["client certificate from the plugin"] = (
            f"{'yes' if statuses == [200] else 'no'}: {statuses}"
        )
    except Exception as exc:
        out["client certificate from the plugin"] = f"no: {_one_line(exc)}"

    # -- a slow plugin does not stall the event loop (start-up + first request; renewal)
    plugin, kc = setup(api)
    plugin.set(token="t{n}", sleep=2.0, expires_in=3600)
    result, gap = await _heartbeat_gap(attempt(kc))
    out["2 s plugin, open + first GET: loop not blocked"] = (
        f"{'yes' if gap < 0.5 else 'no'}: longest loop stall {gap:.2f} s"
        + (f" ({_one_line(result)})" if isinstance(result, Exception) else "")
    )
    plugin, kc = setup(api)
    plugin.set(token="t{n}", sleep=2.0)
    server.accept = lambda auth: auth != "Bearer t1"
    try:
        handle = await lib.open(kc)
        try:
            await lib.get(handle)  # t1: 401 (or renewed at once)
            result, gap = await _heartbeat_gap(lib.get(handle))
        finally:
            await lib.close(handle)
        renewed = len(plugin.runs()) > 1
        verdict = ("yes" if gap < 0.5 else "no") if renewed else "n/a (no renewal on 401)"
        out["2 s plugin, renewal after 401: loop not blocked"] = (
            f"{verdict}: longest stall {gap:.2f} s, {len(plugin.runs())} run(s), answer {result!r}"
        )
    except Exception as exc:
        out["2 s plugin, renewal after 401: loop not blocked"] = f"n/a: {_one_line(exc)}"
    finally:
        server.accept = lambda _auth: True

    # -- concurrent requests share one run
    plugin, kc = setup(api)
    plugin.set(token="t{n}", sleep=0.5, expires_in=5)
    try:
        handle = await lib.open(kc)
        try:
            before = len(plugin.runs())
            await asyncio.gather(*(lib.get(handle) for _ in range(5)))
            during = len(plugin.runs()) - before
        finally:
            await lib.close(handle)
        verdict = {0: "n/a (the expiring token is not renewed)", 1: "yes"}.get(during, "no")
        out["5 concurrent GETs needing a credential: one shared run"] = (
            f"{verdict}: {during} run(s) during the GETs, {before} at open (token expiring in 5 s)"
        )
    except Exception as exc:
        out["5 concurrent GETs needing a credential: one shared run"] = f"no: {_one_line(exc)}"

    # -- a hanging plugin is timed out and killed
    plugin, kc = setup(api)
    plugin.set(token="t{n}", sleep=30)
    if lib.name == "ours":
        from dra_driver import execcredential

        execcredential.PLUGIN_TIMEOUT_SECONDS = 1.0  # the real one is 60 s
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(4):
            await attempt(kc)
        verdict = "no: it answered?"
    except TimeoutError:
        verdict = "no: still waiting after 4 s (no plugin timeout), cancelled by the caller"
    except Exception as exc:
        verdict = f"yes: after {time.monotonic() - t0:.1f} s {_one_line(exc)}"
    await asyncio.sleep(0.3)
    pid = int((plugin.dir / "plugin.pid").read_text())
    try:
        os.kill(pid, 0)
        alive = "the plugin process is still running"
        os.kill(pid, 9)
    except ProcessLookupError:
        alive = "the plugin process is gone"
    out["hanging plugin timed out and killed"] = f"{verdict}; {alive}"
    if lib.name == "ours":
        execcredential.PLUGIN_TIMEOUT_SECONDS = 60.0

    # -- one-line errors naming the user
    plugin, kc = setup(api)
    plugin.set(token="x", exit=3)
    try:
        await attempt(kc)
        out["failing plugin: error"] = "no error raised"
    except Exception as exc:
        out["failing plugin: error"] = _one_line(exc)
    counter[0] += 1
    d = work / f"case{counter[0]}"
    d.mkdir()
    kc = write_kubeconfig(
        d / "config",
        kubeconfig_doc(
            server.url,
            {"exec": {"apiVersion": api, "command": "no-such-auth-plugin",
                      "installHint": "install it with: get-plugin"}},
        ),
    )  # fmt: skip
    try:
        await attempt(kc)
        out["plugin not in PATH: error"] = "no error raised"
    except Exception as exc:
        out["plugin not in PATH: error"] = _one_line(exc)

    # -- contexts and namespaces
    real = {"cluster": "real", "user": "u", "namespace": "team-a"}
    kc = write_kubeconfig(
        work / "contexts",
        kubeconfig_doc(
            "http://127.0.0.1:1", {"token": "t"}, contexts=[{"name": "real", "context": real}]
        ),
    )
    doc = json.loads(kc.read_text())
    doc["clusters"].append({"name": "real", "cluster": {"server": server.url}})
    write_kubeconfig(kc, doc)
    try:
        handle = await lib.open(kc, "real")
        try:
            out["--context picks the context; its namespace"] = (
                f"yes: server {lib.server(handle)}, namespace {lib.namespace(handle)!r}"
            )
        finally:
            await lib.close(handle)
        handle = await lib.open(kc)
        try:
            out["no namespace in the context"] = f"namespace {lib.namespace(handle)!r}"
        finally:
            await lib.close(handle)
    except Exception as exc:
        out["--context picks the context; its namespace"] = f"no: {_one_line(exc)}"

    # -- $KUBECONFIG list: first file wins (kubectl's rule)
    first = write_kubeconfig(work / "first", kubeconfig_doc("http://first:1", {"token": "1"}))
    second_doc = kubeconfig_doc("http://second:1", {"token": "2"})
    second_doc["current-context"] = "x"
    second = write_kubeconfig(work / "second", second_doc)
    os.environ["KUBECONFIG"] = f"{first}{os.pathsep}{second}"
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    try:
        handle = await lib.open_env()
        try:
            chosen = lib.server(handle)
            out["$KUBECONFIG a:b merged, first wins"] = (
                f"{'yes' if chosen == 'http://first:1' else 'no'}: server {chosen}"
            )
        finally:
            await lib.close(handle)
    except Exception as exc:
        out["$KUBECONFIG a:b merged, first wins"] = f"no: {_one_line(exc)}"
    finally:
        del os.environ["KUBECONFIG"]

    # -- in-cluster: a rotated token file is used after a 401
    tls_plain = await _Server().start(server_ssl(certs))
    sa = work / "sa"
    sa.mkdir()
    (sa / "token").write_text("old")
    (sa / "ca.crt").write_bytes(certs.path("ca.crt").read_bytes())
    (sa / "namespace").write_text("gpu-ops")
    os.environ["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
    os.environ["KUBERNETES_SERVICE_PORT"] = tls_plain.url.rsplit(":", 1)[1]
    tls_plain.accept = lambda auth: auth.strip() == "Bearer new"
    try:
        handle = await lib.open_in_cluster(sa)
        try:
            (sa / "token").write_text("new")
            statuses = [await lib.get(handle) for _ in range(2)]
        finally:
            await lib.close(handle)
        out["in-cluster: rotated token used after a 401"] = (
            f"{'yes' if 200 in statuses else 'no'}: statuses {statuses} after rotation"
        )
    except Exception as exc:
        out["in-cluster: rotated token used after a 401"] = f"no: {_one_line(exc)}"
    finally:
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        await tls_plain.stop()
    await server.stop()
    await tls_server.stop()
    return out


def probe_child(library: str) -> dict[str, str]:
    lib = {"ours": _Ours, "lightkube": _Lightkube, "kubernetes_asyncio": _K8sAsyncio}[library]()
    with tempfile.TemporaryDirectory(prefix="bench-kc-probe-") as tmp:
        return asyncio.run(probe(lib, Path(tmp)))


def behaviour(json_out: Path | None) -> int:
    results: dict[str, dict[str, str]] = {}
    for library, dist in LIBRARIES.items():
        if version(dist) == "missing":
            print(f"MISSING {library}: not probed, install {dist}")
            continue
        proc = subprocess.run(
            [sys.executable, __file__, "--probe", library],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            print(f"{library}: the probe failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        results[library] = json.loads(proc.stdout)
    for library, answers in results.items():
        print(f"\n## {library} {version(LIBRARIES[library])}\n")
        for question, answer in answers.items():
            print(f"- {question}: {answer}")
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per contender")
    parser.add_argument("--requests", type=int, default=500, help="timed GETs per run")
    parser.add_argument("--on-agent", action="store_true", help="also with dra_driver.agent")
    parser.add_argument("--behaviour", action="store_true", help="run the behaviour probes")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.kubeconfig, args.requests, args.on_agent)))
        return 0
    if args.probe:
        print(json.dumps(probe_child(args.probe)))
        return 0
    if args.serve:
        return serve(*args.serve)
    if args.behaviour:
        return behaviour(args.json)
    return measure(args.runs, args.requests, args.on_agent, args.json)


if __name__ == "__main__":
    sys.exit(main())
