"""The node side of ComputeDomains, by tables: claims read, specs built, devices published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.channels import (
    NO_CLIQUE,
    DaemonEdits,
    capability_node,
    claim_spec,
)
from dra_driver.computedomain.claimconfig import ImexClaim, ImexClaimError, read_claim
from dra_driver.computedomain.nodedevices import imex_devices
from dra_driver.computedomain.nodedriver import condition_status, daemon_state
from dra_driver.computedomain.nodestate import Checkpoint, PreparedClaim, load, save
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.cdi_schema import schema_errors

DRIVER = "compute-domain.gpu.dra.dev"
UID = "0b9c7e3a-0000-4000-8000-00000000000a"
REF = ClaimRef("team", "worker-channel", "c1")


def claim(device: str, parameters: Any, requests: tuple[str, ...] = ("channel",)) -> ClaimToPrepare:
    config = (
        ({"requests": list(requests), "opaque": {"driver": DRIVER, "parameters": parameters}},)
        if parameters is not None
        else ()
    )
    return ClaimToPrepare(
        ref=REF,
        claim={},
        results=({"request": "channel", "driver": DRIVER, "pool": "n", "device": device},),
        config=config,
    )


def channel_params(**over: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": UID,
        "allocationMode": "Single",
        "channel": 3,
        **over,
    }


def test_a_channel_claim_reads_its_domain_and_channel() -> None:
    assert read_claim(claim("channel-0", channel_params()), DRIVER) == ImexClaim(
        "channel", UID, ("channel-0",), ("channel",), channel=3
    )
    every = read_claim(claim("channel-0", channel_params(allocationMode="All")), DRIVER)
    assert every.all_channels
    daemon = {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "ComputeDomainDaemonConfig",
        "domainID": UID,
    }
    assert read_claim(claim("daemon-0", daemon), DRIVER).kind == "daemon"


@pytest.mark.parametrize(
    ("device", "parameters", "message"),
    [
        ("channel-0", None, "through a ComputeDomain's ResourceClaimTemplate"),
        ("gpu-0", channel_params(), "'gpu-0' is not published by this node"),
        ("channel-0", channel_params(channel=2048), "field 'channel'"),
        ("channel-0", channel_params(domainID=""), "field 'domainID'"),
        ("channel-0", channel_params(extra=1), "field 'extra': unknown field"),
        ("channel-0", channel_params(allocationMode="Many"), "field 'allocationMode'"),
        ("channel-0", {**channel_params(), "kind": "GpuConfig"}, "kind 'GpuConfig' is not"),
        (
            "channel-0",
            channel_params(apiVersion="resource.nvidia.com/v1beta1"),
            "field 'apiVersion'",
        ),
        ("daemon-0", channel_params(), "applies to channel-0, not daemon-0"),
    ],
)
def test_a_claim_the_node_cannot_serve_says_what_to_fix(
    device: str, parameters: Any, message: str
) -> None:
    with pytest.raises(ImexClaimError) as err:
        read_claim(claim(device, parameters), DRIVER)
    assert message in str(err.value)
    assert "team/worker-channel" in str(err.value)


def test_a_config_for_another_request_does_not_apply() -> None:
    with pytest.raises(ImexClaimError, match="no ComputeDomainChannelConfig"):
        read_claim(claim("channel-0", channel_params(), requests=("other",)), DRIVER)


DAEMON = ImexClaim("daemon", UID, ("daemon-0",), ("daemon",))
IN_CLIQUE = DaemonEdits("c.1", capability_node(508, 4095))


@pytest.mark.parametrize(
    ("imex", "major", "daemon", "nodes", "env_has"),
    [
        (
            ImexClaim("channel", UID, ("channel-0",), ("channel",), channel=3),
            234,
            IN_CLIQUE,  # for the daemon only
            [("/dev/nvidia-caps-imex-channels/channel3", 234, 3)],
            {"NVIDIA_IMEX_CHANNELS": "3", "CLIQUE_ID": None},
        ),
        (
            ImexClaim("channel", UID, ("channel-0",), ("channel",), all_channels=True),
            234,
            NO_CLIQUE,
            [(f"/dev/nvidia-caps-imex-channels/channel{c}", 234, c) for c in range(2048)],
            {"NVIDIA_IMEX_CHANNELS": "all"},
        ),
        # No NVLink fabric: the environment, no device node.
        (
            ImexClaim("channel", UID, ("channel-0",), ("channel",), channel=3),
            None,
            NO_CLIQUE,
            [],
            {"NVIDIA_IMEX_CHANNELS": "3"},
        ),
        # The daemon of a node in a clique: its clique and the fabric-imex-mgmt capability
        # device nvidia-imex opens; never a channel.
        (
            DAEMON,
            234,
            IN_CLIQUE,
            [("/dev/nvidia-caps/nvidia-cap4095", 508, 4095)],
            {"CLIQUE_ID": "c.1", "NVIDIA_IMEX_CHANNELS": None},
        ),
        # In a clique, but the capability could not be read: the clique, no device.
        (DAEMON, 234, DaemonEdits("c.1"), [], {"CLIQUE_ID": "c.1"}),
        # In no clique: an empty CLIQUE_ID (the daemon runs no nvidia-imex), no device.
        (DAEMON, None, NO_CLIQUE, [], {"CLIQUE_ID": "", "NVIDIA_IMEX_CHANNELS": None}),
    ],
)
def test_claim_spec(
    imex: ImexClaim,
    major: int | None,
    daemon: DaemonEdits,
    nodes: list[tuple[str, int, int]],
    env_has: dict[str, str | None],
) -> None:
    spec = claim_spec(DRIVER, "c1", imex, "team/train", major, daemon).to_json()
    assert schema_errors(spec) == []
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    [device] = spec["devices"]
    assert device["name"] == f"c1-{imex.devices[0]}"
    edits = device["containerEdits"]
    got = [(n["path"], n["major"], n["minor"]) for n in edits.get("deviceNodes", [])]
    assert got == nodes
    assert all(n["type"] == "c" for n in edits.get("deviceNodes", []))
    env = dict(e.split("=", 1) for e in edits["env"])
    assert env["COMPUTE_DOMAIN_UID"] == UID and env["COMPUTE_DOMAIN"] == "team/train"
    assert {k: env.get(k) for k in env_has} == env_has


def test_devices_published_with_and_without_binding_conditions() -> None:
    plain = imex_devices(DRIVER, "c.1", binding=False)
    assert [d["name"] for d in plain] == ["channel-0", "daemon-0"]
    assert plain[0]["attributes"] == {
        "type": {"string": "channel"},
        "id": {"int": 0},
        "cliqueId": {"string": "c.1"},
    }
    assert "bindingConditions" not in plain[0]
    gated = imex_devices(DRIVER, None, binding=True)
    assert gated[0]["bindingConditions"] == ["IMEXDaemonReady"]
    assert gated[0]["bindingFailureConditions"] == ["IMEXDaemonFailed"]
    assert "bindingConditions" not in gated[1]  # the daemon itself never waits
    assert "cliqueId" not in gated[0]["attributes"]


@pytest.mark.parametrize(
    ("status", "ready", "failed", "said"),
    [
        (None, False, True, "the domain is gone"),
        ({}, False, False, "not in the domain's status yet"),
        ({"nodes": [{"name": "other", "status": "Ready"}]}, False, False, "not in the domain's"),
        ({"nodes": [{"name": "n", "status": "NotReady"}]}, False, False, "node n: NotReady"),
        ({"nodes": [{"name": "n", "status": "Ready"}]}, True, False, "node n: Ready"),
        # The daemon's pod says why it does not run: no use waiting for it.
        (
            {"nodes": [{"name": "n", "status": "NotReady", "message": "CrashLoopBackOff: x"}]},
            False,
            True,
            "node n: NotReady, CrashLoopBackOff: x",
        ),
    ],
)
def test_daemon_state(status: dict[str, Any] | None, ready: bool, failed: bool, said: str) -> None:
    domain = None if status is None else {"status": status}
    state = daemon_state(domain, "n")
    assert (state.ready, state.failed) == (ready, failed)
    assert said in state.said


def test_condition_status_names_one_device() -> None:
    body = condition_status(REF, DRIVER, "n", "channel-0", "IMEXDaemonReady", "ready", "T")
    [entry] = body["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, "n", "channel-0")
    assert entry["conditions"][0]["type"] == "IMEXDaemonReady"
    assert entry["conditions"][0]["reason"] == "DaemonReady"
    assert body["metadata"] == {"name": "worker-channel", "namespace": "team", "uid": "c1"}


def test_checkpoint_round_trip_and_a_corrupt_one_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "imex-claims.json"
    assert load(path, Checkpoint) == Checkpoint()
    record = PreparedClaim(
        namespace="team",
        name="w",
        kind="channel",
        domain=UID,
        devices=["channel-0"],
        requests=["channel"],
        cdi_ids=["k8s.x/claim=c1-channel-0"],
    )
    save(path, Checkpoint(claims={"c1": record}))
    assert load(path, Checkpoint).claims["c1"] == record
    path.write_text(json.dumps({"version": 9}))
    assert load(path, Checkpoint) == Checkpoint()
    assert (tmp_path / "imex-claims.json.corrupt").read_text() == '{"version": 9}'
