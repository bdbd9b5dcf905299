"""What ``nvidia-smi -L`` lists: GPUs and their MIG devices, parsed from its text (pure).

``dra-driver hw-check`` compares the project's NVML discovery with this listing, which comes
from NVIDIA's own tool. The lines look like::

    GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5a3c1b8e-...)
      MIG 1g.10gb     Device  0: (UUID: MIG-a6399172-...)
    GPU 1: NVIDIA L4 (UUID: GPU-8d021cad-...)

(drivers before R470 named MIG devices ``MIG-GPU-<uuid>/<gi>/<ci>``; that form parses too).
Without GPUs it prints ``No devices found.``. Any other line is kept as not understood: on
a node with a failing GPU it is where ``nvidia-smi`` says so (``Unable to determine the
device handle for GPU 0000:07:00.0: Unknown Error``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[^)\s]+)\)\s*$")
_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)\s*$")
_NO_DEVICES = re.compile(r"^No devices (were )?found\.?\s*$")


@dataclass(frozen=True)
class SmiMig:
    """One ``  MIG <profile> Device <n>: (UUID: ...)`` line."""

    profile: str
    device: int
    uuid: str


@dataclass(frozen=True)
class SmiGpu:
    """One ``GPU <index>: <name> (UUID: ...)`` line and the MIG lines below it."""

    index: int
    name: str
    uuid: str
    migs: tuple[SmiMig, ...] = ()


@dataclass(frozen=True)
class SmiListing:
    """The parsed listing; ``unknown`` holds the non-empty lines that are neither."""

    gpus: tuple[SmiGpu, ...] = ()
    unknown: tuple[str, ...] = ()
    no_devices: bool = False


def parse_list(text: str) -> SmiListing:
    """Parse the output of ``nvidia-smi -L``."""
    gpus: list[SmiGpu] = []
    unknown: list[str] = []
    no_devices = False
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = _GPU.match(line)
        if gpu:
            gpus.append(SmiGpu(int(gpu.group(1)), gpu.group(2).strip(), gpu.group(3)))
            continue
        mig = _MIG.match(line)
        if mig and gpus:
            parent = gpus[-1]
            entry = SmiMig(mig.group(1), int(mig.group(2)), mig.group(3))
            gpus[-1] = SmiGpu(parent.index, parent.name, parent.uuid, (*parent.migs, entry))
            continue
        if _NO_DEVICES.match(line.strip()):
            no_devices = True
            continue
        unknown.append(line.strip())
    return SmiListing(tuple(gpus), tuple(unknown), no_devices)
