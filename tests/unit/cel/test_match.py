"""match over the simulated profiles and slice files, and the ``match`` command end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cel import Verdict, match_devices, selector_sets
from dra_driver.cel.match import Selector, claim_requests
from dra_driver.cel.sources import profile_devices, slice_file_devices
from dra_driver.cel_commands import EXPLAIN_CLAIM, MATCH
from dra_driver.command import Command
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.resourceslice.pool import render_pool
from dra_driver.settings import add_arguments, from_namespace

DRIVER = "gpu.dra.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


def run(command: Command, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_arguments(parser, command.fields, **command.defaults)
    assert command.arguments is not None
    command.arguments(parser)
    ns = parser.parse_args(list(argv))
    return command.run(from_namespace(ns, command.fields, environ={}), ns)


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


@pytest.mark.parametrize(
    ("profile", "expression", "matching"),
    [
        ("dgx-h100", f'{A}.architecture == "Hopper"', 8),
        ("dgx-a100", f'{A}.architecture == "Hopper"', 0),
        ("dgx-a100", f'{C}.memory.compareTo(quantity("40Gi")) >= 0', 8),
        ("l4x4", f'{A}.cudaComputeCapability.compareTo(semver("8.9.0")) >= 0', 4),
        ("l4x4", f'{A}.productName.matches("L4$")', 4),
        ("dgx-h100", f"!{A}.migEnabled && {A}.numaNode == 0", 4),
    ],
)
def test_profiles(profile: str, expression: str, matching: int) -> None:
    devices = profile_devices(profile, "node-a", DRIVER)
    results = match_devices(devices, [Selector("test", expression)])
    assert sum(r.verdict is Verdict.MATCH for r in results) == matching
    assert all(r.verdict is not Verdict.ERROR for r in results)


def test_mixed_profile_missing_attribute_is_error() -> None:
    # MIG devices have no migEnabled attribute: unguarded access is an error for them.
    devices = profile_devices("mixed", "node-a", DRIVER)
    results = match_devices(devices, [Selector("t", f"{A}.migEnabled == false")])
    verdicts = {r.device.name: r.verdict for r in results}
    assert Verdict.ERROR in verdicts.values() and Verdict.MATCH in verdicts.values()
    guarded = match_devices(
        devices, [Selector("t", f"has({A}.migEnabled) && {A}.migEnabled == false")]
    )
    assert Verdict.ERROR not in {r.verdict for r in guarded}


@pytest.fixture
def slices_file(tmp_path: Path) -> Path:
    docs = []
    for node, profile in (("node-a", "dgx-a100"), ("node-h", "dgx-h100")):
        inventory = SimulatedDiscovery(profile, node).discover()
        docs += render_pool(build_catalog(inventory).pool(node, DRIVER))
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_slices_file(slices_file: Path) -> None:
    devices = slice_file_devices(slices_file)
    assert {d.pool for d in devices} == {"node-a", "node-h"}
    results = match_devices(devices, [Selector("t", f'{A}.architecture == "Hopper"')])
    assert {r.device.pool for r in results if r.verdict is Verdict.MATCH} == {"node-h"}


def test_slices_file_uses_the_newest_generation_of_a_pool(tmp_path: Path) -> None:
    # A driver that republishes bumps the generation; until the old slice is deleted both are
    # listed, and the scheduler only sees the newest: each device once, with its new values.
    def pool_slice(generation: int, product: str) -> dict[str, Any]:
        return {
            "kind": "ResourceSlice",
            "metadata": {"name": f"node-a-{generation}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": generation, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"productName": {"string": product}}}],
            },
        }

    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump_all([pool_slice(2, "H100"), pool_slice(1, "A100")]))
    devices = slice_file_devices(path)
    assert [d.name for d in devices] == ["gpu-0"]
    results = match_devices(devices, [Selector("t", f'{A}.productName == "A100"')])
    assert [r.verdict for r in results] == [Verdict.NO_MATCH]


def test_claim_requests_and_selector_sets() -> None:
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.dra.dev",
                            "count": 2,
                            "selectors": [{"cel": {"expression": "true"}}],
                        },
                    },
                    {
                        "name": "alt",
                        "firstAvailable": [
                            {"name": "big", "deviceClassName": "gpu.dra.dev"},
                            {"name": "small", "deviceClassName": "mig.gpu.dra.dev"},
                        ],
                    },
                ]
            }
        },
    }
    requests = claim_requests(claim)
    assert requests[0].count == 2 and requests[0].selectors == ("true",)
    assert [s.name for s in requests[1].subrequests] == ["alt/big", "alt/small"]
    klass = device_class("gpu.dra.dev", f'device.driver == "{DRIVER}"')
    sets = selector_sets(klass, claim)
    assert [s.label for s in sets] == [
        "request gpu (class gpu.dra.dev)",
        "request alt/big (class gpu.dra.dev)",
        "request alt/small (class mig.gpu.dra.dev, class not found: its selectors skipped)",
    ]
    assert [s.origin for s in sets[0].selectors] == ["class gpu.dra.dev", "request gpu"]


def test_template_is_read_through_spec_spec() -> None:
    template = {
        "kind": "ResourceClaimTemplate",
        "spec": {
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x"}}]}}
        },
    }
    assert [r.name for r in claim_requests(template)] == ["r"]


def test_match_command_table(
    tmp_path: Path, slices_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    klass = tmp_path / "class.yaml"
    klass.write_text(
        yaml.safe_dump(
            device_class(
                "big",
                f'{C}.memory.compareTo(quantity("70Gi")) >= 0 && {A}.architecture == "Hopper"',
            )
        )
    )
    assert run(MATCH, "--class", str(klass), "--slices", str(slices_file)) == 0
    out = capsys.readouterr().out
    assert "class big: 8 of 16 device(s) match" in out
    # A100 40GB: the memory conjunct is the false one, with the value it read.
    assert "memory = 42949672960 (40Gi)" in out


def test_match_command_notes_selectors_past_the_api_length(
    tmp_path: Path, slices_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Past the API's 10,240 characters the verdict is still the scheduler's (its CEL compiles
    # the selector); the table notes that the API server would refuse it.
    long = f'{A}.architecture == "Hopper"' + " " * 10_240
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump(device_class("long", long)))
    assert run(MATCH, "--class", str(klass), "--slices", str(slices_file)) == 0
    out = capsys.readouterr().out
    assert "class long: 8 of 16 device(s) match" in out
    assert f"has {len(long):,} characters, more than the API allows (10,240)" in out


def test_match_command_json_and_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    klass = tmp_path / "class.json"
    klass.write_text(json.dumps(device_class("none", f'{A}.architecture == "Volta"')))
    assert run(MATCH, "--class", str(klass), "--profile", "l4x4", "-o", "json") == 4
    data = json.loads(capsys.readouterr().out)
    assert data["matched"] is False
    first = data["sets"][0]["devices"][0]
    assert first["verdict"] == "no match"
    assert first["explanation"]["values"][0]["value"] == '"Ada Lovelace"'


def test_match_command_claim_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": "gpu.dra.dev",
                                        "selectors": [{"cel": {"expression": f"{A}.nosuch == 1"}}],
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
    )
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump(device_class("gpu.dra.dev", "true")))
    code = run(MATCH, "--class", str(klass), "--claim", str(claim), "--profile", "l4x4")
    assert code == 4  # no device matches
    out = capsys.readouterr().out
    assert "error" in out and "no such key: nosuch" in out


def test_match_command_judges_every_claim_of_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An example file often holds several claims (examples/shared-gpu-memory has four): each
    is judged, and its sets are labelled with its name (was: only the first was)."""

    def claim(name: str, expression: str) -> dict[str, Any]:
        request = {
            "name": "gpu",
            "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": expression}}]},
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}},
        }

    path = tmp_path / "claims.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [claim("none", f'{A}.model == "nosuch"'), claim("any", "true")]
        )
    )
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump(device_class(DRIVER, "true")))
    code = run(MATCH, "--class", str(klass), "--claim", str(path), "--profile", "l4x4", "-o", "json")
    assert code == 0  # one of the claims matches
    sets = json.loads(capsys.readouterr().out)["sets"]
    assert [s["label"] for s in sets] == [
        f"ResourceClaim none: request gpu (class {DRIVER})",
        f"ResourceClaim any: request gpu (class {DRIVER})",
    ]
    assert [sum(d["verdict"] == "match" for d in s["devices"]) for s in sets] == [0, 4]


