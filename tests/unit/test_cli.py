"""The CLI: discover and slices print real data; bad flags and profiles fail in one line."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import main
from tests.unit.slice_rules import check_pool


def test_discover_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--backend", "simulated", "--profile", "mixed"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100-SXM4-80GB" in out and "3g.40gb" in out and "driver 580.95.05" in out


def test_discover_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--backend", "simulated", "--profile", "l4x4", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [g["productName"] for g in data["gpus"]] == ["NVIDIA L4"] * 4
    assert "_" not in json.dumps(list(_keys(data)))  # camelCase everywhere


def _keys(obj: object) -> list[str]:
    if isinstance(obj, dict):
        return [*obj, *(k for v in obj.values() for k in _keys(v))]
    if isinstance(obj, list):
        return [k for v in obj for k in _keys(v)]
    return []


def test_slices_yaml_from_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_BACKEND", "simulated")
    monkeypatch.setenv("DRA_PROFILE", "dgx-h100")
    monkeypatch.setenv("DRA_NODE_NAME", "n1")
    assert main(["slices"]) == 0
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    assert check_pool(slices) == []
    assert len(slices[0]["spec"]["devices"]) == 8


def test_flag_wins_over_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_PROFILE", "dgx-h100")
    assert (
        main(
            [
                "slices",
                "--backend",
                "simulated",
                "--profile",
                "l4x4",
                "--node-name",
                "x",
                "-o",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["apiVersion"], out["kind"]) == ("v1", "List")  # what kubectl apply -f - reads
    assert len(out["items"][0]["spec"]["devices"]) == 4


def test_driver_name_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "slices",
        "--backend",
        "simulated",
        "--profile",
        "l4x4",
        "--node-name",
        "x",
        "--driver-name",
        "gpu.example.com",
    ]
    assert main(args) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["driver"] == "gpu.example.com"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["slices", "--backend", "simulated", "--profile", "l4x4"],
            {},
            "--node-name (DRA_NODE_NAME) is required",
        ),
        (["discover", "--backend", "simulated"], {}, "needs --profile"),
        (["discover", "--backend", "simulated", "--profile", "nope"], {}, "does not exist"),
        (
            ["discover"],
            {"DRA_BACKEND": "cuda"},
            "DRA_BACKEND: Input should be 'nvml' or 'simulated'",
        ),
        (
            [
                "slices",
                "--backend",
                "simulated",
                "--profile",
                "l4x4",
                "--node-name",
                "x",
                "--driver-name",
                "Bad_Name",
            ],
            {},
            "--driver-name",
        ),
    ],
)
def test_bad_input_is_one_line(
    args: list[str],
    env: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_unknown_flag_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "discover", "--bogus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "--bogus" in proc.stderr


def test_bad_yaml_profile_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("gpus: [\n")
    assert main(["discover", "--backend", "simulated", "--profile", str(path)]) == 1
    assert "not valid YAML" in capsys.readouterr().err


def test_unusable_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = [
        "run",
        "--backend",
        "simulated",
        "--profile",
        "l4x4",
        "--node-name",
        "n",
        "--metrics-port",
        "0",
        "--health-port",
        "0",
    ]
    assert (
        main([*args, f"--plugins-dir={blocker / 'plugins'}", f"--cdi-root={tmp_path / 'cdi'}"]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(blocker) in err


def test_demo_without_the_development_environment_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed wheel has no devenv package; None in sys.modules makes its import fail.
    monkeypatch.setitem(sys.modules, "devenv.demo", None)
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkout" in err and "make install" in err


def test_demo_from_an_installed_wheel_says_so_in_one_line(tmp_path: Path) -> None:
    """A wheel carries devenv/ but not the checkout around it (testenv/, examples/)."""
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(Path(__file__).resolve().parents[2] / "devenv", site / "devenv")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from dra_driver.cli import main; sys.exit(main())",
            "demo",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)},
        cwd=tmp_path,  # not the checkout, whose devenv/ would come first on sys.path
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr
        == "dra-driver demo needs a checkout of the project set up with `make install`\n"
    )


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"dra-driver {version('dra-driver')}\n"


def test_match_commands_in_the_docs_parse() -> None:
    # Every `dra-driver match ...` the docs tell a user to type must be a valid command line.
    import re
    import shlex

    from dra_driver.cel_commands import MATCH
    from dra_driver.settings import add_arguments

    root = Path(__file__).resolve().parents[2]
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    commands = [m for t in texts for m in re.findall(r"`dra-driver match ([^`]*)`", t.read_text())]
    assert commands
    for command in commands:
        parser = argparse.ArgumentParser(exit_on_error=False)
        add_arguments(parser, MATCH.fields, **MATCH.defaults)
        assert MATCH.arguments is not None
        MATCH.arguments(parser)
        try:
            parser.parse_args(shlex.split(command))
        except (argparse.ArgumentError, SystemExit) as exc:
            raise AssertionError(f"dra-driver match {command}: {exc}") from None


def test_compat_with_another_driver_name_says_so_without_pydantic_prefix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_COMPAT", "nvidia")
    monkeypatch.setenv("DRA_DRIVER_NAME", "gpu.example.com")
    args = ["slices", "--backend", "simulated", "--profile", "l4x4", "--node-name", "x"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "--compat nvidia publishes as gpu.nvidia.com" in err, err
    assert "Value error" not in err, err


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DRA_DRIVER_NAME", "GPU_driver", "expected DRA driver name (a DNS subdomain)"),
        ("DRA_DRIVER_NAME", "gpu..dra.dev", "expected DRA driver name (a DNS subdomain)"),
    ],
)
def test_a_setting_of_the_wrong_form_says_what_it_is_not_its_regex(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    expected: str,
) -> None:
    monkeypatch.setenv(variable, value)
    args = ["slices", "--backend", "simulated", "--profile", "l4x4", "--node-name", "x"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert f"{variable}: not valid here; {expected}" in err, err
    assert "should match pattern" not in err, err


def _resolve(environ: dict[str, str], *argv: str) -> Any:
    from dra_driver.settings import add_arguments, from_namespace

    fields = ["dynamic_mig", "driver_root", "host_driver_root"]
    parser = argparse.ArgumentParser()
    add_arguments(parser, fields)
    return from_namespace(parser.parse_args(list(argv)), fields, environ)


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({"DRA_DYNAMIC_MIG": ""}, (), False),
        ({"DRA_DYNAMIC_MIG": "On"}, (), True),
        ({"DRA_DYNAMIC_MIG": "no"}, (), False),
        ({}, ("--dynamic-mig",), True),
        ({}, ("--dynamic-mig=off",), False),
        ({"DRA_DYNAMIC_MIG": "true"}, ("--dynamic-mig=0",), False),
    ],
)
def test_a_switch_reads_the_same_from_a_flag_or_a_variable(
    environ: dict[str, str], argv: tuple[str, ...], expected: bool
) -> None:
    assert _resolve(environ, *argv).dynamic_mig is expected


def test_a_switch_of_another_word_names_the_variable() -> None:
    from dra_driver.settings import SettingsError

    with pytest.raises(SettingsError, match=r"^DRA_DYNAMIC_MIG: expected true or false"):
        _resolve({"DRA_DYNAMIC_MIG": "maybe"})


@pytest.mark.parametrize("variable", ["DRA_DRIVER_ROOT", "DRA_HOST_DRIVER_ROOT"])
def test_a_relative_driver_root_is_refused(variable: str) -> None:
    from dra_driver.settings import SettingsError

    with pytest.raises(SettingsError, match=rf"^{variable}: must be an absolute path"):
        _resolve({variable: "run/nvidia/driver"})
    assert _resolve({variable: "/run/nvidia/driver"}) is not None


def _ports(environ: dict[str, str], *argv: str) -> Any:
    from dra_driver.settings import add_arguments, from_namespace

    fields = ["metrics_port", "health_port"]
    parser = argparse.ArgumentParser()
    add_arguments(parser, fields)
    return from_namespace(parser.parse_args(list(argv)), fields, environ)


@pytest.mark.parametrize(
    ("environ", "argv", "source"),
    [
        ({"DRA_METRICS_PORT": "9100", "DRA_HEALTH_PORT": "9100"}, (), "DRA_HEALTH_PORT"),
        ({}, ("--metrics-port=51515",), "--health-port"),
    ],
)
def test_metrics_and_health_on_one_port_are_refused_naming_both(
    environ: dict[str, str], argv: tuple[str, ...], source: str
) -> None:
    """Otherwise the agent publishes, then stops at the second bind with "cannot listen"."""
    from dra_driver.settings import SettingsError

    with pytest.raises(SettingsError, match=rf"^{source}: .*--metrics-port") as caught:
        _ports(environ, *argv)
    assert "\n" not in str(caught.value)
    # Off is no port: both 0, or one of them, is fine.
    assert _ports({"DRA_METRICS_PORT": "0", "DRA_HEALTH_PORT": "0"}).health_port == 0
    assert _ports({"DRA_METRICS_PORT": "9100", "DRA_HEALTH_PORT": "9101"}).health_port == 9101


@pytest.mark.parametrize("value", ["bogus", "index:x", "gpu:0"])
def test_a_bad_shared_gpus_value_names_its_flag(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """As --mig-profiles and --node-overhead do: an admin who set DRA_SHARED_GPUS (the
    chart's features.sharedGpus) finds which setting to fix."""
    args = ["slices", "--backend", "simulated", "--profile", "l4x4", "--node-name", "x"]
    assert main([*args, "--shared-gpus", value]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dra-driver slices: error: --shared-gpus: "), err
    assert "\n" not in err
