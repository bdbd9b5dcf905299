"""The pure planner: conflict checks by table, no files and no GPUs."""

from __future__ import annotations

import pytest

from dra_driver.gpu.config import ConfigError
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.nvidia_config import config_apis
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.state.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from dra_driver.gpu.state.planner import (
    ClaimError,
    check_free,
    check_gpu_free,
    holders,
    plan_claim,
    shared_devices,
)
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.kubeletplugin.uid import valid_uid

REF = ClaimRef("ns", "mine", "uid-mine")


def _rec(name: str, sharing: str | None = None, share: bool = False) -> DeviceRecord:
    return DeviceRecord(
        request_names=["r"],
        pool_name="n",
        device_name=name,
        sharing=sharing,
        share_id="s1" if share else None,
        consumed_capacity={"memory": "1073741824"} if share else None,
    )


def _claims(**devices: DeviceRecord) -> dict[str, ClaimRecord]:
    return {
        uid: ClaimRecord(state=ClaimState.PREPARE_COMPLETED, namespace="ns", name=uid, devices=[d])
        for uid, d in devices.items()
    }


@pytest.mark.parametrize(
    ("theirs", "mine", "refused"),
    [
        (None, _rec("gpu-0"), False),  # nothing prepared
        (_rec("gpu-1"), _rec("gpu-0"), False),  # another device
        (_rec("gpu-0"), _rec("gpu-0"), True),  # the same device, exclusively
        (_rec("gpu-0", sharing="admin"), _rec("gpu-0"), False),  # admin access takes nothing
        (_rec("gpu-0"), _rec("gpu-0", sharing="admin"), False),
        (_rec("gpu-0", share=True), _rec("gpu-0", share=True), False),  # shares coexist
        (_rec("gpu-0", share=True), _rec("gpu-0"), True),  # a share and an exclusive claim
        (_rec("gpu-0"), _rec("gpu-0", share=True), True),
    ],
)
def test_check_free(theirs: DeviceRecord | None, mine: DeviceRecord, refused: bool) -> None:
    claims = _claims(other=theirs) if theirs else {}
    held, shared = holders(claims), shared_devices(claims)
    if refused:
        with pytest.raises(ClaimError, match="already prepared for claim ns/other"):
            check_free(REF, [mine], held, shared, claims)
    else:
        check_free(REF, [mine], held, shared, claims)


@pytest.mark.parametrize(
    ("theirs", "mine", "refused"),
    [
        ("gpu-2", "gpu-3", False),  # two whole GPUs
        ("gpu-2", "gpu-2-mig-1g10gb-19-6", True),  # the whole GPU excludes its placements
        ("gpu-2-mig-1g10gb-19-6", "gpu-2", True),
        ("gpu-2-mig-1g10gb-19-6", "gpu-2-mig-1g10gb-19-5", False),  # disjoint placements
        ("gpu-2-mig-3g40gb-9-4", "gpu-2-mig-1g10gb-19-6", True),  # overlapping placements
    ],
)
def test_check_gpu_free(theirs: str, mine: str, refused: bool) -> None:
    inventory = SimulatedDiscovery("mixed", "n").discover()  # gpu-2 is an H100, MIG off
    catalog = build_catalog(inventory, dynamic=True)
    assert catalog.get(theirs) is not None and catalog.get(mine) is not None
    claims = _claims(other=_rec(theirs))
    others = [(u, d) for u, r in claims.items() for d in r.devices]
    if refused:
        with pytest.raises(ClaimError, match=r"holds .* on the same GPU"):
            check_gpu_free(REF, [_rec(mine)], others, catalog, claims)
    else:
        check_gpu_free(REF, [_rec(mine)], others, catalog, claims)


@pytest.mark.parametrize(
    ("uid", "usable"),
    [("0b5e-uid", True), ("", False), (".", False), ("..", False), ("a/b", False), ("a\0", False)],
)
def test_usable_uid(uid: str, usable: bool) -> None:
    # The planner's own check is gone: the transaction uses the kubelet plugin's, the only one.
    assert valid_uid(uid) is usable


def _nvidia_config(kind: str, strategy: str, requests: list[str], source: str = "FromClaim") -> dict[str, object]:
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": {"strategy": strategy}}
    return {"source": source, "requests": requests, "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}


def test_a_first_available_claim_gets_the_config_of_the_kind_allocated() -> None:
    # firstAvailable: a whole GPU (subrequest "full") or else a MIG device ("mig"), with a
    # GpuConfig and a MigDeviceConfig both for the main request "gpu". The MIG device gets the
    # MigDeviceConfig; the GpuConfig is for the whole GPU it did not get.
    catalog = build_catalog(SimulatedDiscovery("mixed", "n").discover())
    configs = (
        _nvidia_config("GpuConfig", "MPS", ["gpu"]),
        _nvidia_config("MigDeviceConfig", "TimeSlicing", ["gpu"]),
    )
    result = {"request": "gpu/mig", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0-mig-1g10gb-19-6"}
    claim = ClaimToPrepare(REF, {}, (result,), configs)
    (device,) = plan_claim(claim, catalog, "gpu.nvidia.com", config_apis("nvidia")).devices
    assert device.config is not None and device.config.kind == "MigDeviceConfig"
    assert device.strategy == "TimeSlicing"
    # The class's config of the wrong kind, overridden by the claim's: no error, as in the
    # NVIDIA driver (only the config that wins must be of the device's kind).
    configs = (
        _nvidia_config("GpuConfig", "MPS", ["gpu/mig"], source="FromClass"),
        _nvidia_config("MigDeviceConfig", "MPS", ["gpu/mig"]),
    )
    claim = ClaimToPrepare(REF, {}, (result,), configs)
    (device,) = plan_claim(claim, catalog, "gpu.nvidia.com", config_apis("nvidia")).devices
    assert device.config is not None and device.config.kind == "MigDeviceConfig"
    assert device.strategy == "MPS"
    claim = ClaimToPrepare(REF, {}, (result,), configs[:1])
    with pytest.raises(ConfigError, match="GpuConfig cannot configure a mig device"):
        plan_claim(claim, catalog, "gpu.nvidia.com", config_apis("nvidia"))
