"""The node agent (``dra-driver run``): kubelet plugin, slice publisher and health in one loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from dra_driver import metrics
from dra_driver.bindsettings import SocketSettings
from dra_driver.cdi.spec import NO_EDITS, ContainerEdits
from dra_driver.cdi.writer import write_atomic
from dra_driver.claimreport import ClaimReporter
from dra_driver.events import post_event
from dra_driver.gpu.container import ctk, devnodes
from dra_driver.gpu.container.claim_spec import parse_mig_minors
from dra_driver.gpu.container.driverfiles import kernel_driver_version
from dra_driver.gpu.discovery.base import discover_async
from dra_driver.gpu.discovery.factory import make_discovery
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.health.broadcast import HealthBroadcaster
from dra_driver.gpu.health.injected import INJECT_FILE, InjectedProber, watch_injected
from dra_driver.gpu.health.nvml import NvmlEventWatcher, NvmlProber, mig_instances
from dra_driver.gpu.health.recheck import Prober, recheck_forever
from dra_driver.gpu.health.tracker import FRAGMENTED_HOLD, HealthEvent, HealthTracker, parse_xids
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigBackend
from dra_driver.gpu.mig.factory import make_mig_backend
from dra_driver.gpu.nvidia_config import config_apis
from dra_driver.gpu.publish.overhead import parse_overhead
from dra_driver.gpu.publish.profiles import published_inventory
from dra_driver.gpu.publish.publisher import CONSUMABLE, NodePublishing
from dra_driver.gpu.sharing.factory import make_sharing_backend
from dra_driver.gpu.sharing.selection import parse_selection
from dra_driver.gpu.sharing.shared_gpus import shared_uuids
from dra_driver.gpu.state.checkpoint import read_boot_id
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.gpu.state.evidence import NO_EVIDENCE, Evidence, claims_in_use
from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import Connection
from dra_driver.kubeletplugin.binding import BindingWatcher
from dra_driver.kubeletplugin.claims import KubeClaimFetcher
from dra_driver.kubeletplugin.late import LateParts, Parts
from dra_driver.kubeletplugin.liveness import serve_liveness
from dra_driver.kubeletplugin.node_service import error_text
from dra_driver.kubeletplugin.plugin import Plugin
from dra_driver.kubeletplugin.sockets import answers, socket_paths
from dra_driver.plugin_setup import kubelet_plugin
from dra_driver.reach import reach_api_server
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.publisher import Publisher, register_publisher
from dra_driver.settings import Settings
from dra_driver.startup import state_dir
from dra_driver.supervise import Heartbeats, supervise

log = structlog.get_logger(__name__)

#: The devices' health conditions in the state directory, for the next agent.
HEALTH_FILE = "health-conditions.json"

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
REGISTRATION_GRACE = 10.0
#: Seconds the claim status queued by the last calls may take to be written at shutdown.
STATUS_FLUSH = 2.0


def _mig_minors(driver_root: Path) -> dict[str, int] | None:
    try:
        return parse_mig_minors((driver_root / str(MIG_MINORS).lstrip("/")).read_text())
    except OSError:
        return None


def build_mig(settings: Settings, inventory: Inventory) -> MigBackend | None:
    """The MIG backend when dynamic MIG is on (blocking: may read or seed its state)."""
    if not settings.dynamic_mig:
        return None
    return make_mig_backend(
        settings.backend,
        state_dir=state_dir(settings),
        inventory=inventory,
        driver_root=settings.driver_root,
    )


async def ask_api(client: KubeClient, settings: Settings) -> Evidence:
    """What the API server says is allocated from this node's pool, as start-up's evidence;
    without an answer, start-up destroys nothing no checkpoint record names."""
    try:
        items = await KubeClaimFetcher(client).list_claims()
    except Exception as exc:  # any failure: no proof, so nothing is taken apart
        log.warning(
            "cannot list ResourceClaims: start-up keeps what it cannot prove unused",
            error=error_text(exc),
        )
        return NO_EVIDENCE
    claims = claims_in_use(items, driver=settings.driver_name, pool=settings.node_name)
    return Evidence(specs={}, api=claims)


def driver_files(settings: Settings, inventory: Inventory) -> ContainerEdits:
    """The CDI edits that give containers the NVIDIA driver's user-space files.

    With simulated GPUs there is usually no driver; when the driver root holds one anyway
    (a node with a driver, or a test's simulated driver root) its files are mounted as on a
    real node, found by the kernel module's version instead of NVML's.
    """
    real = settings.backend == "nvml"
    if not real and not kernel_driver_version(settings.driver_root):
        return NO_EDITS
    return ctk.common_edits(
        str(settings.driver_root),
        host_root=settings.host_driver_root,
        driver_version=inventory.driver_version if real else "",
    )


def build_state(
    settings: Settings,
    inventory: Inventory,
    mig: MigBackend | None = None,
    evidence: Evidence = NO_EVIDENCE,
) -> DeviceState:
    """The node's claim state (blocking: reads and may rewrite the checkpoint; with dynamic
    MIG it also destroys MIG devices that ``evidence`` and the checkpoint prove unused)."""
    real = settings.backend == "nvml"
    return DeviceState(
        inventory=inventory,
        driver_name=settings.driver_name,
        config_apis=config_apis(settings.compat),
        node_name=settings.node_name,
        cdi_root=settings.cdi_root,
        state_dir=state_dir(settings),
        boot_id=read_boot_id(),
        common_edits=driver_files(settings, inventory),
        mig_minors=_mig_minors(settings.driver_root),
        device_nodes=(
            devnodes.host(settings.driver_root, settings.host_driver_root)
            if real
            else devnodes.simulated
        ),
        mig=mig,
        mig_layout=settings.mig_layout,
        shared_gpus=shared_uuids(inventory, parse_selection(settings.shared_gpus)),
        sharing=make_sharing_backend(
            settings.backend,
            state_dir=state_dir(settings),
            driver_root=settings.driver_root,
            host_driver_root=settings.host_driver_root,
        ),
        evidence=evidence,
    )


class NodeAgent:
    """Everything one node runs, wired together."""

    def __init__(
        self,
        settings: Settings,
        inventory: Inventory,
        state: DeviceState,
        client: Any,
        mig: MigBackend | None = None,
        publisher: Publisher | None = None,
        plugin: Plugin | None = None,
        parts: LateParts | None = None,
    ) -> None:
        """``plugin`` is the kubelet plugin already bound with ``parts`` as its driver,
        fetcher and health source (see :func:`dra_driver.launch.run_agent`); without them
        the agent builds its own, which its caller starts."""
        self.settings = settings
        self.node = settings.node_name
        self.driver = settings.driver_name
        self.inventory = inventory
        self.state = state
        self.client = client
        shared = shared_uuids(inventory, parse_selection(settings.shared_gpus))
        if shared:
            log.info("sharing GPUs by memory", gpus=sorted(shared))
        self.publishing = NodePublishing(
            mig,
            inventory,
            shared,
            binding=settings.dynamic_mig and settings.mig_binding_conditions,
            mig_layout=settings.mig_layout,
            overhead=parse_overhead(settings.node_overhead),
            list_attributes=settings.list_attributes,
            legacy_nvidia=settings.compat == "nvidia",
        )
        self.slices = SliceController(
            client,
            driver=self.driver,
            node_name=self.node,
            on_dropped=self._on_dropped,
            publisher=publisher,
            publisher_alive=self._agent_runs,
        )
        self.health = HealthTracker(inventory, self.driver, parse_xids(settings.ignored_xids))
        # NVML reports an event once, to the agent running then: the conditions an earlier
        # agent saw stand until a re-check finds their GPUs healthy. Without re-checks
        # (interval 0) a restart is how an admin clears them, so none are taken back.
        self._health_file = state.state_dir / HEALTH_FILE
        if settings.health_recheck_interval > 0:
            self.health.restore(read_health_file(self._health_file), time.monotonic())
        metrics.UNHEALTHY_DEVICES.set(len(self.health.unhealthy()))
        self.broadcaster = HealthBroadcaster(self.health.device_health(self.node))
        self.reporter = ClaimReporter(client, self.driver, self.node)
        self.heartbeats = Heartbeats()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.plugin_driver = GpuDriver(
            state,
            self.reporter,
            on_carve_failed=self.on_carve_failed,
            on_no_placement=self.on_no_placement,
        )
        # Calls the kubelet made since the plugin was bound are served from here on.
        self.parts = parts or LateParts()
        self.plugin = plugin or kubelet_plugin(SocketSettings.of(settings), self.parts)
        self.parts.attach(
            Parts(
                self.plugin_driver,
                KubeClaimFetcher(client),
                self.broadcaster,
                on_registered=lambda: self._spawn(self.publish()),
            )
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def publish(self) -> None:
        """Hand the publisher the pool as it should be now (health taints included)."""
        pool = self.publishing.pool(self.node, self.driver, self.health.taints())
        metrics.PUBLISHED_DEVICES.set(sum(len(s.devices) for s in pool.slices))
        metrics.PUBLISHED_SLICES.set(len(pool.slices))
        await self.slices.set_pool(pool)

    async def _on_dropped(self, gates: frozenset[str]) -> None:
        """The API server drops fields: give up what needs them, republish, tell the Node."""
        given_up = await self.publishing.on_dropped(gates)
        if not given_up:
            return
        if CONSUMABLE in given_up:
            # Allocations of the formerly shared GPUs are whole GPUs now, without a share.
            await asyncio.to_thread(self.state.stop_sharing_by_memory)
        self._spawn(self.publish())
        for gate, consequence in given_up.items():
            self._spawn(
                self._node_event(
                    "DRAFeatureUnavailable",
                    f"{self.driver}: the API server does not support {gate}; {consequence}",
                )
            )

    async def _node_event(self, reason: str, message: str) -> None:
        """An Event on this agent's Node (best effort)."""
        await post_event(self.client, kind="Node", name=self.node, reason=reason, message=message)

    def on_health_event(self, event: HealthEvent) -> None:
        """Taint devices and tell the kubelet; called on the event loop."""
        label = "gpu-lost" if event.problem == "gpu-lost" else str(event.xid or "")
        ignored = event.problem == "xid" and event.xid in self.health.ignored_xids
        metrics.HEALTH_EVENTS.labels(xid=label, ignored=str(ignored).lower()).inc()
        if not self.health.apply(event, time.monotonic()):
            return
        log.warning(
            "device health changed",
            uuid=event.uuid,
            problem=event.problem,
            xid=event.xid,
            unhealthy=sorted(self.health.unhealthy()),
        )
        self._health_changed()
        if event.problem == "gpu-lost":
            self._spawn(self._node_event("GPULost", f"GPU {event.uuid} is lost"))

    def _agent_runs(self, other: Publisher) -> bool:
        """Whether the agent pod ``other`` (a newer one on this node) still serves the kubelet:
        its registration socket answers. A pod removed (a surge update rolled back) took its
        socket along; one killed left a socket that refuses connections."""
        try:
            paths = socket_paths(
                self.driver, self.settings.registry_dir, self.settings.plugins_dir, other.id
            )
        except ValueError:
            return True  # cannot tell: keep leaving the pool to it
        return answers(paths.registration)

    def on_recovered(self, source: str, cleared: dict[str, str]) -> None:
        """A re-check found ``source`` healthy: untaint its devices and say so on the Node."""
        log.info(
            "device healthy again after re-check",
            uuid=source,
            devices=sorted(cleared),
            unhealthy=sorted(self.health.unhealthy()),
        )
        self._health_changed()
        was = "; ".join(sorted(set(cleared.values())))
        self._spawn(
            self._node_event(
                "DeviceRecovered",
                f"{', '.join(sorted(cleared))} healthy again after re-check of {source} "
                f"(was: {was}); schedulable again",
            )
        )

    def on_carve_failed(self, gpus: tuple[str, ...], message: str) -> None:
        """Creating MIG devices failed before binding: keep new claims off those GPUs (a
        ``mig-failed`` taint) until a re-check after ``--mig-failure-hold``."""
        hold = self.settings.mig_failure_hold
        self._keep_off(
            gpus,
            HealthEvent("", "mig-failed", message=message, hold=hold),
            "MIGCreateFailed",
            f"creating a MIG device failed; no new MIG devices there for {hold:g}s",
        )

    def on_no_placement(self, gpus: tuple[str, ...], message: str) -> None:
        """A share of MIG slices fit by count but not by position: keep new claims off the
        GPU (a ``mig-fragmented`` taint) for :data:`FRAGMENTED_HOLD` seconds, so the
        scheduler, which only counts, places the pod elsewhere instead of here again."""
        self._keep_off(
            gpus,
            # The hold keeps a re-check (which finds the GPU healthy) from clearing it
            # before _unfragment_later does when the re-check interval is shorter.
            HealthEvent("", "mig-fragmented", message=message, hold=FRAGMENTED_HOLD),
            "MIGNoPlacement",
            f"the slices fit but no placement is free; no new claims there for "
            f"{FRAGMENTED_HOLD:g}s",
        )
        for uuid in gpus:
            self._spawn(self._unfragment_later(uuid))

    async def _unfragment_later(self, uuid: str) -> None:
        await asyncio.sleep(FRAGMENTED_HOLD)
        if self.health.clear(uuid, "mig-fragmented"):
            log.info("GPU schedulable again after no MIG placement was free", uuid=uuid)
            self._health_changed()

    def _keep_off(self, gpus: tuple[str, ...], event: HealthEvent, reason: str, what: str) -> None:
        """Taint ``gpus`` with ``event``'s problem; one Node Event per newly tainted GPU."""
        now = time.monotonic()
        for uuid in gpus:
            if not self.health.apply(dataclasses.replace(event, uuid=uuid), now):
                continue
            log.warning(f"{what}: GPU tainted", uuid=uuid, error=event.message)
            self._spawn(self._node_event(reason, f"GPU {uuid}: {what}: {event.message}"))
        self._health_changed()

    def _health_changed(self) -> None:
        metrics.UNHEALTHY_DEVICES.set(len(self.health.unhealthy()))
        try:
            # No fsync: a crash of the machine resets its GPUs too.
            write_atomic(self._health_file, self.health.saved(), sync=False)
        except OSError as exc:
            log.warning("health conditions not saved for the next agent", error=error_text(exc))
        self._spawn(self.publish())
        self._spawn(self.broadcaster.publish(self.health.device_health(self.node)))

    async def _watch_health(self) -> None:
        if self.settings.backend == "simulated":
            await watch_injected(self.state.state_dir / INJECT_FILE, self.on_health_event)
            return
        watcher = NvmlEventWatcher(
            [g.uuid for g in self.inventory.gpus],
            self.on_health_event,
            asyncio.get_running_loop(),
            # Dynamic MIG reuses GPU instance ids for new MIG devices: its events stay the
            # GPU's (every placement inherits them), as the tracker cannot name new devices.
            {} if self.settings.dynamic_mig else mig_instances(self.inventory),
        )
        watcher.start()
        try:
            # Ends (raises) with the event thread: supervision then restarts the watch, and a
            # watch that cannot stay up stops beating, which fails liveness.
            await watcher.ended()
        finally:
            watcher.stop()

    def _prober(self) -> Prober:
        if self.settings.backend == "simulated":
            return InjectedProber(self.state.state_dir / INJECT_FILE)
        return NvmlProber()

    async def _recheck_health(self) -> None:
        await recheck_forever(
            self.health,
            self._prober(),
            self.settings.health_recheck_interval,
            self.on_recovered,
        )

    async def _under_node_lock(self, work: Callable[[], Awaitable[None]]) -> None:
        async with self.plugin.lock.hold():
            await work()

    async def _prepare_before_binding(self) -> None:
        watcher = BindingWatcher(
            self.client,
            self.plugin_driver,
            driver_name=self.driver,
            pool=self.node,
            locked=self._under_node_lock,
        )
        await watcher.run()

    def background_loops(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """The loops the agent runs beside the kubelet plugin, by name (each supervised)."""
        loops: dict[str, Callable[[], Awaitable[None]]] = {
            "publisher": self.slices.run,
            "claim-reporter": self.reporter.run,
            "health": self._watch_health,
            "health-recheck": self._recheck_health,
        }
        if self.publishing.binding:
            loops["claim-binding"] = self._prepare_before_binding
        return loops

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (the plugin is already serving); slices and prepared
        claims stay in place afterwards."""
        if self.state.corrupt is not None:
            await self._node_event(
                "CheckpointCorrupt", f"{self.state.corrupt}; rebuilt from the claims' CDI specs"
            )
        metrics.KEPT_DEVICES.set(len(self.state.kept))
        if self.state.kept:
            await self._node_event(
                "DevicesKept",
                "kept, since nothing proves them unused: " + ", ".join(self.state.kept),
            )
        await self.publish()
        liveness = None
        if self.settings.health_port:
            liveness = await serve_liveness(
                self.plugin.paths, self.settings.health_port, check=self.heartbeats.problem
            )
        log.info(
            "kubelet plugin serving",
            driver=self.driver,
            prepared_claims=self.state.prepared_count(),
            gpus=len(self.inventory.gpus),
        )
        background: list[asyncio.Task[None]] = []
        if await _await_registration(self.plugin, REGISTRATION_GRACE, stop):
            background = [
                asyncio.create_task(supervise(name, loop, self.heartbeats), name=name)
                for name, loop in self.background_loops().items()
            ]
            await stop.wait()
        log.info("stopping: slices stay published, prepared claims stay prepared")
        # The kubelet's calls in flight finish first (the plugin's grace), while the API
        # client they read claims with and the claim reporter still run.
        await self.plugin.stop()
        for task in background + list(self._tasks):
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.reporter.flush(STATUS_FLUSH)
        if liveness is not None:
            await liveness.stop(1.0)


def read_health_file(path: Path) -> dict[str, Any]:
    """The health conditions an earlier agent saved (nothing when unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


async def _await_registration(plugin: Plugin, grace: float, stop: asyncio.Event) -> bool:
    """Publish only once the kubelet can prepare what the scheduler allocates, within reason.

    Pods scheduled onto devices before the kubelet knows the plugin fail their first prepare;
    waiting a moment avoids that. A kubelet that never registers the plugin must not keep the
    devices unpublished forever, so after ``grace`` seconds the agent publishes anyway. A stop
    (SIGTERM) ends the wait at once: False then, True otherwise.
    """
    if stop.is_set():  # stopped while the state was loading: no loops to start
        return False
    if not await until_stopped(plugin.registered.wait(), stop, grace):
        if stop.is_set():
            return False
        log.warning("kubelet has not registered the plugin yet; publishing anyway", waited_s=grace)
    return True


async def until_stopped(
    work: Awaitable[Any], stop: asyncio.Event, within: float | None = None
) -> bool:
    """Await ``work`` unless ``stop`` is set or ``within`` seconds pass; True if it finished.

    Unfinished work is cancelled.
    """
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.done() and not task.cancelled():
        task.result()  # raises what the work raised
        return True
    return False


async def serve(
    settings: Settings,
    connection: Connection,
    plugin: Plugin,
    parts: LateParts,
    stop: asyncio.Event,
) -> None:
    """With ``plugin`` bound: reach the API server, discover, recover the node's state, then
    serve the kubelet's held and later calls and publish slices until ``stop`` is set.

    Nothing on the node changes (no checkpoint, no MIG device) before the API server has
    answered.
    """
    client = KubeClient(connection, observer=metrics.observe_api_request)
    try:
        if not await until_stopped(reach_api_server(client, settings.node_name), stop):
            return
        discovery = make_discovery(
            settings.backend,
            node_name=settings.node_name,
            profile=settings.profile,
            driver_root=settings.driver_root,
        )
        inventory = await discover_async(discovery)
        if stop.is_set():  # SIGTERM while NVML initialised: change nothing on the node
            return
        mig = await asyncio.to_thread(build_mig, settings, inventory)
        # The MIG backend keeps the whole inventory; the catalogue only the chosen profiles.
        inventory = published_inventory(inventory, settings.dynamic_mig, settings.mig_profiles)
        evidence = await ask_api(client, settings)
        if stop.is_set():
            return
        state = await asyncio.to_thread(build_state, settings, inventory, mig, evidence)
        publisher = await asyncio.to_thread(
            register_publisher, state_dir(settings), settings.pod_uid or None
        )
        if settings.metrics_port:
            metrics.serve(settings.metrics_port, settings.driver_name)
        agent = NodeAgent(settings, inventory, state, client, mig, publisher, plugin, parts)
        await agent.run(stop)
    finally:
        await client.close()
