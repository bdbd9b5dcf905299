"""``run`` reads its socket settings before the full settings: both readings must agree, and
the quick one must never accept what the full one refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.bindsettings import SocketSettings, read_socket_settings
from dra_driver.commands import parse
from dra_driver.errors import StartError
from dra_driver.startup import check_settings


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "file").write_text("")
    return {
        "plugins": str(tmp_path / "plugins"),
        "registry": str(tmp_path / "registry"),
        "cdi": str(tmp_path / "cdi"),
        "blocked": str(tmp_path / "file" / "below"),
        "kubeconfig": str(tmp_path / "file"),
        "missing": str(tmp_path / "no-such-kubeconfig"),
    }


def _full(
    argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> SocketSettings | None:
    """The full reading and check (what ``run`` checks before it loads the node's state),
    or None when it refuses the command line."""
    for name in [n for n in os.environ if n.startswith("DRA_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        settings = parse(argv).settings
        check_settings(settings)
    except (StartError, SystemExit):
        return None
    return SocketSettings.of(settings)


def _cases(d: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    base = [
        f"--plugins-dir={d['plugins']}",
        f"--registry-dir={d['registry']}",
        f"--cdi-root={d['cdi']}",
    ]
    node = ["--node-name=n1"]
    flag_values = {
        "driver_name": ["", "gpu.example.com", "Bad_Name", "a" * 64, "x.y\n", "-lead"],
        "compat": ["nvidia", "other"],
        "node_name": ["", "a" * 254, "node-2"],
        "plugins_dir": ["relative", d["blocked"]],
        "registry_dir": ["", d["blocked"]],
        "cdi_root": ["cdi"],
        "pod_uid": ["0b5e6c1a-uid"],
        "kubeconfig": [d["kubeconfig"], d["missing"]],
        "log_format": ["json", "xml"],
        "log_level": ["debug", "loud"],
    }
    cases: list[tuple[list[str], dict[str, str]]] = [(["run", *base, *node], {})]
    for field, values in flag_values.items():
        flag = "--" + field.replace("_", "-")
        for value in values:
            cases.append((["run", *base, *node, f"{flag}={value}"], {}))
            cases.append((["run", *base, *node], {"DRA_" + field.upper(): value}))
    # A flag beats its variable; --compat with and without a driver name.
    cases += [
        (["run", *base, *node, "--driver-name=a.b"], {"DRA_DRIVER_NAME": "c.d"}),
        (["run", *base, "--compat", "nvidia", "--driver-name", "gpu.dra.dev", *node], {}),
        (["run", *base, *node], {"DRA_COMPAT": "nvidia", "DRA_DRIVER_NAME": "x.y"}),
        (["run", *base], {"DRA_NODE_NAME": "from-env"}),
        (["run", *base, "--node-name", "n1", "--node-name", "n2"], {}),
    ]
    # Flags the quick reading does not read, and one with a value for the full parser only.
    cases += [
        (["run", *base, *node, "--dynamic-mig", "--shared-gpus=all"], {}),
        (["run", *base, *node, "--metrics-port", "0", "--health-port=0"], {}),
    ]
    return cases


def test_the_quick_reading_agrees_with_the_full_one_or_steps_aside(
    dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    accepted = 0
    for argv, env in _cases(dirs):
        quick = read_socket_settings(argv, env)
        full = _full(argv, env, monkeypatch)
        if quick is not None:
            # Never binds what the full check refuses, and binds what it would.
            assert quick == full, (argv, env)
            accepted += 1
        # The full reading may still refuse; then the quick one said None and `run` reports
        # the error before binding.
    assert accepted >= 12  # the table is not all refusals


def test_it_steps_aside_for_help_typos_and_other_commands(dirs: dict[str, str]) -> None:
    base = [
        "--node-name=n1",
        f"--plugins-dir={dirs['plugins']}",
        f"--registry-dir={dirs['registry']}",
        f"--cdi-root={dirs['cdi']}",
    ]
    assert read_socket_settings(["run", *base], {}) is not None
    for extra in (["--help"], ["-h"], ["--node-nam=x"], ["--bogus"], ["-n", "x"]):
        assert read_socket_settings(["run", *base, *extra], {}) is None, extra
    assert read_socket_settings(["discover", *base], {}) is None
    assert read_socket_settings([], {}) is None


@pytest.mark.parametrize(
    "compat,given,published",
    [
        ("", "gpu.dra.dev", "gpu.dra.dev"),
        ("nvidia", "gpu.dra.dev", "gpu.nvidia.com"),
        ("nvidia", "gpu.nvidia.com", "gpu.nvidia.com"),
    ],
)
def test_compat_names_the_driver_in_both_readings(
    dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch, compat: str, given: str, published: str
) -> None:
    argv = [
        "run",
        "--node-name=n",
        f"--compat={compat}",
        f"--driver-name={given}",
        f"--plugins-dir={dirs['plugins']}",
        f"--registry-dir={dirs['registry']}",
        f"--cdi-root={dirs['cdi']}",
    ]
    quick = read_socket_settings(argv, {})
    assert quick is not None and quick.driver_name == published
    assert quick == _full(argv, {}, monkeypatch)


def test_binding_first_loads_neither_pydantic_nor_yaml() -> None:
    """What ``run`` imports before the sockets exist: the settings model and YAML cost about
    half of the start before them."""
    code = (
        "import sys, dra_driver.cli, dra_driver.launch; "
        "print(sorted(m for m in ('pydantic', 'yaml', 'aiohttp', 'dra_driver.settings', "
        "'dra_driver.commands', 'dra_driver.agent') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
