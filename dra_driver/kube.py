"""API client construction: in-cluster in a pod, a kubeconfig everywhere else."""

from __future__ import annotations

import os
from typing import Any

from kubernetes.aio import config as _aio_config
from kubernetes.aio.client import ApiClient, Configuration

# The config loaders carry no type hints; treat the module as dynamic.
aio_config: Any = _aio_config


class KubeConfigError(Exception):
    """No way to reach the API server was found; the message says which were tried."""


async def api_client(kubeconfig: str = "") -> Any:
    """An ``kubernetes.aio`` ApiClient; the caller closes it.

    Order: an explicit kubeconfig, the in-cluster service account (inside a pod), then
    ``$KUBECONFIG`` or ``~/.kube/config``.
    """
    configuration = Configuration()
    try:
        if kubeconfig:
            await aio_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            aio_config.load_incluster_config(client_configuration=configuration)
        else:
            await aio_config.load_kube_config(client_configuration=configuration)
    except (aio_config.ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeConfigError(
            f"cannot load API server credentials from {where}: {exc}; "
            "set --kubeconfig (DRA_KUBECONFIG) or run inside a pod"
        ) from None
    return ApiClient(configuration)
