"""What the node agent checks before it changes anything on the node.

A wrong setting or a missing kubeconfig must end the agent before it destroys a MIG device,
writes the checkpoint or creates a directory: a crash-looping pod would otherwise repeat those
changes on every restart. These checks only read, and load little: they run before the agent
binds the kubelet's sockets, which it does before loading the rest of itself.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.bindsettings import directory_problem, flag_name
from dra_driver.gpu.publish.overhead import OverheadError, parse_overhead
from dra_driver.gpu.publish.profiles import ProfileListError, parse_profiles
from dra_driver.gpu.sharing.selection import SelectionError, parse_selection
from dra_driver.gpu.state import CHECKPOINT_FILE
from dra_driver.settings import Settings, SettingsError


def state_dir(settings: Settings) -> Path:
    """Where the node's checkpoint and the driver's own files live."""
    return settings.plugins_dir / settings.driver_name


def check_settings(settings: Settings) -> None:
    """Check what the settings model cannot: the node name and the directories (read only)."""
    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")
    for field in ("cdi_root", "plugins_dir", "registry_dir"):
        problem = directory_problem(getattr(settings, field), flag_name(field))
        if problem:
            raise SettingsError(problem)
    try:
        parse_selection(settings.shared_gpus)
        parse_profiles(settings.mig_profiles)
        parse_overhead(settings.node_overhead)
    except (SelectionError, ProfileListError, OverheadError) as exc:
        raise SettingsError(str(exc)) from None
    checkpoint = state_dir(settings) / CHECKPOINT_FILE
    if checkpoint.is_dir():
        raise SettingsError(f"checkpoint {checkpoint} is a directory; move it away")
