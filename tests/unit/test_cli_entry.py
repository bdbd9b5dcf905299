"""The ``dra-driver`` command as users meet it: run through its installed entry point.

Flags, help, environment variables, output formats, error messages and exit statuses as a
kubectl user expects them (see dra_driver/exitcodes.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.kubeserver import serve
from tests.unit.test_execcredential import V1, plugin
from tests.unit.test_kube import kubeconfig

ROOT = Path(__file__).resolve().parents[2]
ENTRY = shutil.which("dra-driver", path=str(Path(sys.executable).parent))
SIMULATED = ["--backend", "simulated", "--profile", "l4x4", "--node-name", "n1"]
CLASS_A = "device.driver == 'gpu.dra.dev'"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRA_", "KUBE"))}
    env.update(extra)
    return env


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    assert ENTRY is not None, "dra-driver is not installed in the venv"
    return subprocess.run(
        [ENTRY, *args], capture_output=True, text=True, timeout=120, env=clean_env(**env)
    )


async def acli(*args: str, **env: str) -> tuple[int, str, str]:
    """The same, while this process serves a stand-in API server on its event loop."""
    assert ENTRY is not None
    proc = await asyncio.create_subprocess_exec(
        ENTRY,
        *args,
        env=clean_env(**env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def device_class(tmp_path: Path, expression: str) -> Path:
    path = tmp_path / "class.yaml"
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "c"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "dra-driver 0.1.0"


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["slices", "--prof", "l4x4"], "--profile"),  # abbreviations are not accepted
        (["slices", "--profle", "l4x4"], "--profile"),
        (["match", "--clas", "x"], "--class"),
    ],
)
def test_unknown_flags_are_usage_errors_with_a_suggestion(argv: list[str], suggestion: str) -> None:
    proc = cli(*argv)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"usage: dra-driver {argv[0]}")
    assert f"(did you mean {suggestion}?)" in proc.stderr


def test_help_is_free_of_noise() -> None:
    proc = cli("slices", "--help")
    assert proc.returncode == 0
    assert "[default ]" not in proc.stdout and "default False" not in proc.stdout
    assert "default gpu.dra.dev; env DRA_DRIVER_NAME" in " ".join(proc.stdout.split())
    assert "exit status: 0 ok, 1 runtime error, 2 usage error" in proc.stdout


@pytest.mark.parametrize(
    "flag", [["--dynamic-mig"], ["--dynamic-mig=true"], ["--dynamic-mig", "yes"]]
)
def test_boolean_flag_is_a_switch(flag: list[str]) -> None:
    plain = cli("slices", *SIMULATED, "--profile", "dgx-a100", "-o", "json")
    dynamic = cli("slices", *SIMULATED, "--profile", "dgx-a100", *flag, "-o", "json")
    assert plain.returncode == dynamic.returncode == 0, dynamic.stderr
    count = lambda p: sum(len(s["spec"].get("devices", [])) for s in json.loads(p.stdout)["items"])  # noqa: E731
    assert count(dynamic) > count(plain)  # every MIG placement is published


def test_slices_table_and_json_list() -> None:
    table = cli("slices", *SIMULATED, "-o", "table")
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["SLICE", "DEVICE", "TYPE", "PRODUCT", "PROFILE", "MEMORY", "SHARED"]
    assert len(lines) == 1 + 4 + 1 and "NVIDIA L4" in lines[1]
    listed = json.loads(cli("slices", *SIMULATED, "-o", "json").stdout)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert [i["kind"] for i in listed["items"]] == ["ResourceSlice"]


def test_every_flag_has_its_variable(tmp_path: Path) -> None:
    klass = device_class(tmp_path, CLASS_A)
    proc = cli("match", "-o", "json", DRA_CLASS=str(klass), DRA_PROFILE="l4x4")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["matched"] is True
    # A switch from its variable.
    off = cli("match", "-o", "json", DRA_CLASS=str(klass), DRA_LIVE="nonsense")
    assert off.returncode == 1 and "DRA_LIVE: expected true or false" in off.stderr


def test_variables_do_not_override_exclusive_flags(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    (plugins / "gpu.dra.dev").mkdir(parents=True)
    proc = cli("inject-health", "gpu-0", "--xid", "79", f"--plugins-dir={plugins}", DRA_LOST="true")
    assert proc.returncode == 0, proc.stderr
    assert "gpu-0: {'xid': 79}" in proc.stdout


def test_exit_status_no_match_and_errors(tmp_path: Path) -> None:
    klass = device_class(tmp_path, "device.driver == 'other'")
    assert cli("match", "--class", str(klass), "--profile", "l4x4").returncode == 4
    assert cli("match", "--profile", "l4x4").returncode == 2  # neither --class nor --claim
    bad = cli("slices", *SIMULATED, "--driver-name", "Not_A_Name")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1


def test_the_images_optimization_level_changes_no_output(tmp_path: Path) -> None:
    """The image runs Python with the level its Dockerfile sets (no docstrings, no asserts):
    the commands say there, byte for byte, what they say here, errors and explanations too."""
    found = re.search(r"\bPYTHONOPTIMIZE=(\d)", (ROOT / "Dockerfile").read_text())
    assert found is not None
    klass = device_class(
        tmp_path,
        'device.attributes["gpu.dra.dev"].architecture == "Hopper" && '
        'device.capacity["gpu.dra.dev"].memory.compareTo(quantity("40Gi")) >= 0',
    )
    commands = [
        ["slices", *SIMULATED, "--profile", "dgx-a100", "--dynamic-mig", "-o", "json"],
        ["match", "--class", str(klass), "--profile", "dgx-h100", "-o", "json"],
        ["match", "--class", str(klass), "--profile", "l4x4"],
        ["slices", *SIMULATED, "--driver-name", "Not_A_Name"],
        ["match", "--help"],
    ]
    for argv in commands:
        plain, optimized = cli(*argv), cli(*argv, PYTHONOPTIMIZE=found[1])
        assert plain.stdout or plain.stderr, argv
        assert (optimized.returncode, optimized.stdout, optimized.stderr) == (
            plain.returncode,
            plain.stdout,
            plain.stderr,
        ), argv


def test_missing_claim_file_says_so(tmp_path: Path) -> None:
    proc = cli("match", "--claim", str(tmp_path / "claim.yaml"), "--profile", "l4x4")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == f"dra-driver match: error: {tmp_path / 'claim.yaml'}: no such file"
    )


def test_bad_yaml_is_readable(tmp_path: Path) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text("kind: ResourceClaim\nspec:\n  devices: [\n    - x\n")
    proc = cli("match", "--claim", str(path), "--profile", "l4x4")
    assert proc.returncode == 1
    assert "<unicode string>" not in proc.stderr
    assert f"{path} is not valid YAML: line " in proc.stderr and ", column " in proc.stderr


async def test_explain_claim_namespace_context_and_not_found(tmp_path: Path) -> None:
    async with serve() as server:
        config = kubeconfig(
            tmp_path / "config",
            cluster={"server": "http://127.0.0.1:1"},  # the current context: unreachable
            user={"token": "t"},
            extra_contexts=[{"name": "real", "context": {"cluster": "real", "user": "u"}}],
        )
        doc = yaml.safe_load(config.read_text())
        doc["clusters"].append({"name": "real", "cluster": {"server": server.url}})
        config.write_text(yaml.safe_dump(doc))
        code, _, err = await acli(
            "explain-claim",
            "-n",
            "t1",
            "gpu-claim",
            "--context",
            "real",
            "--kubeconfig",
            str(config),
        )
        assert code == 3, err
        assert err.strip() == (
            'dra-driver explain-claim: error: ResourceClaim "gpu-claim" not found in namespace '
            '"t1" (nor a ResourceClaimTemplate of that name)'
        )
        paths = [s["path"] for s in server.seen]
        assert paths[0] == "/apis/resource.k8s.io/v1/namespaces/t1/resourceclaims/gpu-claim"
        # The same through the variables.
        code, _, _ = await acli(
            "explain-claim",
            "gpu-claim",
            DRA_NAMESPACE="t2",
            DRA_CONTEXT="real",
            DRA_KUBECONFIG=str(config),
        )
        assert code == 3
        assert server.seen[-1]["path"].endswith("/namespaces/t2/resourceclaimtemplates/gpu-claim")


async def test_claim_name_alone_is_in_the_context_namespace(tmp_path: Path) -> None:
    async with serve() as server:
        config = kubeconfig(tmp_path / "config", cluster={"server": server.url}, user={})
        doc = yaml.safe_load(config.read_text())
        doc["contexts"][0]["context"]["namespace"] = "team-a"
        config.write_text(yaml.safe_dump(doc))
        code, _, err = await acli("explain-claim", "c", "--kubeconfig", str(config))
        assert code == 3, err
        assert server.seen[0]["path"].endswith("/namespaces/team-a/resourceclaims/c")
        (tmp_path / "other").write_text(
            yaml.safe_dump(
                {**doc, "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}
            )
        )
        code, _, _ = await acli("explain-claim", "c", "--kubeconfig", str(tmp_path / "other"))
        assert code == 3
        assert server.seen[-1]["path"].endswith("/namespaces/default/resourceclaimtemplates/c")


async def test_exec_plugin_kubeconfig_through_the_command(tmp_path: Path) -> None:
    plugin(tmp_path, {"token": "from-plugin"})
    async with serve() as server:
        config = kubeconfig(
            tmp_path / "config",
            cluster={"server": server.url},
            user={"exec": {"apiVersion": V1, "command": "./plugin"}},
        )
        code, _, err = await acli("explain-claim", "ns/c", "--kubeconfig", str(config))
        assert code == 3, err
        assert server.seen[0]["headers"]["Authorization"] == "Bearer from-plugin"
