"""Command lines and credentials of the control-plane components (pure functions).

Each ``*_flags`` function returns the arguments one component of the pinned release runs
with on loopback; ``token_auth_line`` and ``render_kubeconfig`` write the admin's static
token and kubeconfig. Nothing here starts a process.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: Controllers kube-controller-manager runs. Names are those of the pinned release.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "resourcepoolstatusrequest-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "job-controller",
    "validatingadmissionpolicy-status-controller",
)

ADMIN_USER = "testenv-admin"
ADMIN_GROUPS = ("system:masters",)
SERVICE_CIDR = "10.0.0.0/24"


def token_auth_line(token: str, user: str, uid: str, groups: Sequence[str]) -> str:
    """One line of a kube-apiserver ``--token-auth-file`` (CSV: token,user,uid,"groups")."""
    for part in (token, user, uid, *groups):
        if not part or any(c in part for c in ',"\n'):
            raise ValueError(f"invalid token file field {part!r}")
    line = f"{token},{user},{uid}"
    if groups:
        line += ',"' + ",".join(groups) + '"'
    return line


def render_kubeconfig(
    server: str,
    token: str,
    *,
    ca_data: bytes | None = None,
    cluster: str = "testenv",
    user: str = "admin",
) -> str:
    """Render a kubeconfig with one cluster, one token user and one current context.

    Without `ca_data` the server certificate is not verified.
    """
    cluster_entry: dict[str, Any] = {"server": server}
    if ca_data is None:
        cluster_entry["insecure-skip-tls-verify"] = True
    else:
        cluster_entry["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def etcd_flags(data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    return [
        "--data-dir",
        str(data_dir),
        "--listen-client-url",
        f"http://127.0.0.1:{client_port}",
        "--listen-peer-url",
        f"http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync",
    ]


def apiserver_flags(
    *,
    port: int,
    etcd_port: int,
    pki_dir: Path,
    cert_dir: Path,
    token_file: Path,
    feature_gates: str,
    runtime_config: str,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """Flags for the upstream kube-apiserver, secure port on loopback only."""
    flags = [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Endpoints may not be loopback addresses; nothing here needs them.
        "--endpoint-reconciler-type=none",
        # Close open watches on SIGTERM so a stop/restart takes ~1 s, not the 60 s
        # request timeout.
        "--shutdown-watch-termination-grace-period=2s",
        # Front-proxy settings, so delegated authentication in the scheduler and the
        # controller manager finds a complete extension-apiserver-authentication map.
        f"--requestheader-client-ca-file={pki_dir / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--allow-privileged=true",
        "--profiling=false",
        f"--v={verbosity}",
    ]
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    if runtime_config:
        flags.append(f"--runtime-config={runtime_config}")
    return flags + list(extra)


def _component_common(
    *, port: int, kubeconfig: Path, cert_dir: Path, feature_gates: str, verbosity: int
) -> list[str]:
    flags = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--v={verbosity}",
    ]
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    return flags


def scheduler_flags(
    *,
    port: int,
    kubeconfig: Path,
    cert_dir: Path,
    feature_gates: str,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    return _component_common(
        port=port,
        kubeconfig=kubeconfig,
        cert_dir=cert_dir,
        feature_gates=feature_gates,
        verbosity=verbosity,
    ) + list(extra)


def controller_manager_flags(
    *,
    port: int,
    kubeconfig: Path,
    cert_dir: Path,
    pki_dir: Path,
    feature_gates: str,
    controllers: Iterable[str] = DEFAULT_CONTROLLERS,
    verbosity: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    common = _component_common(
        port=port,
        kubeconfig=kubeconfig,
        cert_dir=cert_dir,
        feature_gates=feature_gates,
        verbosity=verbosity,
    )
    return [
        *common,
        "--use-service-account-credentials=false",
        f"--controllers={','.join(controllers)}",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}",
        f"--root-ca-file={pki_dir / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *extra,
    ]


def kubelet_flags(
    *,
    kubeconfig: Path,
    node_name: str,
    root_dir: Path,
    labels: Mapping[str, str],
    cdi_dirs: Sequence[Path],
    feature_gates: str,
    verbosity: int = 2,
    extra: Sequence[str] = (),
) -> list[str]:
    flags = [
        f"--kubeconfig={kubeconfig}",
        f"--node-name={node_name}",
        f"--root-dir={root_dir}",
        f"--v={verbosity}",
    ]
    for key, value in sorted(labels.items()):
        flags.append(f"--node-label={key}={value}")
    for d in cdi_dirs:
        flags.append(f"--cdi-dir={d}")
    if feature_gates:
        flags.append(f"--feature-gates={feature_gates}")
    return flags + list(extra)


def parse_node_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Parse ``NAME`` or ``NAME:k=v,k2=v2`` (the ``up --node`` syntax)."""
    name, _, rest = spec.partition(":")
    if not name:
        raise ValueError(f"empty node name in {spec!r}")
    labels: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad label {item!r} in {spec!r}: want key=value")
        labels[key] = value
    return name, labels
