"""``dra-driver run``: bind the kubelet's sockets first, then load the agent and serve.

The kubelet registers a plugin as soon as its registration socket appears; everything else
at start-up (discovery, the checkpoint, the API server's list of claims, the slice publisher)
takes longer. So the agent checks its settings and reads its kubeconfig (both only read),
binds the sockets, and only then imports and loads the rest. Calls that arrive meanwhile wait
in :class:`LateParts` until the node's state is loaded. This module imports little on
purpose: what it imports is paid before the socket exists.
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from dra_driver.kubeconfig import load_connection
from dra_driver.kubeletplugin.late import LateParts
from dra_driver.plugin_setup import kubelet_plugin
from dra_driver.settings import Settings
from dra_driver.startup import check_settings


async def run_agent(settings: Settings) -> int:
    """Check the settings and the kubeconfig, bind the kubelet plugin's sockets, then reach
    the API server, discover, recover the node's state, and serve the kubelet and publish
    slices until SIGTERM/SIGINT.

    Nothing on the node changes (no directory, no checkpoint, no MIG device) before the
    settings and the kubeconfig are checked, and nothing but the sockets before the API
    server has answered.
    """
    check_settings(settings)
    structlog.contextvars.bind_contextvars(node=settings.node_name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # In a thread: an exec credential plugin runs once here and may take seconds.
    connection = await asyncio.to_thread(load_connection, settings.kubeconfig)
    parts = LateParts()
    async with kubelet_plugin(settings, parts) as plugin:
        from dra_driver.agent import serve  # the rest of the agent, loaded after the bind

        await serve(settings, connection, plugin, parts, stop)
    return 0
