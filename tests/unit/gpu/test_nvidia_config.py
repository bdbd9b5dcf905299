"""The NVIDIA DRA driver's opaque config API (resource.nvidia.com/v1beta1) in compat mode:
accepted only there, read as that driver reads it, and carried to the MPS daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.config import OWN_API, ConfigError, ConfigKinds, parse_config
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.nvidia_config import (
    NvidiaGpuConfig,
    NvidiaMigDeviceConfig,
    config_apis,
)
from dra_driver.gpu.sharing.mps import config_limits
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.settings import Settings

NVIDIA = config_apis("nvidia")
API = "resource.nvidia.com/v1beta1"


def _mps(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": fields},
    }


def test_the_nvidia_api_is_accepted_only_in_compat_mode() -> None:
    params = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    assert isinstance(parse_config(params, where="c", apis=NVIDIA), NvidiaGpuConfig)
    with pytest.raises(ConfigError, match=r"apiVersion 'resource.nvidia.com/v1beta1' is not"):
        parse_config(params, where="c", apis=OWN_API)
    assert config_apis("") is OWN_API
    # Ours stays accepted in compat mode (a later move to this driver's names).
    ours = {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "MigDeviceConfig"}
    assert parse_config(ours, where="c", apis=NVIDIA).kind == "MigDeviceConfig"
    mig = {**ours, "apiVersion": API, "sharing": {"strategy": "TimeSlicing"}}
    assert isinstance(parse_config(mig, where="c", apis=NVIDIA), NvidiaMigDeviceConfig)


@pytest.mark.parametrize(
    ("fields", "nvidia_ok", "ours_ok"),
    [
        ({"defaultActiveThreadPercentage": 0}, True, False),
        ({"defaultActiveThreadPercentage": 100}, True, True),
        ({"defaultActiveThreadPercentage": 101}, False, False),
        # A resource.Quantity decodes a JSON number of bytes too; ours takes strings only.
        ({"defaultPinnedDeviceMemoryLimit": 1073741824}, True, False),
        ({"defaultPinnedDeviceMemoryLimit": 1.5e9}, True, False),
        ({"defaultPinnedDeviceMemoryLimit": 1024}, False, False),
        ({"defaultPinnedDeviceMemoryLimit": True}, False, False),
        ({"defaultPerDevicePinnedMemoryLimit": {"0": 5368709120}}, True, False),
        ({"defaultPerDevicePinnedMemoryLimit": {"0": 0.5}}, False, False),
        # Go decodes null into a map as an empty one.
        ({"defaultPerDevicePinnedMemoryLimit": None}, True, False),
        ({"defaultPinnedDeviceMemoryLimit": "8Ti"}, True, False),
        ({"defaultPinnedDeviceMemoryLimit": "512Ki"}, False, False),
        ({"defaultPerDevicePinnedMemoryLimit": {"0": "16Ti"}}, True, False),
        ({"multiUser": True}, True, False),
        ({"multiUser": "yes"}, False, False),
        ({"multiuser": True}, False, False),
    ],
)
def test_mps_fields_are_read_as_the_nvidia_driver_reads_them(
    fields: dict[str, Any], nvidia_ok: bool, ours_ok: bool
) -> None:
    for params, ok, apis in (
        (_mps(**fields), nvidia_ok, NVIDIA),
        ({**_mps(**fields), "apiVersion": "gpu.dra.dev/v1alpha1"}, ours_ok, NVIDIA),
    ):
        if ok:
            parse_config(params, where="claim ns/c", apis=apis)
        else:
            with pytest.raises(ConfigError, match=r"claim ns/c: field 'sharing.mpsConfig"):
                parse_config(params, where="claim ns/c", apis=apis)


def test_multi_user_and_numeric_limits_reach_the_daemon() -> None:
    config = parse_config(
        _mps(multiUser=True, defaultPinnedDeviceMemoryLimit="1Gi"), where="c", apis=NVIDIA
    )
    assert config.sharing is not None and config.sharing.mps_config is not None
    limits = config_limits([(0, "GPU-1", config.sharing.mps_config)])
    assert limits.multi_user and limits.pinned_memory == ((0, "1024M"),)


def test_compat_mode_names_the_driver_as_the_nvidia_driver() -> None:
    assert Settings(compat="nvidia").driver_name == "gpu.nvidia.com"
    assert Settings().driver_name == "gpu.dra.dev"
    with pytest.raises(ValueError, match=r"publishes as gpu\.nvidia\.com"):
        Settings(compat="nvidia", driver_name="example.com")


def test_a_claim_with_the_nvidia_config_is_prepared_in_compat_mode(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")

    def state(apis: ConfigKinds) -> DeviceState:
        return DeviceState(
            inventory=SimulatedDiscovery("l4x4", "node-1").discover(),
            driver_name="gpu.nvidia.com",
            node_name="node-1",
            cdi_root=tmp_path / "cdi",
            state_dir=tmp_path / "plugin",
            boot_id="boot-1",
            sharing=sim,
            config_apis=apis,
        )

    config = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": _mps(multiUser=True)}}
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
    uid = "0a0a0a0a-0000-4000-8000-00000000000a"
    claim = ClaimToPrepare(ClaimRef("ns", "c", uid), {}, (result,), (config,))
    refused = state(OWN_API).prepare([claim])[uid]
    assert isinstance(refused, ConfigError) and "resource.nvidia.com/v1beta1" in str(refused)
    assert isinstance(state(NVIDIA).prepare([claim])[uid], list)
    (daemon,) = sim.read().mps.values()
    assert daemon.state == "running" and daemon.multi_user


def test_nvidia_config_errors_name_no_python_class() -> None:
    params = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": "on"},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(params, where="claim ns/c", apis=config_apis("nvidia"))
    text = str(info.value)
    assert "field 'sharing.mpsConfig': must be an object" in text, text
    assert "NvidiaMpsConfig" not in text, text


@pytest.mark.parametrize(
    "sharing",
    [
        {"strategy": "MPS", "mps_config": {}},
        {"strategy": "MPS", "mpsConfig": {"multi_user": True}},
        {"strategy": "MPS", "mpsConfig": {"default_active_thread_percentage": 50}},
        {"strategy": "TimeSlicing", "time_slicing_config": {"interval": "Long"}},
    ],
)
@pytest.mark.parametrize("api", [API, "gpu.dra.dev/v1alpha1"])
def test_field_names_are_the_json_names_only(sharing: dict[str, Any], api: str) -> None:
    # The NVIDIA driver decodes strictly and case-sensitively: a field not spelled as in its
    # JSON (the Python attribute name of our models, say) is unknown, as the admission
    # policy says too.
    params = {"apiVersion": api, "kind": "GpuConfig", "sharing": sharing}
    with pytest.raises(ConfigError, match=r"claim ns/c: field 'sharing\..*': unknown field"):
        parse_config(params, where="claim ns/c", apis=NVIDIA)
