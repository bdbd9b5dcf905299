"""``dra-driver compute-domain-plugin``: the node's IMEX devices, served beside the GPU agent.

It discovers the node's NVLink clique (the same discovery as the agent's), labels the node
with it, publishes the IMEX channel and daemon devices in a pool of their own driver name,
and serves their claims to the kubelet until SIGTERM. Slices and prepared claims stay in
place when it stops, as the agent's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import structlog

from dra_driver import exitcodes
from dra_driver.computedomain.api import CLIQUE_LABEL, ApiNames, names_for
from dra_driver.computedomain.channels import (
    CAPS_DEVICE_NAME,
    CHANNELS_DEVICE_NAME,
    FABRIC_IMEX_MGMT,
    NO_CLIQUE,
    SIMULATED_MAJOR,
    DaemonEdits,
    capability_minor,
    capability_node,
)
from dra_driver.computedomain.imexconfig import host_configs
from dra_driver.computedomain.nodedevices import imex_devices
from dra_driver.computedomain.nodedriver import API_FAILURES, ImexDriver
from dra_driver.computedomain.nodelabel import node_path
from dra_driver.events import post_event
from dra_driver.gpu.discovery.base import discover_async
from dra_driver.gpu.discovery.factory import make_discovery
from dra_driver.gpu.inventory import node_clique
from dra_driver.kube import KubeClient
from dra_driver.kubeletplugin.binding import BindingWatcher
from dra_driver.kubeletplugin.claims import KubeClaimFetcher
from dra_driver.kubeletplugin.plugin import Plugin, PluginConfig
from dra_driver.procdevices import char_major
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import DesiredPool, SliceContent
from dra_driver.resourceslice.rawapi import raise_for_status
from dra_driver.settings import Settings, SettingsError

log = structlog.get_logger(__name__)

#: Seconds between tries of the node's clique label: the first wait, doubling up to the cap.
LABEL_RETRY_FIRST = 1.0
LABEL_RETRY_CAP = 30.0


def _proc_texts(driver_root: Path, relative: str) -> Iterator[str]:
    """The texts of a /proc file, the driver root's own first (the stand-in driver has one;
    the host's /proc has no NVIDIA driver there), then the host's; unreadable ones skipped."""
    for proc in (driver_root / "proc", Path("/proc")):
        try:
            yield (proc / relative).read_text()
        except OSError:
            continue


def _major(driver_root: Path, device: str) -> int | None:
    found = (char_major(text, device) for text in _proc_texts(driver_root, "devices"))
    return next((major for major in found if major is not None), None)


def channel_major(driver_root: Path, simulated: bool, clique: str | None) -> int | None:
    """The IMEX channels' device major: from the host's /proc/devices (through the driver
    root when it has its own, as the stand-in driver does); a simulated node with a clique
    uses a fixed stand-in. None: no channels (no NVLink fabric, or no IMEX support)."""
    major = _major(driver_root, CHANNELS_DEVICE_NAME)
    if major is not None:
        return major
    return SIMULATED_MAJOR if simulated and clique else None


def daemon_edits(driver_root: Path, clique: str | None) -> DaemonEdits:
    """What the node's IMEX daemon container gets: the node's clique and, in a clique, the
    fabric-imex-mgmt capability device ``nvidia-imex`` opens (the NVIDIA driver's plugin
    injects the same node). When its minor or the nvidia-caps major cannot be read the
    daemon gets no device: a warning says so (a real ``nvidia-imex`` then fails to start)."""
    if not clique:
        return NO_CLIQUE
    minors = (capability_minor(text) for text in _proc_texts(driver_root, FABRIC_IMEX_MGMT))
    minor = next((m for m in minors if m is not None), None)
    major = _major(driver_root, CAPS_DEVICE_NAME)
    if minor is None or major is None:
        log.warning(
            "the fabric-imex-mgmt capability cannot be read: the node's IMEX daemon gets no "
            "capability device",
            capability=f"/proc/{FABRIC_IMEX_MGMT}",
            minor=minor,
            nvidia_caps_major=major,
        )
        return DaemonEdits(clique=clique)
    return DaemonEdits(clique=clique, imex_mgmt=capability_node(major, minor))


def desired_pool(names: ApiNames, node: str, clique: str | None, binding: bool) -> DesiredPool:
    """The node's IMEX pool."""
    devices = tuple(imex_devices(names.driver, clique, binding=binding))
    return DesiredPool(
        driver=names.driver,
        pool_name=node,
        node_name=node,
        slices=(SliceContent(devices=devices),),
    )


