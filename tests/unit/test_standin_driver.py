"""The stand-in NVIDIA driver root (``python -m tests.driverroot DIR --nvml STATE_DIR``,
docs/standin-driver.md): what the real-node tier's NVML backend runs against.

The driver root is built once (into a short directory under /tmp: unix socket paths are
limited); each test gets its own copy of the mutable state. NVML discovery runs in a fresh
Python process, as pynvml loads its library once per process. The MPS tests start real
daemons: every process they start is killed in a finalizer, found by its pipe directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.gpu.container.elf import soname
from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.sharing.host import HostSharing, timeslice_failed
from tests.driverroot import (
    BINARIES,
    NODE_NAME,
    NVML_DATA,
    NVML_EVENTS,
    NVML_HEALTH,
    PROFILE,
    SYSFS_DIR,
    VERSION,
    compiler,
    nvml_env,
)
from tests.fakenvml.build import static_libc

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30


@dataclass(frozen=True)
class StandIn:
    root: Path
    state: Path  # the state the CLI made: copy it before changing anything
    cli_stdout: str

    @property
    def bin(self) -> Path:
        return self.root / "usr/bin"

    @property
    def libs(self) -> Path:
        return self.root / f"usr/lib/{os.uname().machine}-linux-gnu"


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler for the stand-in driver")
    base = Path(tempfile.mkdtemp(prefix="sdr", dir="/tmp"))
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.driverroot",
            str(base / "root"),
            "--nvml",
            str(base / "state"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    yield StandIn(root=base / "root", state=base / "state", cli_stdout=made.stdout)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def state(standin: StandIn, tmp_path: Path) -> Path:
    """This test's own copy of the stand-in's state."""
    copy = tmp_path / "state"
    shutil.copytree(standin.state, copy, symlinks=True)
    return copy


def tool_env(state: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAKE_NVML_", "CUDA_MPS_", "DRA_")) and k != "LD_LIBRARY_PATH"
    }
    env.update(nvml_env(state))
    env.update(extra)
    return env


def run(
    argv: list[str | Path], env: dict[str, str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def expected_inventory() -> Inventory:
    return build_inventory(load_profile(PROFILE), NODE_NAME)


def gpu_sections(data: str) -> dict[str, list[str]]:
    """The data file's records by GPU UUID."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in data.splitlines():
        word, _, rest = line.partition(" ")
        if word == "gpu":
            current = out.setdefault(rest, [])
        elif current is not None:
            current.append(line)
    return out


