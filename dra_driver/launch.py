"""``dra-driver run``: bind the kubelet's sockets first, then load the agent and serve.

The kubelet registers a plugin as soon as its registration socket appears; everything else
at start-up (the settings model, the kubeconfig, discovery, the checkpoint, the API server's
list of claims, the slice publisher) takes longer. So the agent binds the sockets with the
few settings they need, checked as the full settings would check them
(:mod:`dra_driver.bindsettings`), and only then imports and loads the rest. Calls that arrive
meanwhile wait in :class:`LateParts` until the node's state is loaded.

Nothing on the node but the sockets changes before the full settings and the kubeconfig are
checked; when they fail, the sockets go again and the agent exits with the message. This
module imports little on purpose: what it imports is paid before the sockets exist.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from dra_driver.bindsettings import SocketSettings
from dra_driver.errors import StartError
from dra_driver.kubeletplugin.late import LateParts
from dra_driver.plugin_setup import kubelet_plugin

if TYPE_CHECKING:
    from dra_driver.kubeconfig import Connection
    from dra_driver.settings import Settings

#: The checked settings and the API server's credentials.
Loaded = tuple["Settings", "Connection"]


def run_bound_first(early: SocketSettings, read: Callable[[], Settings]) -> int:
    """Run the agent whose socket settings are ``early``: bind, then ``read`` the full
    settings (which must name the same sockets), check them and read the kubeconfig."""

    def load() -> Loaded:
        settings = read()
        if SocketSettings.of(settings) != early:
            # The two readings of one command line differ: a defect, never a guess.
            raise StartError(
                f"the settings read before binding ({early}) differ from the full settings "
                f"({SocketSettings.of(settings)})"
            )
        return _checked(settings)

    return asyncio.run(_serve(early, load))


async def run_checked_agent(settings: Settings) -> int:
    """Run the agent with ``settings``, checked with the kubeconfig before anything binds."""
    loaded = await asyncio.to_thread(_checked, settings)
    return await _serve(SocketSettings.of(settings), lambda: loaded)


def _checked(settings: Settings) -> Loaded:
    """The settings once checked against the node, with the kubeconfig's credentials
    (blocking: an exec credential plugin runs once here and may take seconds)."""
    from dra_driver.kubeconfig import load_connection
    from dra_driver.startup import check_settings

    check_settings(settings)
    return settings, load_connection(settings.kubeconfig)


async def _serve(early: SocketSettings, load: Callable[[], Loaded]) -> int:
    """Bind the kubelet plugin's sockets, then ``load`` (in a thread, so the kubelet's calls
    are answered meanwhile), reach the API server, discover, recover the node's state, and
    serve the kubelet and publish slices until SIGTERM/SIGINT."""
    structlog.contextvars.bind_contextvars(node=early.node_name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parts = LateParts()
    async with kubelet_plugin(early, parts) as plugin:
        # Calls held for the state get this answer if it is never loaded; before the
        # plugin stops, so that they do not wait out its stop grace to be cancelled.
        never = f"the {early.driver_name} node agent is stopping before it loaded the node's state"
        try:
            settings, connection = await asyncio.to_thread(load)
            from dra_driver.agent import serve  # the rest of the agent, loaded after the bind

            await serve(settings, connection, plugin, parts, stop)
        except Exception as exc:
            never = f"the {early.driver_name} node agent failed to start: {exc}"
            raise
        finally:
            if not parts.ready:
                parts.fail(never)
    return 0
