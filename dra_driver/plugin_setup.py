"""The agent's kubelet plugin, built from its settings (served by parts attached later)."""

from __future__ import annotations

from dra_driver.bindsettings import SocketSettings
from dra_driver.kubeletplugin.late import LateParts
from dra_driver.kubeletplugin.plugin import Plugin, PluginConfig


def kubelet_plugin(settings: SocketSettings, parts: LateParts) -> Plugin:
    """The agent's kubelet plugin, served by ``parts`` once they are attached."""
    return Plugin(
        PluginConfig(
            driver_name=settings.driver_name,
            node_name=settings.node_name,
            registry_dir=settings.registry_dir,
            plugins_dir=settings.plugins_dir,
            pod_uid=settings.pod_uid or None,
        ),
        parts,
        parts,
        health=parts,
        on_registered=parts.registered,
    )
