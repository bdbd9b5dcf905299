"""``dra-driver hw-check``: the decisions of the pre-flight on a GPU node (pure).

The checks themselves (NVML sessions, ``nvidia-smi``, MIG and MPS steps) run in
:mod:`dra_driver.gpu.hwcheck_probe`; everything they observe comes here to become rows of
the report: one row per check (and per GPU where a check is per GPU), each ``ok``, ``fail``
or ``skipped`` with a short detail. The run fails when one row fails.

**No GPU.** The whole run is skipped, with one line and success, only when NVML offers no
GPU *and* nothing else on the node shows one:

- NVML offers no GPU: libnvidia-ml cannot be found or loaded, ``nvmlInit`` says the kernel
  driver is not loaded (or the library is missing), or NVML initialises and counts no GPU;
- nothing shows one: no ``/dev/nvidiactl`` or ``/dev/nvidia<N>`` (under the driver root or
  ``/``) and no NVIDIA display or 3D controller on the PCI bus (vendor ``0x10de``, class
  ``0x03xxxx`` in sysfs; NVSwitches and audio functions do not count).

Anything else NVML answers at start (no permission, driver/library version mismatch, an
unknown error), and any of the reasons above on a node that does show a GPU (a container
without the driver root mounted, a driver that failed to load), is a failed driver check:
a GPU node that cannot run the agent must not pass its pre-flight.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dra_driver.gpu.hwcheck_smi import SmiListing, parse_list
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, MigProfile
from dra_driver.gpu.mig.backend import Instance, MigError, check_create
from dra_driver.gpu.publish.devices import gpu_device_name, mig_device_name
from dra_driver.output import table

Verdict = Literal["ok", "fail", "skipped"]

#: NVML error codes (nvml.h) meaning "there is no driver here" rather than "it is broken".
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
#: ... and one whose fix the admin has to be told.
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
#: nvmlEventType_t bits (nvml.h) the agent's health watcher registers for.
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8

#: At most this many differences are spelt out in one detail.
MAX_DIFFERENCES = 4

PASS_CARVE = "pass --carve (creates and destroys one MIG device)"
PASS_MPS = "pass --mps (starts and stops one MPS control daemon)"


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    check: str  # driver, discovery, mig, mig-carve, mps, health
    device: str  # the device it is about (gpu-<minor>), or ""
    verdict: Verdict
    detail: str

    @property
    def name(self) -> str:
        """The check and its device, as the table shows them."""
        return f"{self.check} {self.device}".strip()


def ok(check: str, detail: str, device: str = "") -> Row:
    """A passed check."""
    return Row(check, device, "ok", detail)


def fail(check: str, detail: str, device: str = "") -> Row:
    """A failed check."""
    return Row(check, device, "fail", detail)


def skipped(check: str, detail: str, device: str = "") -> Row:
    """A check that did not run, and why."""
    return Row(check, device, "skipped", detail)


@dataclass(frozen=True)
class Report:
    """The rows, or why the whole run was skipped (no NVIDIA GPU)."""

    rows: tuple[Row, ...] = ()
    skipped: str = ""

    @property
    def failed(self) -> bool:
        """Whether a check failed: the command then exits 1."""
        return any(r.verdict == "fail" for r in self.rows)

    @property
    def verdict(self) -> Verdict:
        """The run's verdict."""
        if self.skipped:
            return "skipped"
        return "fail" if self.failed else "ok"


# -- no GPU, or a broken driver -------------------------------------------------------------


@dataclass(frozen=True)
class NvmlUnavailable:
    """Why NVML offers no GPU: ``absent`` when the reason means "no driver or no GPU here"."""

    reason: str
    absent: bool


def init_failure(code: int, message: str, driver_root: str = "/") -> NvmlUnavailable:
    """What an ``nvmlInit`` failure (NVML error ``code``, the loader's ``message``) means."""
    where = "" if driver_root == "/" else f" in the driver root {driver_root} or the library path"
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlUnavailable(f"libnvidia-ml.so.1 not found{where}", absent=True)
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlUnavailable("nvmlInit: the NVIDIA kernel driver is not loaded", absent=True)
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        # The usual state right after a driver upgrade, when the pre-flight is run.
        return NvmlUnavailable(
            "nvmlInit: libnvidia-ml and the loaded NVIDIA kernel module are of different "
            "driver versions (upgraded without a reboot?): reboot the node, or unload and "
            "reload the nvidia kernel modules",
            absent=False,
        )
    return NvmlUnavailable(message, absent=False)