def has_interpreter(path: Path) -> bool:
    """Whether an ELF executable names a dynamic loader (a PT_INTERP program header)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    return 3 in types


# -- the driver root ------------------------------------------------------------------------


def test_cli_makes_the_standin_driver_root(standin: StandIn) -> None:
    lines = standin.cli_stdout.splitlines()
    assert len(lines) == 1 and "stand-in NVIDIA driver" in lines[0], standin.cli_stdout
    real = standin.libs / f"libnvidia-ml.so.{VERSION}"
    assert (standin.libs / "libnvidia-ml.so.1").readlink() == Path(real.name)
    assert soname(real) == "libnvidia-ml.so.1"
    for name in BINARIES:
        tool = standin.bin / name
        assert tool.read_bytes()[:4] == b"\x7fELF", name
        assert os.access(tool, os.X_OK), name
        # Static where libc.a exists: the same file runs in any container that mounts it.
        assert has_interpreter(tool) is not static_libc(compiler() or "cc"), name
    assert (standin.state / NVML_DATA).read_text().startswith("# fakenvml data")
    assert (standin.state / NVML_EVENTS).read_text() == ""
    assert (standin.state / NVML_HEALTH).read_text() == ""
    assert (standin.state / SYSFS_DIR / "bus/pci/devices/0000:07:00.0/numa_node").exists()
    ran = run([standin.bin / "nvidia-debugdump"], tool_env(standin.state))
    assert ran.stdout == f"nvidia-debugdump {VERSION}\n"


def test_cli_failure_is_one_line(tmp_path: Path) -> None:
    if compiler() is None:
        pytest.skip("no C compiler")
    made = subprocess.run(
        [sys.executable, "-m", "tests.driverroot", str(tmp_path / "r"), "--nvml",
         str(tmp_path / "s"), "--profile", "no-such-profile"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode != 0
    assert made.stdout == ""
    assert len(made.stderr.strip().splitlines()) == 1, made.stderr
    assert "no-such-profile" in made.stderr


_DISCOVER = """
import json, sys
from pathlib import Path
from dra_driver.gpu.discovery.nvml import NvmlDiscovery
inventory = NvmlDiscovery(sysfs_root=Path(sys.argv[2]), driver_root=Path(sys.argv[1])).discover()
maps = Path("/proc/self/maps").read_text().splitlines()
loaded = sorted({line.split()[-1] for line in maps if "libnvidia-ml" in line})
print(json.dumps({"inventory": inventory.model_dump(mode="json"), "loaded": loaded}))
"""


def test_nvml_discovery_through_the_driver_root_matches_the_profile(
    standin: StandIn, state: Path
) -> None:
    """The agent's NVML backend loads the driver root's library (nvmllib.preload_library, no
    LD_LIBRARY_PATH) and finds the simulated profile's node, field for field."""
    ran = run([sys.executable, "-c", _DISCOVER, standin.root, state / SYSFS_DIR], tool_env(state))
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["loaded"] == [str(standin.libs / f"libnvidia-ml.so.{VERSION}")]
    got = Inventory.model_validate(out["inventory"])
    assert got == expected_inventory()


# -- nvidia-smi -----------------------------------------------------------------------------


def test_nvidia_smi_lists_the_gpus_and_their_mig_devices(standin: StandIn, state: Path) -> None:
    ran = run([standin.bin / "nvidia-smi", "-L"], tool_env(state))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    expected = []
    for gpu in expected_inventory().gpus:
        expected.append(f"GPU {gpu.index}: {gpu.product_name} (UUID: {gpu.uuid})")
        for k, mig in enumerate(gpu.mig_devices):
            expected.append(f"  MIG {mig.profile_name:<11} Device {k:>2}: (UUID: {mig.uuid})")
    assert ran.stdout.splitlines() == expected
    assert "  MIG 3g.40gb     Device  0: (UUID: MIG-" in ran.stdout  # the real layout


def test_nvidia_smi_table_version_and_missing_driver(standin: StandIn, state: Path) -> None:
    smi = standin.bin / "nvidia-smi"
    table = run([smi], tool_env(state))
    assert table.returncode == 0
    assert f"Driver Version: {VERSION}" in table.stdout
    assert "NVIDIA A100-SXM4-80GB" in table.stdout and "00000000:81:00.0" in table.stdout
    version = run([smi, "--version"], tool_env(state))
    assert f"DRIVER version      : {VERSION}" in version.stdout.splitlines()
    assert run([smi, "-h"], tool_env(state)).returncode == 0
    bad = run([smi, "--no-such-option"], tool_env(state))
    assert bad.returncode == 2 and "Invalid combination" in bad.stdout
    # Without its data file the stand-in NVML cannot "talk to the driver".
    env = tool_env(state)
    del env["FAKE_NVML_DATA"]
    gone = run([smi], env)
    assert gone.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in gone.stdout