ROOT = Path(__file__).resolve().parents[3]


def test_match_command_finds_each_requests_class_in_a_file_of_classes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--class manifests/base/deviceclasses.yaml`` (as the README has it) holds three classes:
    each request is judged with its own, as the scheduler does, not only with the first."""
    classes = str(ROOT / "manifests" / "base" / "deviceclasses.yaml")
    mig = str(ROOT / "examples" / "mig-1g10gb" / "mig-1g10gb.yaml")
    assert run(MATCH, "--class", classes, "--claim", mig, "--profile", "mixed", "-o", "json") == 0
    (only,) = json.loads(capsys.readouterr().out)["sets"]
    assert only["label"] == "request mig (class mig.gpu.dra.dev)"
    # The class leaves the whole GPUs out (no match); the request's selector alone would fail
    # on them ("no such key: profile"), which the scheduler never reports.
    verdicts = {d["device"]: d["verdict"] for d in only["devices"]}
    assert verdicts["gpu-2"] == verdicts["gpu-3"] == "no match"
    assert sorted(d for d, v in verdicts.items() if v == "match") == [
        "gpu-0-mig-1g10gb-19-6",
        "gpu-1-mig-1g10gb-19-4",
        "gpu-1-mig-1g10gb-19-5",
    ]
    # No GPU of the mixed node is shared: the shared class matches nothing there.
    shared = str(ROOT / "examples" / "shared-gpu-memory" / "shared-gpu-memory.yaml")
    assert run(MATCH, "--class", classes, "--claim", shared, "--profile", "mixed") == 4
    assert "request gpu (class shared.gpu.dra.dev): 0 of 8 device(s) match" in (
        capsys.readouterr().out
    )


def test_match_command_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(MATCH, "--profile", "l4x4") == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ConfigMap\n")
    assert run(MATCH, "--class", str(bad), "--profile", "l4x4") == 1
    assert "no DeviceClass" in capsys.readouterr().err
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump(device_class("x", "true")))
    assert run(MATCH, "--class", str(klass)) == 2


def test_explain_claim_command_has_a_positional_argument() -> None:
    parser = argparse.ArgumentParser()
    assert EXPLAIN_CLAIM.arguments is not None
    EXPLAIN_CLAIM.arguments(parser)
    assert parser.parse_args(["ns/claim"]).claim == "ns/claim"


def test_malformed_inputs_are_messages_not_tracebacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump(device_class("gpu.dra.dev", "true")))

    def slices(*devices: Any) -> str:
        path = tmp_path / "slices.yaml"
        spec = {"driver": DRIVER, "pool": {"name": "n"}, "devices": list(devices)}
        path.write_text(yaml.safe_dump({"kind": "ResourceSlice", "spec": spec}))
        return str(path)

    # A capacity written as a bare quantity, an attribute without its type: errors on the device.
    for device in (
        {"name": "d0", "capacity": {"memory": "80Gi"}},
        {"name": "d0", "capacity": {"memory": {}}},
        {"name": "d0", "attributes": {"model": 3}},
    ):
        assert run(MATCH, "--class", str(klass), "--slices", slices(device)) == 4
        assert "d0      n     error" in capsys.readouterr().out
    assert run(MATCH, "--class", str(klass), "--slices", slices("d0")) == 1
    assert "malformed ResourceSlice" in capsys.readouterr().err
    claim = tmp_path / "claim.yaml"
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": "two"}}
    claim.write_text(
        yaml.safe_dump({"kind": "ResourceClaim", "spec": {"devices": {"requests": [request]}}})
    )
    assert run(MATCH, "--claim", str(claim), "--profile", "l4x4") == 1
    assert "malformed" in capsys.readouterr().err
