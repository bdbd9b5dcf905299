"""Start-up's witnesses beside the checkpoint: the API server's claims and the CDI specs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.state.evidence import (
    Allocated,
    ClaimInUse,
    Evidence,
    SpecOnDisk,
    claims_in_use,
    device_of,
    read_specs,
)

DRIVER, POOL = "gpu.dra.dev", "node-a"


def _claim(uid: str, *results: dict[str, Any], reserved: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(results)}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "x"}]
    return {"metadata": {"uid": uid, "namespace": "ns", "name": f"c-{uid}"}, "status": status}


def _result(device: str, pool: str = POOL, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, **extra}


def test_claims_in_use_keeps_this_pool_and_driver_only() -> None:
    items = [
        _claim("a", _result("gpu-0"), _result("gpu-1", pool="node-b")),
        _claim("b", _result("gpu-2", driver="other.dev")),
        _claim("c", _result("gpu-3", adminAccess=True, shareID="s1"), reserved=False),
        {"metadata": "junk"},
        "junk",
        {"metadata": {"uid": "d"}, "status": {"allocation": {"devices": {"results": "x"}}}},
    ]
    found = claims_in_use(items, driver=DRIVER, pool=POOL)
    assert sorted(found) == ["a", "c"]
    assert found["a"].devices == frozenset({"gpu-0"}) and found["a"].reserved
    assert found["c"].results == (Allocated("gpu", "gpu-3", share_id="s1", admin=True),)
    assert not found["c"].reserved


@pytest.mark.parametrize(
    ("cdi_name", "expected"),
    [
        ("u1-gpu-0", ("gpu-0", None)),
        ("u1-gpu-0-mig-1g10gb-19-0", ("gpu-0-mig-1g10gb-19-0", None)),
        ("u1-gpu-1-share-7", ("gpu-1", "share-7")),
        ("u2-gpu-0", None),
        ("u1-tpu-0", None),
    ],
)
def test_device_of_takes_the_longest_known_name(
    cdi_name: str, expected: tuple[str, str | None] | None
) -> None:
    known = ["gpu-0", "gpu-1", "gpu-0-mig-1g10gb-19-0"]
    assert device_of(cdi_name, "u1", known) == expected


def test_read_specs_keeps_unreadable_specs_as_evidence(tmp_path: Path) -> None:
    prefix = "k8s.gpu.dra.dev-claim_"
    spec = {
        "devices": [{"name": "u1-gpu-0"}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1", "X=1"],
            "mounts": [{"hostPath": "/var/mps/gpu-0/pipe", "containerPath": "/tmp/nvidia-mps"}],
        },
    }
    (tmp_path / f"{prefix}u1.json").write_text(json.dumps(spec))
    (tmp_path / f"{prefix}u2.json").write_text("{truncated")
    (tmp_path / "other-vendor_u3.json").write_text("{}")
    specs = read_specs(tmp_path, prefix)
    assert sorted(specs) == ["u1", "u2"]
    assert specs["u1"] == SpecOnDisk("u1", ("u1-gpu-0",), ("GPU-1",), ("/var/mps/gpu-0/pipe",))
    assert specs["u2"].cdi_names == ()
    assert read_specs(tmp_path / "missing", prefix) == {}


def test_a_specs_device_mounts_are_evidence_too(tmp_path: Path) -> None:
    """MPS pipe and shm directories are mounted by the devices that use the daemon, not the
    claim (older specs mounted them claim-wide): both count."""
    prefix = "k8s.gpu.dra.dev-claim_"
    pipe = {"hostPath": "/var/mps/u1/pipe", "containerPath": "/tmp/nvidia-mps"}
    shm = {"hostPath": "/var/mps/u1/shm", "containerPath": "/dev/shm"}
    spec = {
        "devices": [
            {"name": "u1-gpu-0", "containerEdits": {"mounts": [pipe, shm]}},
            {"name": "u1-gpu-1", "containerEdits": {"mounts": [pipe, shm]}},
            {"name": "u1-gpu-2", "containerEdits": "junk"},
        ],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2,GPU-3"]},
    }
    (tmp_path / f"{prefix}u1.json").write_text(json.dumps(spec))
    (found,) = read_specs(tmp_path, prefix).values()
    assert found.host_paths == ("/var/mps/u1/pipe", "/var/mps/u1/shm")


def test_may_destroy_needs_every_witness() -> None:
    spec = SpecOnDisk("u1", ("u1-gpu-0-mig-a",), ("MIG-1",), ())
    api = {"u2": ClaimInUse("u2", "ns", "c", (Allocated("r", "gpu-0-mig-b"),), reserved=True)}
    evidence = Evidence(specs={"u1": spec}, api=api)
    assert not evidence.may_destroy("gpu-0-mig-b", None)  # the API server says a claim holds it
    assert not evidence.may_destroy("gpu-0-mig-c", "MIG-1")  # a CDI spec hands it out
    assert evidence.may_destroy("gpu-0-mig-c", "MIG-2")
    assert not Evidence(specs={}, api=None).may_destroy("gpu-0-mig-c", "MIG-2")  # no answer
    assert evidence.claim_gone("u1") and not evidence.claim_gone("u2")
    assert not Evidence(specs={}, api=None).claim_gone("u1")
    assert evidence.without(["u1"]).uuids_in_specs() == frozenset()