def test_set_timeslice_is_kept_in_the_data_file(standin: StandIn, state: Path) -> None:
    smi, env = standin.bin / "nvidia-smi", tool_env(state)
    gpus = expected_inventory().gpus
    target = gpus[2].uuid
    # The agent's command line (dra_driver/gpu/sharing/host.py).
    ran = run([smi, "compute-policy", "-i", target, "--set-timeslice=2"], env)
    output = (ran.stdout + ran.stderr).strip()
    assert not timeslice_failed(ran.returncode, output), output
    assert output == "Set timeslice to MEDIUM (2) for GPU 00000000:43:00.0."
    sections = gpu_sections((state / NVML_DATA).read_text())
    assert "timeslice 2" in sections[target]
    assert not any(r.startswith("timeslice") for u, s in sections.items() if u != target for r in s)

    listed = run([smi, "compute-policy", "-l"], env)
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == [
        f"GPU {g.index} (UUID: {g.uuid}): Timeslice: "
        + ("MEDIUM (2)" if g.uuid == target else "DEFAULT (0)")
        for g in gpus
    ]
    by_index = run([smi, "compute-policy", "-i", "2", "--list"], env)
    assert by_index.stdout.strip().endswith("Timeslice: MEDIUM (2)")
    query = run(
        [smi, "-i", target, "--query-gpu=uuid,compute_mode,timeslice", "--format=csv,noheader"],
        env,
    )
    assert query.stdout == f"{target}, Default, 2\n"

    # Refusals the agent must notice.
    unknown = run([smi, "compute-policy", "-i", "GPU-nope", "--set-timeslice=1"], env)
    assert timeslice_failed(unknown.returncode, unknown.stdout + unknown.stderr)
    assert unknown.returncode == 6 and "No devices were found" in unknown.stdout
    mig = gpus[0].mig_devices[0].uuid
    on_mig = run([smi, "compute-policy", "-i", mig, "--set-timeslice=1"], env)
    assert timeslice_failed(on_mig.returncode, on_mig.stdout + on_mig.stderr)
    assert run([smi, "compute-policy", "-i", target, "--set-timeslice=7"], env).returncode == 2
    lost = state / NVML_HEALTH
    lost.write_text(f"{target} lost\n")
    on_lost = run([smi, "compute-policy", "-i", target, "--set-timeslice=1"], env)
    assert on_lost.returncode == 15 and "GPU is lost" in on_lost.stdout
    injected = tool_env(state, FAKE_NVML_FAIL="fakenvmlDeviceSetTimeslice=999")
    lost.write_text("")
    failed = run([smi, "compute-policy", "-i", target, "--set-timeslice=1"], injected)
    assert failed.returncode == 255 and "Failed to set timeslice" in failed.stdout
    assert "timeslice 2" in gpu_sections((state / NVML_DATA).read_text())[target]


