"""``dra-driver hw-check``: the checks on the node (NVML, ``nvidia-smi``, MIG, MPS).

A thin shell: each step asks the driver through the project's own code (the NVML loader,
discovery, the MIG backend, the sharing backend) and hands what it saw to
:mod:`dra_driver.gpu.hwcheck`, which decides the verdicts. Every step blocks; the command
runs them one after the other. The steps that change the node (``--carve``, ``--mps``)
undo what they did, and say how to undo it by hand when they cannot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pynvml

from dra_driver.errors import DriverError
from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.nvml import SYSFS_ROOT_ENV, NvmlDiscovery, cuda_version_string
from dra_driver.gpu.discovery.nvmllib import (
    LIBRARY,
    SIMULATED_HINT,
    NvmlInitError,
    error_code,
    nvml_init,
    nvml_shutdown,
    nvml_text,
    preload_library,
)
from dra_driver.gpu.driverroot import BIN_DIRS, find_library, tool_env
from dra_driver.gpu.hwcheck import (
    NO_GPUS,
    PASS_CARVE,
    PASS_MPS,
    CarveTarget,
    NvmlUnavailable,
    Report,
    Row,
    carve_ok,
    carve_target,
    destroy_by_hand,
    discovery_row,
    driver_row,
    fail,
    health_row,
    health_types,
    init_failure,
    is_nvidia_gpu,
    leftovers,
    load_failure,
    mig_rows,
    ok,
    skipped,
    smi_result,
    without_nvml,
)
from dra_driver.gpu.hwcheck_smi import SmiListing
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigBackend, MigError
from dra_driver.gpu.mig.nvml import NvmlMig
from dra_driver.gpu.publish.devices import gpu_device_name
from dra_driver.gpu.sharing.backend import MpsDaemon
from dra_driver.gpu.sharing.mps import daemon_for

SMI_TIMEOUT = 30.0
#: How long a stopped MPS daemon may take to go.
MPS_STOP_WAIT = 10.0
MPS_DAEMON_ID = "hw-check"


class MpsControl(Protocol):
    """The part of the sharing backend the MPS check uses."""

    def start_mps(self, daemon: MpsDaemon) -> None: ...

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool: ...

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None: ...


def host_sharing(host_driver_root: Path | None) -> Callable[[Path, Path], MpsControl]:
    """The agent's MPS backend, with the driver root at ``host_driver_root`` on the host (the
    daemon runs there when the check runs in the agent's pod)."""

    def make(mps_root: Path, driver_root: Path) -> MpsControl:
        from dra_driver.gpu.sharing.host import HostSharing

        return HostSharing(mps_root, driver_root, host_driver_root)

    return make


def run_checks(
    driver_root: Path,
    *,
    carve: bool = False,
    mps: bool = False,
    sysfs_root: Path | None = None,
    sharing: Callable[[Path, Path], MpsControl] | None = None,
) -> Report:
    """Run every check; ``sharing(mps_root, driver_root)`` makes the MPS backend (default:
    the agent's, with the driver root at the same path on the host)."""
    sharing = sharing or host_sharing(None)
    if sysfs_root is None:
        sysfs_root = Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")
    driver = _driver(driver_root)
    if isinstance(driver, NvmlUnavailable):
        evidence = gpu_evidence(driver_root, sysfs_root)
        return without_nvml(driver, evidence, carve=carve, mps=mps)
    rows: list[Row] = [driver]
    try:
        inventory = NvmlDiscovery(driver_root=driver_root).discover()
    except DiscoveryError as exc:
        needs = "needs discovery"
        rows.append(fail("discovery", f"NVML discovery failed: {exc}"))
        rows.append(skipped("mig", needs))
        rows.append(skipped("mig-carve", needs if carve else PASS_CARVE))
        rows.append(skipped("mps", needs if mps else PASS_MPS))
    else:
        rows.append(discovery_row(inventory, _smi_listing(driver_root)))
        rows.extend(mig_rows(inventory))
        mig = NvmlMig(driver_root=driver_root)
        rows.append(_carve(inventory, mig) if carve else skipped("mig-carve", PASS_CARVE))
        rows.append(_mps(inventory, driver_root, sharing) if mps else skipped("mps", PASS_MPS))
    rows.extend(_health())
    return Report(rows=tuple(rows))


# -- 1. the driver -------------------------------------------------------------------------


def _driver(driver_root: Path) -> Row | NvmlUnavailable:
    """NVML starts through the project's loader; the driver's versions and GPU count."""
    try:
        preloaded = preload_library(driver_root)
    except OSError as exc:
        path = find_library(driver_root, LIBRARY) or driver_root
        return load_failure(str(path), str(exc))
    try:
        nvml_init()
    except NvmlInitError as exc:
        return init_failure(exc.code, _init_error(exc), str(driver_root))
    try:
        version = nvml_text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return NvmlUnavailable(f"NVML answers nvmlInit but not the next call: {exc}", False)
    finally:
        nvml_shutdown()
    if count == 0:
        return NO_GPUS
    library = str(preloaded) if preloaded else _loaded_library()
    return driver_row(version, cuda_version_string(cuda), count, library)


