"""Driver-agnostic kubelet plugin for DRA drivers.

Serves the kubelet's plugin-registration, DRAPlugin (v1, v1beta1) and DRAResourceHealth
(v1alpha1, v1) gRPC APIs on unix sockets and hands checked claims to a ``Driver``.

Typical use::

    config = PluginConfig(driver_name="gpu.dra.dev", node_name=node)
    async with await KubeClient.create(kubeconfig) as api, Plugin(
        config, driver, KubeClaimFetcher(api), health=health_source, on_registered=republish
    ) as plugin:
        await plugin.registered.wait()
        ...  # run until told to stop; leaving the block removes the sockets
"""

from dra_driver.errors import PrepareError
from dra_driver.kubeletplugin.claims import ClaimFetcher, KubeClaimFetcher, claim_to_prepare
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    DeviceHealth,
    Driver,
    HealthSource,
    HealthStatus,
    PreparedDevice,
    PrepareResult,
    Readiness,
    UnprepareResult,
)
from dra_driver.kubeletplugin.plugin import Plugin, PluginConfig
from dra_driver.kubeletplugin.sockets import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    MAX_SOCKET_PATH,
    SocketPaths,
    socket_paths,
)
from dra_driver.kubeletplugin.threads import InlineRunner, run_blocking

__all__ = [
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_REGISTRY_DIR",
    "MAX_SOCKET_PATH",
    "ClaimFetcher",
    "ClaimRef",
    "ClaimToPrepare",
    "DeviceHealth",
    "Driver",
    "HealthSource",
    "HealthStatus",
    "InlineRunner",
    "KubeClaimFetcher",
    "Plugin",
    "PluginConfig",
    "PrepareError",
    "PrepareResult",
    "PreparedDevice",
    "Readiness",
    "SocketPaths",
    "UnprepareResult",
    "claim_to_prepare",
    "run_blocking",
    "socket_paths",
]