def load_failure(path: str, error: str) -> NvmlUnavailable:
    """The driver root's libnvidia-ml exists but the dynamic loader refused it."""
    return NvmlUnavailable(f"cannot load {path}: {error}", absent=True)


NO_GPUS = NvmlUnavailable("NVML counts no GPU", absent=True)


def is_nvidia_gpu(vendor: str, pci_class: str) -> bool:
    """Whether a PCI function (sysfs ``vendor`` and ``class``) is an NVIDIA GPU."""
    return vendor.strip().lower() == "0x10de" and pci_class.strip().lower().startswith("0x03")


def without_nvml(
    unavailable: NvmlUnavailable, evidence: Sequence[str], *, carve: bool, mps: bool
) -> Report:
    """The report when NVML offers no GPU: skipped when nothing shows one, else a failure.

    ``evidence`` lists what shows a GPU (device nodes, PCI functions), empty when nothing.
    """
    if unavailable.absent and not evidence:
        return Report(skipped=f"no NVIDIA GPU ({unavailable.reason})")
    detail = unavailable.reason
    if evidence:
        more = len(evidence) - 3
        shown = ", ".join(evidence[:3]) + (f" and {more} more" if more > 0 else "")
        detail += f"; but the node shows an NVIDIA GPU: {shown}"
        if unavailable.absent:
            detail += " (is the driver loaded, and --driver-root where its files are?)"
    needs = "needs a working NVML"
    return Report(
        rows=(
            fail("driver", detail),
            skipped("discovery", needs),
            skipped("mig", needs),
            skipped("mig-carve", needs if carve else PASS_CARVE),
            skipped("mps", needs if mps else PASS_MPS),
            skipped("health", needs),
        )
    )


def driver_row(driver: str, cuda: str, gpus: int, library: str) -> Row:
    """NVML initialised: the driver's versions, the GPU count and which library answered."""
    count = f"{gpus} GPU" + ("" if gpus == 1 else "s")
    where = f" ({library})" if library else ""
    return ok("driver", f"NVIDIA driver {driver}, CUDA {cuda}, {count}{where}")


# -- discovery against nvidia-smi -L -------------------------------------------------------


def smi_result(returncode: int, stdout: str, stderr: str) -> SmiListing | str:
    """The parsed listing of ``nvidia-smi -L``, or why it failed."""
    listing = parse_list(stdout)
    # Without GPUs nvidia-smi says so and exits non-zero: that is an answer.
    if returncode == 0 or (listing.no_devices and not listing.gpus):
        return listing
    lines = (stderr.strip() or stdout.strip()).splitlines()
    last = lines[-1].strip() if lines else "no output"
    return f"nvidia-smi -L failed (exit status {returncode}): {last}"


#: How nvidia-smi names a MIG device whose compute instance is smaller than its GPU
#: instance: compute slices first (``1c.3g.40gb``; a spanning one is just ``3g.40gb``).
_SPLIT_PROFILE = re.compile(r"^\d+c\.")


def split_migs(inventory: Inventory, listing: SmiListing) -> list[str]:
    """The MIG devices ``nvidia-smi -L`` lists as compute instances smaller than their GPU
    instance and discovery leaves out, as it does by design (docs/reliability.md): not a
    difference, since the agent runs all the same."""
    found = {m.uuid for g in inventory.gpus for m in g.mig_devices}
    return [
        m.uuid
        for sg in listing.gpus
        for m in sg.migs
        if _SPLIT_PROFILE.match(m.profile) and m.uuid not in found
    ]


