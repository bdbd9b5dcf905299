"""``dra-driver compute-domain-controller``: the controller's process, until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import uuid

import structlog

from dra_driver import exitcodes
from dra_driver.computedomain.api import names_for
from dra_driver.computedomain.controller import run_controller
from dra_driver.computedomain.objects import DaemonSettings
from dra_driver.kube import KubeClient
from dra_driver.leaderelection import LostLease
from dra_driver.settings import Settings, SettingsError

log = structlog.get_logger(__name__)


def daemon_settings(settings: Settings) -> DaemonSettings:
    """How the controller runs IMEX daemons, from its settings (both must be given)."""
    missing = [
        flag
        for flag, value in (
            ("--namespace", settings.namespace),
            ("--imex-image", settings.imex_image),
        )
        if not value
    ]
    if missing:
        raise SettingsError(
            f"{' and '.join(missing)} required: the namespace the controller runs in (the "
            "chart sets it from the pod) and the image of the IMEX daemons (the driver's)"
        )
    return DaemonSettings(
        namespace=settings.namespace,
        image=settings.imex_image,
        pull_policy=settings.imex_pull_policy,
        pull_secrets=tuple(n for n in settings.imex_pull_secrets.split(",") if n),
        driver_root=str(settings.host_driver_root),
        log_format=settings.log_format,
        compat=settings.compat,
    )


async def run_controller_process(settings: Settings) -> int:
    """Run the controller under leader election until SIGTERM/SIGINT (0) or until the
    lease is lost (1: the Deployment starts a fresh replica, which waits its turn)."""
    daemons = daemon_settings(settings)
    names = names_for(settings.compat)
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = await KubeClient.create(settings.kubeconfig, context=settings.context)
    log.info("compute domain controller starting", group=names.api_version, identity=identity)
    work = asyncio.ensure_future(run_controller(client, names, daemons, identity=identity))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return exitcodes.OK
        work.result()
        return exitcodes.OK
    except LostLease as exc:
        log.error("stopping: lost the leader lease", error=str(exc))
        return exitcodes.ERROR
    finally:
        stopped.cancel()
        await client.close()