async def _label_clique(client: KubeClient, node: str, clique: str) -> None:
    """Label the node with its clique, trying until it lands: the domain's other daemons
    peer only with daemons on nodes labelled with their clique, so without the label this
    node's daemon is left out of their nodes configs and the domain never gets ready here."""
    patch = {"metadata": {"labels": {CLIQUE_LABEL: clique}}}
    delay = LABEL_RETRY_FIRST
    while True:
        try:
            response = await client.request(
                "PATCH", node_path(node), body=patch, content_type="application/merge-patch+json"
            )
            raise_for_status(response, verb="patch", resource="nodes", name=node)
            return
        except API_FAILURES as exc:
            error = str(exc) or type(exc).__name__
        log.error("labelling the node's clique failed", node=node, error=error, retry_in=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, LABEL_RETRY_CAP)


async def _report_host_imex(
    client: KubeClient, driver_root: Path, node: str, component: str
) -> None:
    """A host nvidia-imex service clashes with the daemons of compute domains (the same
    port, the same channels): say so on the Node, where an admin looks."""
    found = host_configs(driver_root)
    if not found:
        return
    files = ", ".join("/" + str(p.relative_to(driver_root)) for p in found)
    message = (
        f"the host has an nvidia-imex service ({files}); it clashes with the IMEX daemons "
        "ComputeDomains run on this node: disable it (systemctl disable --now nvidia-imex)"
    )
    log.warning("host imex service found", files=files)
    await post_event(
        client,
        kind="Node",
        name=node,
        reason="HostIMEXService",
        message=message,
        component=component,
    )


async def run_compute_domain_plugin(settings: Settings) -> int:
    """Serve the node's IMEX devices until SIGTERM/SIGINT."""
    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")
    names = names_for(settings.compat)
    node = settings.node_name
    structlog.contextvars.bind_contextvars(node=node, driver=names.driver)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    discovery = make_discovery(
        settings.backend,
        node_name=node,
        profile=settings.profile,
        driver_root=settings.driver_root,
    )
    inventory = await discover_async(discovery)
    clique = node_clique(inventory)
    major = channel_major(settings.driver_root, settings.backend == "simulated", clique)
    daemon = daemon_edits(settings.driver_root, clique)
    log.info(
        "imex devices",
        clique=clique or "none",
        channel_major=major,
        imex_mgmt=daemon.imex_mgmt.path if daemon.imex_mgmt else None,
    )
    client = await KubeClient.create(settings.kubeconfig, context=settings.context)
    state_dir = settings.plugins_dir / names.driver
    driver = ImexDriver(
        client,
        names,
        node,
        state_dir=state_dir,
        cdi_root=settings.cdi_root,
        major=major,
        daemon=daemon,
    )
    slices = SliceController(
        client, driver=names.driver, node_name=node, field_manager=names.driver
    )
    pool = desired_pool(names, node, clique, settings.imex_binding_conditions)
    republish: set[asyncio.Task[None]] = set()

    def registered() -> None:
        # The kubelet deletes a plugin's slices when it goes away: publish again.
        task = asyncio.ensure_future(slices.set_pool(pool))
        republish.add(task)
        task.add_done_callback(republish.discard)

    plugin = Plugin(
        PluginConfig(
            driver_name=names.driver,
            node_name=node,
            registry_dir=settings.registry_dir,
            plugins_dir=settings.plugins_dir,
            pod_uid=settings.pod_uid or None,
        ),
        driver,
        KubeClaimFetcher(client),
        on_registered=registered,
    )
    try:
        await _report_host_imex(client, settings.driver_root, node, names.driver)
        async with plugin, asyncio.TaskGroup() as group:
            # Tried until it lands, while the plugin serves (its claims need no label).
            loops = [group.create_task(_label_clique(client, node, clique))] if clique else []
            await slices.set_pool(pool)

            async def locked(work: Callable[[], Awaitable[None]]) -> None:
                async with plugin.lock.hold():
                    await work()

            # Also without binding conditions: it tells the driver which claims are still
            # allocated here, so a node whose channel claim went away before its prepare
            # succeeded leaves the domain.
            watcher = BindingWatcher(
                client, driver, driver_name=names.driver, pool=node, locked=locked
            )
            loops += [group.create_task(slices.run()), group.create_task(watcher.run())]
            await stop.wait()
            for task in loops:
                task.cancel()
    finally:
        await driver.close()
        with contextlib.suppress(Exception):
            await client.close()
    return exitcodes.OK