def listing_differences(inventory: Inventory, listing: SmiListing) -> list[str]:
    """How discovery's GPUs and MIG devices differ from ``nvidia-smi -L``'s; empty: none."""
    found = {g.uuid: g for g in inventory.gpus}
    listed = {g.uuid: g for g in listing.gpus}
    split = set(split_migs(inventory, listing))
    out: list[str] = []
    for uuid, sg in listed.items():
        gpu = found.get(uuid)
        if gpu is None:
            out.append(f"nvidia-smi -L lists GPU {sg.index} {uuid} that discovery does not find")
        elif gpu.index != sg.index:
            out.append(f"{uuid} is GPU {sg.index} to nvidia-smi -L, GPU {gpu.index} to discovery")
    out.extend(
        f"discovery finds {gpu_device_name(g)} {g.uuid} that nvidia-smi -L does not list"
        for g in inventory.gpus
        if g.uuid not in listed
    )
    mig_found = {m.uuid: g for g in inventory.gpus for m in g.mig_devices}
    mig_listed = {m.uuid: sg for sg in listing.gpus for m in sg.migs if m.uuid not in split}
    for uuid, sg in mig_listed.items():
        parent = mig_found.get(uuid)
        if parent is None:
            out.append(
                f"nvidia-smi -L lists MIG device {uuid} on GPU {sg.index} "
                "that discovery does not find"
            )
        elif parent.uuid != sg.uuid:
            out.append(
                f"MIG device {uuid} is on GPU {sg.index} to nvidia-smi -L but on "
                f"{gpu_device_name(parent)} to discovery"
            )
    out.extend(
        f"discovery finds MIG device {m.uuid} on {gpu_device_name(g)} "
        "that nvidia-smi -L does not list"
        for g in inventory.gpus
        for m in g.mig_devices
        if m.uuid not in mig_listed
    )
    out.extend(f"nvidia-smi -L printed {line!r}" for line in listing.unknown)
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def discovery_row(inventory: Inventory, listing: SmiListing | str) -> Row:
    """Discovery found what ``nvidia-smi -L`` lists (same GPU and MIG device UUIDs)."""
    gpus = len(inventory.gpus)
    migs = sum(len(g.mig_devices) for g in inventory.gpus)
    found = f"{_count(gpus, 'GPU')}, {_count(migs, 'MIG device')}"
    if isinstance(listing, str):
        return fail("discovery", f"found {found}; cannot compare: {listing}")
    differences = listing_differences(inventory, listing)
    if not differences:
        split = split_migs(inventory, listing)
        if not split:
            return ok("discovery", f"{found}, the same as nvidia-smi -L")
        more = len(split) - MAX_DIFFERENCES
        shown = ", ".join(split[:MAX_DIFFERENCES]) + (f" and {more} more" if more > 0 else "")
        return ok(
            "discovery",
            f"{found}, the same as nvidia-smi -L but for {_count(len(split), 'MIG device')} "
            f"split into compute instances, which the agent does not publish: {shown}",
        )
    shown = "; ".join(differences[:MAX_DIFFERENCES])
    more = len(differences) - MAX_DIFFERENCES
    return fail("discovery", shown + (f" (and {more} more)" if more > 0 else ""))


# -- MIG -------------------------------------------------------------------------------------


def _mode(on: bool) -> str:
    return "on" if on else "off"


def mig_rows(inventory: Inventory) -> list[Row]:
    """Per GPU: MIG capability and mode; a mode change waiting for a reset fails."""
    rows = []
    for gpu in inventory.gpus:
        name, device, state = gpu.product_name, gpu_device_name(gpu), gpu.mig
        if not state.capable:
            rows.append(ok("mig", f"{name}: not MIG capable", device))
        elif state.current_enabled != state.pending_enabled:
            rows.append(
                fail(
                    "mig",
                    f"{name}: MIG {_mode(state.current_enabled)}, "
                    f"{_mode(state.pending_enabled)} after a GPU reset: reset the GPU "
                    f"(nvidia-smi -r -i {gpu.index}) or set the mode back "
                    f"(nvidia-smi -i {gpu.index} -mig {int(state.current_enabled)})",
                    device,
                )
            )
        elif not gpu.mig_profiles:
            rows.append(fail("mig", f"{name}: MIG capable but NVML lists no MIG profile", device))
        elif state.current_enabled:
            rows.append(
                ok("mig", f"{name}: MIG on, {_count(len(gpu.mig_devices), 'MIG device')}", device)
            )
        else:
            rows.append(ok("mig", f"{name}: MIG capable, off", device))
    return rows


def smallest_profile(gpu: Gpu) -> MigProfile | None:
    """The GPU's smallest MIG profile: fewest slices, least memory, then by name."""
    return min(
        gpu.mig_profiles, key=lambda p: (p.slice_count, p.memory_bytes, p.name), default=None
    )


@dataclass(frozen=True)
class CarveTarget:
    """Where ``--carve`` makes its MIG device."""

    gpu: Gpu
    profile: MigProfile
    start: int
    #: The GPU instances that existed before, so that leftovers of a failure can be found.
    existing: tuple[Instance, ...] = field(default=())

    @property
    def device(self) -> str:
        """The GPU's device name."""
        return gpu_device_name(self.gpu)

    @property
    def what(self) -> str:
        """The MIG device to make, in words."""
        return f"{self.profile.name} at memory slice {self.start} on {self.device}"


