"""The checked-in protos match the pinned release, and dra_driver/_proto matches them.

``proto/`` holds copies of the kubelet's plugin APIs (their comments rewritten); the pinned
release is the ``k8s.io/kubelet`` version in testenv/go.mod, read from Go's module cache.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "dra_driver" / "_proto"
PROTOS = ROOT / "proto"
KUBELET_MODULE = "k8s.io/kubelet"

#: Our copy -> its source in the k8s.io/kubelet module.
UPSTREAM = {
    "dra/v1/api.proto": "pkg/apis/dra/v1/api.proto",
    "dra/v1beta1/api.proto": "pkg/apis/dra/v1beta1/api.proto",
    "dra_health/v1/api.proto": "pkg/apis/dra-health/v1/api.proto",
    "dra_health/v1alpha1/api.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
    "pluginregistration/api.proto": "pkg/apis/pluginregistration/v1/api.proto",
}


def _files(base: Path) -> set[Path]:
    return {
        p.relative_to(base) for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    out = tmp_path / "proto"
    subprocess.run(
        ["bash", str(ROOT / "hack" / "gen-proto.sh"), str(out)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    fresh, committed = _files(out), _files(COMMITTED)
    assert fresh == committed, "run `make proto`: the set of generated files differs"
    stale = [
        str(p) for p in sorted(fresh) if not filecmp.cmp(out / p, COMMITTED / p, shallow=False)
    ]
    assert not stale, f"run `make proto`: stale generated files {stale}"


def test_generated_packages_import() -> None:
    from dra_driver._proto.dra.v1 import api_pb2 as dra_v1
    from dra_driver._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
    from dra_driver._proto.dra_health.v1 import api_pb2 as health_v1
    from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
    from dra_driver._proto.pluginregistration import api_pb2 as reg

    assert dra_v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert dra_v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert health_v1.DESCRIPTOR.package == "v1"
    assert health_v1alpha1.DESCRIPTOR.package == "v1alpha1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert [f.number for f in dra_v1.Device.DESCRIPTOR.fields] == [1, 2, 3, 4, 5]
    assert [f.number for f in dra_v1beta1.Device.DESCRIPTOR.fields] == [1, 2, 3, 4]
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


def _pinned_kubelet() -> Path:
    """The pinned k8s.io/kubelet in Go's module cache; skips when it is not there."""
    go_mod = (ROOT / "testenv" / "go.mod").read_text()
    match = re.search(rf"^\s*{re.escape(KUBELET_MODULE)} (v\S+)$", go_mod, re.MULTILINE)
    assert match, f"{KUBELET_MODULE} is not required by testenv/go.mod"
    version = match.group(1)
    cache = os.environ.get("GOMODCACHE", "")
    if not cache and shutil.which("go"):
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
    module = Path(cache or Path.home() / "go" / "pkg" / "mod") / f"{KUBELET_MODULE}@{version}"
    if not module.is_dir():
        pytest.skip(f"{KUBELET_MODULE}@{version} is not in Go's module cache (run `make testenv`)")
    return module


def _descriptor(proto: Path, out: Path) -> object:
    """The compiled descriptor of one proto file, without its name, options and comments."""
    from google.protobuf import descriptor_pb2

    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{proto.parent}",
            f"--descriptor_set_out={out}",
            proto.name,
        ],
        check=True,
        capture_output=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert len(files) == 1
    (file,) = files
    file.ClearField("name")
    file.ClearField("options")  # go_package only
    return file


def test_proto_copies_match_the_pinned_release(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    module = _pinned_kubelet()
    ours = {str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto")}
    assert ours == set(UPSTREAM), "a proto was added or removed: update UPSTREAM"
    differ = [
        copy
        for copy, source in sorted(UPSTREAM.items())
        if _descriptor(PROTOS / copy, tmp_path / "ours.pb")
        != _descriptor(module / source, tmp_path / "upstream.pb")
    ]
    assert not differ, f"proto/ copies differ from {module.name} (messages, fields, rpcs): {differ}"
