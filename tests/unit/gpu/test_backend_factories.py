"""Each backend the agent can run on loads its own modules and not the other's.

A simulated agent has no use for the NVML bindings (pynvml alone is about 2.7 MiB of every
agent's memory), a real node's agent none for the simulated profiles, their models and YAML.
Each case runs in a fresh interpreter, since this test process has loaded everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import json, sys
from pathlib import Path
import dra_driver.launch, dra_driver.agent
from dra_driver.gpu.discovery.factory import make_discovery
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.factory import make_mig_backend
from dra_driver.gpu.sharing.factory import make_sharing_backend

backend, state = sys.argv[1], Path(sys.argv[2])
loaded = {"agent": sorted(sys.modules)}
discovery = make_discovery(backend, node_name="node-a", profile="l4x4")
mig = make_mig_backend(backend, state_dir=state, inventory=Inventory(driver_version="580.95.05", cuda_driver_version="13.0"))
sharing = make_sharing_backend(backend, state_dir=state)
loaded["backend"] = sorted(sys.modules)
loaded["types"] = [type(x).__name__ for x in (discovery, mig, sharing)]
print(json.dumps(loaded))
"""

NVML = ("pynvml", "dra_driver.gpu.discovery.nvml", "dra_driver.gpu.mig.nvml")
SIMULATED = (
    "yaml",
    "dra_driver.gpu.discovery.simulated",
    "dra_driver.gpu.mig.simulated",
    "dra_driver.gpu.sharing.simulated",
)


def _loaded(backend: str, state: Path) -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, backend, str(state)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, list[str]] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize(
    ("backend", "own", "other", "types"),
    [
        ("simulated", SIMULATED, NVML, ["SimulatedDiscovery", "SimulatedMig", "SimulatedSharing"]),
        ("nvml", NVML, SIMULATED, ["NvmlDiscovery", "NvmlMig", "HostSharing"]),
    ],
)
def test_a_backend_loads_only_its_own_modules(
    tmp_path: Path, backend: str, own: tuple[str, ...], other: tuple[str, ...], types: list[str]
) -> None:
    loaded = _loaded(backend, tmp_path)
    assert loaded["types"] == types
    # Importing the agent loads neither backend; choosing one loads it and only it.
    assert [m for m in NVML + SIMULATED if m in loaded["agent"]] == []
    assert [m for m in own if m not in loaded["backend"]] == []
    assert [m for m in other if m in loaded["backend"]] == []
