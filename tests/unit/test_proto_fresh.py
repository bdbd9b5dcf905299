"""The committed gRPC code in dra_driver/_proto matches what hack/gen-proto.sh generates now."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "dra_driver" / "_proto"


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