def test_the_agent_sets_and_resets_the_timeslice(
    standin: StandIn, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HostSharing runs the driver root's nvidia-smi as on a GPU node."""
    for key, value in nvml_env(state).items():
        monkeypatch.setenv(key, value)
    sharing = HostSharing(mps_root=tmp_path / "mps", driver_root=standin.root)
    uuid = expected_inventory().gpus[3].uuid
    sharing.set_timeslice(uuid, "Long")
    assert "timeslice 3" in gpu_sections((state / NVML_DATA).read_text())[uuid]
    sharing.reset_timeslice(uuid)
    assert "timeslice 0" in gpu_sections((state / NVML_DATA).read_text())[uuid]


def test_compute_mode(standin: StandIn, state: Path) -> None:
    smi, env = standin.bin / "nvidia-smi", tool_env(state)
    gpus = expected_inventory().gpus
    ran = run([smi, "-i", "0,00000000:1B:00.0", "-c", "EXCLUSIVE_PROCESS"], env)
    assert ran.returncode == 0, ran.stdout
    assert ran.stdout.splitlines()[-1] == "All done."
    assert run([smi, "-i", "3", "--compute-mode=2"], env).returncode == 0
    sections = gpu_sections((state / NVML_DATA).read_text())
    assert "computemode 3" in sections[gpus[0].uuid] and "computemode 3" in sections[gpus[1].uuid]
    assert "computemode 2" in sections[gpus[3].uuid]
    query = run([smi, "--query-gpu=index,compute_mode", "--format=csv"], env)
    assert query.stdout.splitlines() == [
        "index, compute_mode",
        "0, Exclusive_Process",
        "1, Exclusive_Process",
        "2, Default",
        "3, Prohibited",
    ]
    assert run([smi, "-c", "1"], env).returncode == 2  # EXCLUSIVE_THREAD: long gone
    bad_field = run([smi, "--query-gpu=uuid,nonsense", "--format=csv"], env)
    assert bad_field.returncode == 2 and '"nonsense"' in bad_field.stdout


_LONG_RUNNING = """
import subprocess, sys
import pynvml
pynvml.nvmlInit()  # holds the data file in memory from here on
subprocess.run(sys.argv[2:], check=True, capture_output=True)  # nvidia-smi changes the file
handle = pynvml.nvmlDeviceGetHandleByIndex(2)
pynvml.nvmlDeviceSetMigMode(handle, int(sys.argv[1]))  # then this process saves a MIG change
print(pynvml.nvmlDeviceGetComputeMode(handle))
pynvml.nvmlShutdown()
"""


def test_a_long_running_nvml_user_keeps_what_nvidia_smi_set(standin: StandIn, state: Path) -> None:
    uuid = expected_inventory().gpus[2].uuid
    smi = [str(standin.bin / "nvidia-smi"), "-i", uuid]
    env = tool_env(state, LD_LIBRARY_PATH=str(standin.libs))
    ran = run([sys.executable, "-c", _LONG_RUNNING, "1", *smi, "--compute-mode=3"], env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "3\n"  # read from the file, not the stale copy in memory
    section = gpu_sections((state / NVML_DATA).read_text())[uuid]
    assert "mig 1 1" in section and "computemode 3" in section
    ran = run([sys.executable, "-c", _LONG_RUNNING, "0", *smi, "-c", "0"], env)
    assert ran.returncode == 0, ran.stderr
    section = gpu_sections((state / NVML_DATA).read_text())[uuid]
    assert "mig 0 0" in section and "computemode 0" in section


# -- MPS ------------------------------------------------------------------------------------


@dataclass
class Mps:
    control: Path
    pipe: Path
    log: Path
    env: dict[str, str]

    def send(self, *commands: str) -> subprocess.CompletedProcess[str]:
        return run([self.control], self.env, stdin="".join(c + "\n" for c in commands))

    def daemon_pid(self) -> int:
        return int((self.pipe / "nvidia-cuda-mps-control.pid").read_text())

    def log_lines(self, name: str = "control.log") -> list[str]:
        """The log's messages, without the "[<time> Control <pid>] " prefix."""
        text = (self.log / name).read_text()
        return [line.split("] ", 1)[1] for line in text.splitlines()]


def _pids_with_pipe_dir(pipe: Path) -> list[int]:
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by its new parent counts)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat_line.rsplit(")", 1)[1].split()[0] == "Z"


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and fields[1] == str(pid):
            out.append(int(entry.name))
    return out


@pytest.fixture
def mps(standin: StandIn, state: Path) -> Iterator[Mps]:
    base = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # short: unix socket path
    pipe, log = base / "pipe", base / "log"
    env = tool_env(state, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    yield Mps(control=standin.bin / "nvidia-cuda-mps-control", pipe=pipe, log=log, env=env)
    # Whatever a test started (daemon, server, client) and left behind.
    for pid in _pids_with_pipe_dir(pipe):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def test_mps_daemon_lifecycle(mps: Mps) -> None:
    started = run([mps.control, "-d"], mps.env)  # returns: the daemon let go of its pipes
    assert started.returncode == 0, started.stderr
    assert started.stdout == started.stderr == ""
    daemon = mps.daemon_pid()
    assert stat.S_ISSOCK((mps.pipe / "control").stat().st_mode)
    # What the agent identifies it by, and what ps shows.
    assert Path(os.readlink(f"/proc/{daemon}/exe")).name == "nvidia-cuda-mps-control"
    assert Path(f"/proc/{daemon}/cmdline").read_bytes().split(b"\0")[1] == b"-d"
    environ = Path(f"/proc/{daemon}/environ").read_bytes().split(b"\0")
    assert f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe}".encode() in environ
    assert os.getsid(daemon) == daemon  # a session of its own
    (server,) = children(daemon)
    assert Path(os.readlink(f"/proc/{server}/exe")).name == "nvidia-cuda-mps-server"
    assert Path(f"/proc/{server}/comm").read_text() == "nvidia-cuda-mps\n"  # 15 characters
    assert mps.send("get_server_list").stdout == f"{server}\n"

    assert run([mps.control, "-d"], mps.env).stderr.startswith("An instance of this daemon")

    ok = mps.send(
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
        "get_default_active_thread_percentage",
        "get_default_device_pinned_mem_limit 0",
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ["50.0", "50.0", "10240M"]
    refused = mps.send("set_default_active_thread_percentage 150")
    assert refused.returncode == 1 and "Invalid active thread percentage" in refused.stderr
    assert mps.send("set_default_device_pinned_mem_limit 0 lots").returncode == 1
    assert mps.send("get_default_active_thread_percentage").stdout == "50.0\n"
    lines = mps.log_lines()
    assert lines[0] == f"Starting control daemon using socket {mps.pipe}/control"
    assert "set_default_active_thread_percentage 50" in lines
    assert "set_default_device_pinned_mem_limit 0 10240M" in lines
    assert any(
        line.startswith("set_default_active_thread_percentage 150: refused") for line in lines
    )

    quit = mps.send("quit")
    assert quit.returncode == 0, quit.stderr
    # Acknowledged after the server was stopped and the files removed.
    assert gone(server)
    assert not (mps.pipe / "control").exists()
    assert not (mps.pipe / "nvidia-cuda-mps-control.pid").exists()
    wait_for(lambda: gone(daemon), "the daemon to exit")
    assert mps.log_lines()[-2:] == [f"Server {server} exited with status 0", "Exit"]
    server_log = mps.log_lines("server.log")
    assert server_log[0].startswith("Startup") and "shutting down" in server_log[-1]


def test_mps_client_without_a_daemon(mps: Mps) -> None:
    ran = mps.send("quit")
    assert ran.returncode == 1
    assert ran.stderr == "Cannot find MPS control daemon process\n"


def test_mps_daemon_quits_on_sigterm(mps: Mps) -> None:
    assert run([mps.control, "-d"], mps.env).returncode == 0
    daemon = mps.daemon_pid()
    (server,) = children(daemon)
    os.kill(daemon, signal.SIGTERM)
    wait_for(lambda: gone(daemon) and gone(server), "daemon and server to exit")
    assert not (mps.pipe / "control").exists()
    assert mps.log_lines()[-1] == "Exit"


def test_mps_server_dies_with_a_killed_daemon_and_a_new_daemon_starts(mps: Mps) -> None:
    assert run([mps.control, "-d"], mps.env).returncode == 0
    daemon = mps.daemon_pid()
    (server,) = children(daemon)
    os.kill(daemon, signal.SIGKILL)
    wait_for(lambda: gone(daemon) and gone(server), "daemon and server to die")
    assert mps.send("get_server_list").returncode == 1  # its socket is left, nobody answers
    restarted = run([mps.control, "-d"], mps.env)
    assert restarted.returncode == 0, restarted.stderr
    assert mps.daemon_pid() != daemon
    assert mps.send("quit").returncode == 0


def test_mps_daemon_in_the_foreground(mps: Mps) -> None:
    proc = subprocess.Popen(
        [str(mps.control), "-f"],
        env=mps.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # It listens, then writes its pid file: both, before the pid is read.
        pid_file = mps.pipe / "nvidia-cuda-mps-control.pid"
        wait_for(
            lambda: (mps.pipe / "control").exists() and pid_file.exists(),
            "the foreground daemon to listen",
        )
        assert mps.daemon_pid() == proc.pid
        assert mps.send("quit").returncode == 0
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert "Starting control daemon using socket" in stderr
    assert re.search(r"\] Exit$", stderr.strip())
