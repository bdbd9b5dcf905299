"""The stand-in NVIDIA driver of the real node, seen from the host: its state files
(tests/driverroot.py, docs/standin-driver.md) and the MPS daemons the driver started.

Tests read what the agent did to the "hardware" here (MIG devices made and destroyed,
time-slices set and reset) and inject what hardware does (Xid events, a GPU falling off the
bus) by writing the files the stand-in libnvidia-ml reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.gpu.sharing import procs
from dra_driver.gpu.sharing.host import MPS_CONTROL


@dataclass
class StandInGpu:
    """One GPU of the data file, with what the agent changed."""

    uuid: str
    minor: int = -1
    mig_mode: int = 0
    timeslice: int = 0
    mig_devices: list[str] = field(default_factory=list)  # MIG UUIDs


@dataclass(frozen=True)
class StandIn:
    """The stand-in driver's state directory on the host (``<node base>/nvml``)."""

    state: Path

    def gpus(self) -> dict[str, StandInGpu]:
        """The GPUs of the data file by UUID, as the stand-in last wrote it."""
        gpus: dict[str, StandInGpu] = {}
        current: StandInGpu | None = None
        for line in (self.state / "nvml-data").read_text().splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "gpu":
                current = gpus.setdefault(words[1], StandInGpu(words[1]))
            elif current is None:
                continue
            elif words[0] == "minor":
                current.minor = int(words[1])
            elif words[0] == "mig":
                current.mig_mode = int(words[1])
            elif words[0] == "timeslice":
                current.timeslice = int(words[1])
            elif words[0] == "ci":
                current.mig_devices.append(words[3])
        return gpus

    def by_minor(self, minor: int) -> StandInGpu:
        return next(g for g in self.gpus().values() if g.minor == minor)

    def mig_devices(self) -> set[str]:
        return {m for g in self.gpus().values() for m in g.mig_devices}

    def inject(self, line: str) -> None:
        """An event the next NVML event wait reports (``<uuid> xid <n>``, ``lost``)."""
        with (self.state / "events").open("a") as events:
            events.write(line + "\n")

    def fail(self, *functions: str) -> None:
        """NVML functions that fail from now on in every program using the stand-in (none:
        all work again)."""
        (self.state / "fail").write_text("".join(f"{f}\n" for f in functions))

    def set_health(self, states: dict[str, str]) -> None:
        """What NVML answers about each GPU's health (``lost``, ``pages-pending``, ...);
        GPUs not named are healthy."""
        text = "".join(f"{uuid} {state}\n" for uuid, state in states.items())
        (self.state / "health").write_text(text)


def mps_daemons(pipe_dir: Path | None = None) -> list[procs.ProcessIdentity]:
    """The MPS control daemons on the host (serving ``pipe_dir`` if given)."""
    found = []
    for pid in procs.pids():
        path = procs.exe(pid)
        if path is None or Path(path.removesuffix(" (deleted)")).name != MPS_CONTROL:
            continue
        if "-d" not in procs.cmdline(pid)[1:]:
            continue
        pipe = procs.environ(pid).get("CUDA_MPS_PIPE_DIRECTORY")
        if pipe_dir is not None and pipe != str(pipe_dir):
            continue
        identity = procs.identify(pid)
        if identity is not None:
            found.append(identity)
    return found