def carve_target(gpus: Sequence[tuple[Gpu, Sequence[Instance]]]) -> CarveTarget | str:
    """The first GPU in MIG mode with room for its smallest profile, at its first free
    placement; else why there is none (the detail of a skipped row).

    ``gpus`` pairs each GPU with the GPU instances that exist on it now.
    """
    enabled = [(g, tuple(i)) for g, i in gpus if g.mig_enabled]
    if not enabled:
        return "no GPU in MIG mode"
    for gpu, instances in enabled:
        profile = smallest_profile(gpu)
        if profile is None:
            continue
        for placement in profile.placements:
            try:
                check_create(gpu, profile, placement.start, instances)
            except MigError:
                continue
            return CarveTarget(gpu, profile, placement.start, instances)
    return "no room for the smallest MIG profile on any GPU in MIG mode"


def carve_ok(target: CarveTarget, device: MigDevice) -> Row:
    """A MIG device made and destroyed."""
    name = mig_device_name(
        target.gpu.minor, device.profile_name, device.profile_id, device.placement.start
    )
    return ok(
        "mig-carve",
        f"created {name} ({device.uuid}) and destroyed it",
        target.device,
    )


def destroy_by_hand(gpu: Gpu, gpu_instance_id: int) -> str:
    """The commands that remove a GPU instance the check left behind."""
    i, gi = gpu.index, gpu_instance_id
    return f"nvidia-smi mig -i {i} -dci -gi {gi}; nvidia-smi mig -i {i} -dgi -gi {gi}"


def leftovers(
    target: CarveTarget, now: Sequence[Instance], made: MigDevice | None = None
) -> list[int]:
    """GPU instances on the target GPU that the check may have left: new since it listed, of
    its profile at its placement, and without a MIG device or with the one it ``made``.

    Anything else new on the GPU is another's (the agent's dynamic MIG making a pod's MIG
    device meanwhile, an admin's): never destroyed, nor named to be destroyed by hand.
    """
    before = {i.gpu_instance_id for i in target.existing}
    return sorted(
        i.gpu_instance_id
        for i in now
        if i.gpu_instance_id not in before
        and i.profile_id == target.profile.profile_id
        and i.placement.start == target.start
        and (i.device is None or (made is not None and i.device.uuid == made.uuid))
    )


# -- health events ---------------------------------------------------------------------------


def health_types(supported: int) -> int:
    """The event types the agent's watcher registers for, of those the GPU supports."""
    return supported & (EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC)


def health_row(device: str, supported: int | str, registered: str | None) -> Row:
    """One GPU's health-event registration.

    ``supported`` is the GPU's supported event types (or why they could not be read);
    ``registered`` is None when registering worked, else why not.
    """
    if isinstance(supported, str):
        return fail("health", f"supported event types unknown: {supported}", device)
    if not supported & EVENT_XID_CRITICAL:
        return fail(
            "health",
            f"does not report Xid events (supported event types {supported:#x}): "
            "the agent cannot taint it on errors",
            device,
        )
    if registered is not None:
        return fail("health", f"registering for Xid events failed: {registered}", device)
    if supported & EVENT_DOUBLE_BIT_ECC:
        return ok("health", "registered for Xid and double-bit ECC events", device)
    return ok("health", "registered for Xid events (no ECC events: ECC off or unsupported)", device)


# -- output ------------------------------------------------------------------------------------

_SHOWN = {"ok": "ok", "fail": "FAIL", "skipped": "skipped"}


def render_table(report: Report) -> list[str]:
    """The report for people: one line per check, then the verdict."""
    if report.skipped:
        return [f"skipped: {report.skipped}"]
    lines = table(
        ["CHECK", "VERDICT", "DETAIL"],
        [[r.name, _SHOWN[r.verdict], r.detail] for r in report.rows],
    )
    counts = {v: sum(1 for r in report.rows if r.verdict == v) for v in ("fail", "ok", "skipped")}
    tally = ", ".join(f"{n} {'failed' if v == 'fail' else v}" for v, n in counts.items() if n)
    lines.append(f"hw-check: {_SHOWN[report.verdict]} ({tally})")
    return lines


def report_json(report: Report) -> dict[str, Any]:
    """The report for programs (``-o json``)."""
    out: dict[str, Any] = {"verdict": report.verdict}
    if report.skipped:
        out["detail"] = report.skipped
    out["checks"] = [
        {"check": r.check, "device": r.device, "verdict": r.verdict, "detail": r.detail}
        for r in report.rows
    ]
    return out