def _init_error(exc: NvmlInitError) -> str:
    """The loader's words without its advice to the agent (a flag hw-check does not have)."""
    return str(exc).removesuffix(SIMULATED_HINT).strip().rstrip(".")


def _loaded_library() -> str:
    """The file the dynamic loader gave for libnvidia-ml.so.1 (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if "/libnvidia-ml.so" in path:
                    return path
    except OSError:
        pass
    return ""


def gpu_evidence(driver_root: Path, sysfs_root: Path) -> list[str]:
    """What shows an NVIDIA GPU on this node besides NVML: device nodes and PCI functions."""
    found: list[str] = []
    for base in dict.fromkeys((driver_root, Path("/"))):
        dev = base / "dev"
        nodes = [dev / "nvidiactl", *sorted(dev.glob("nvidia[0-9]*"))]
        found.extend(str(n) for n in nodes if n.exists() and str(n) not in found)
    try:
        functions = sorted((sysfs_root / "bus" / "pci" / "devices").iterdir())
    except OSError:
        functions = []
    for function in functions:
        try:
            vendor = (function / "vendor").read_text()
            pci_class = (function / "class").read_text()
        except OSError:
            continue
        if is_nvidia_gpu(vendor, pci_class):
            found.append(f"PCI {function.name}")
    return found


# -- 2. discovery against nvidia-smi -L ------------------------------------------------------


def _tool(driver_root: Path, name: str) -> str | None:
    for directory in BIN_DIRS:
        candidate = driver_root / directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def _tool_env(driver_root: Path) -> dict[str, str]:
    """The environment for the driver's tools (:func:`~dra_driver.gpu.driverroot.tool_env`)."""
    return {**os.environ, **tool_env(driver_root)}


