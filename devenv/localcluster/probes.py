"""Health probes of the local cluster's components, over plain HTTP(S) (no client library)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request

#: A component not (yet) answering HTTP: refused, reset, timed out, or an answer that is not
#: HTTP (a restarting server's garbled or cut-short response).
_UNREACHABLE = (urllib.error.URLError, OSError, http.client.HTTPException)


def http_ok(url: str) -> bool:
    """GET ``url``: True on 200 (etcd's /health)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except _UNREACHABLE:
        return False


def https_ok(url: str) -> bool:
    """GET an https URL with a self-signed certificate (component /healthz)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return int(resp.status) == 200
    except _UNREACHABLE:
        return False


def apiserver_request(server: str, token: str, ca_file: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` as the admin: (status, body); status 0 when the server is unreachable."""
    req = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=ca_file)
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as e:
        return int(e.code), b""
    except _UNREACHABLE:
        return 0, b""


def node_ready(status: int, body: bytes) -> bool:
    """Whether a GET of a Node answered with a Node whose Ready condition is True."""
    if status != 200:
        return False
    try:
        node = json.loads(body)
    except ValueError:
        return False
    conds = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