def _smi_listing(driver_root: Path) -> SmiListing | str:
    smi = _tool(driver_root, "nvidia-smi")
    if smi is None:
        return f"nvidia-smi not found in {driver_root}/{{{','.join(BIN_DIRS)}}} or PATH"
    try:
        proc = subprocess.run(
            [smi, "-L"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT,
            env=_tool_env(driver_root),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"{smi} -L did not answer within {SMI_TIMEOUT:.0f} s"
    except OSError as exc:
        return f"{smi} -L: {exc.strerror or exc}"
    return smi_result(proc.returncode, proc.stdout, proc.stderr)


# -- the steps that change the node ----------------------------------------------------------


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """While a step changes the node: SIGTERM and SIGHUP (``kill``, a closed terminal or
    ``kubectl exec`` session) raise KeyboardInterrupt as Ctrl-C does, so that the step undoes
    its change before the command ends rather than die with it in place."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


# -- 3. MIG: carve one device ----------------------------------------------------------------


def _carve(inventory: Inventory, mig: MigBackend) -> Row:
    """Create a MIG device of the smallest profile where there is room, then destroy it."""
    gpus = []
    for gpu in inventory.gpus:
        if not gpu.mig_enabled:
            continue
        try:
            gpus.append((gpu, mig.list(gpu)))
        except MigError as exc:
            return fail("mig-carve", f"listing GPU instances failed: {exc}", gpu_device_name(gpu))
    target = carve_target(gpus)
    if isinstance(target, str):
        return skipped("mig-carve", target)
    with _interruptible():
        return _carve_at(target, mig)


def _carve_at(target: CarveTarget, mig: MigBackend) -> Row:
    try:
        device = mig.create(target.gpu, target.profile, target.start)
    except MigError as exc:
        undone = _undo(mig, target)
        return fail("mig-carve", f"creating {target.what} failed: {exc}{undone}", target.device)
    try:
        mig.destroy(target.gpu, device.gpu_instance_id)
        left = leftovers(target, mig.list(target.gpu), device)
    except MigError as exc:
        return fail(
            "mig-carve",
            f"created {target.what} ({device.uuid}) but destroying it failed: {exc}; "
            f"destroy it by hand: {destroy_by_hand(target.gpu, device.gpu_instance_id)}",
            target.device,
        )
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM, SIGHUP): the MIG device must not outlive the check.
        with contextlib.suppress(MigError):
            mig.destroy(target.gpu, device.gpu_instance_id)
        raise
    if left:
        return fail(
            "mig-carve",
            f"created {target.what} ({device.uuid}) and destroyed it, but GPU instance(s) "
            f"{', '.join(map(str, left))} remain: "
            + "; ".join(destroy_by_hand(target.gpu, gi) for gi in left),
            target.device,
        )
    return carve_ok(target, device)


def _undo(mig: MigBackend, target: CarveTarget) -> str:
    """Destroy what a failed create left behind (a GPU instance without its compute
    instance); the words to add to the failure."""
    try:
        left = leftovers(target, mig.list(target.gpu))
        for gi in left:
            mig.destroy(target.gpu, gi)
    except MigError as exc:
        index = target.gpu.index
        return f"; what it left may remain ({exc}): see nvidia-smi mig -i {index} -lgi"
    return f"; removed the GPU instance(s) it left: {', '.join(map(str, left))}" if left else ""


# -- 4. MPS ----------------------------------------------------------------------------------


def _mps(
    inventory: Inventory, driver_root: Path, sharing: Callable[[Path, Path], MpsControl]
) -> Row:
    """Start an MPS control daemon for the first GPU, then stop it."""
    if not inventory.gpus:
        return skipped("mps", "no GPU")
    gpu = inventory.gpus[0]
    device = gpu_device_name(gpu)
    # Short: the pipe directory holds UNIX sockets, whose paths must stay under 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="dra-hw-check-"))
    mps_root = base / "mps"
    daemon = daemon_for(mps_root, MPS_DAEMON_ID, [gpu.uuid])
    backend = sharing(mps_root, driver_root)
    with _interruptible():
        try:
            return _start_and_stop(backend, daemon, base, device)
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM, SIGHUP): the daemon, started in a session and
            # cgroup of its own, would outlive the check.
            _stop_quietly(backend, daemon)
            with contextlib.suppress(DriverError, OSError):
                if not backend.mps_running(daemon.daemon_id, daemon.pipe_dir):
                    shutil.rmtree(base, ignore_errors=True)
            raise


def _start_and_stop(backend: MpsControl, daemon: MpsDaemon, base: Path, device: str) -> Row:
    try:
        backend.start_mps(daemon)
        started = backend.mps_running(daemon.daemon_id, daemon.pipe_dir)
    except (DriverError, OSError) as exc:
        _stop_quietly(backend, daemon)
        detail = f"starting an MPS control daemon failed: {exc}{_keep_log(base, daemon)}"
        return fail("mps", detail, device)
    if not started:
        _stop_quietly(backend, daemon)
        detail = f"MPS control daemon started but not running{_keep_log(base, daemon)}"
        return fail("mps", detail, device)
    try:
        backend.stop_mps(daemon.daemon_id, daemon.pipe_dir)
    except (DriverError, OSError) as exc:
        detail = (
            f"started an MPS control daemon but stopping it failed: {exc} (stop it: echo quit "
            f"| CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir} nvidia-cuda-mps-control)"
        )
        return fail("mps", detail, device)
    if not _gone(backend, daemon):
        return fail(
            "mps",
            f"MPS control daemon still runs {MPS_STOP_WAIT:.0f} s after stop "
            f"(pipe directory {daemon.pipe_dir})",
            device,
        )
    shutil.rmtree(base, ignore_errors=True)
    return ok("mps", "started an MPS control daemon and stopped it", device)


def _keep_log(base: Path, daemon: MpsDaemon) -> str:
    """After a failed start: keep the daemon's log when it wrote one (and say where), else
    remove the temporary directory."""
    try:
        logged = any(p.is_file() and p.stat().st_size for p in daemon.log_dir.iterdir())
    except OSError:
        logged = False
    if logged:
        return f" (its log: {daemon.log_dir})"
    shutil.rmtree(base, ignore_errors=True)
    return ""


def _stop_quietly(backend: MpsControl, daemon: MpsDaemon) -> None:
    with contextlib.suppress(DriverError, OSError):
        backend.stop_mps(daemon.daemon_id, daemon.pipe_dir)


def _gone(backend: MpsControl, daemon: MpsDaemon) -> bool:
    deadline = time.monotonic() + MPS_STOP_WAIT
    while backend.mps_running(daemon.daemon_id, daemon.pipe_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -- 5. health events ------------------------------------------------------------------------


def _health() -> list[Row]:
    """An NVML event set, and each GPU registered for Xid events as the agent does."""
    try:
        nvml_init()
    except NvmlInitError as exc:
        return [fail("health", init_failure(exc.code, _init_error(exc)).reason)]
    try:
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            return [fail("health", f"cannot create an NVML event set: {exc}")]
        try:
            return [_register(index, events) for index in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            return [fail("health", f"NVML nvmlDeviceGetCount failed: {exc}")]
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(events)
    finally:
        nvml_shutdown()


def _register(index: int, events: Any) -> Row:
    device = f"GPU {index}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        device = f"gpu-{int(pynvml.nvmlDeviceGetMinorNumber(handle))}"
        supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
    except pynvml.NVMLError as exc:
        return health_row(device, f"{exc} (NVML error {error_code(exc)})", None)
    registered = None
    types = health_types(supported)
    if types:
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, types, events)
        except pynvml.NVMLError as exc:
            registered = str(exc)
    return health_row(device, supported, registered)
