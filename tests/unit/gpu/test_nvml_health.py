"""The NVML health watcher against the stand-in libnvidia-ml.so.1 (tests/fakenvml).

The watcher runs in a child process (the loader reads LD_LIBRARY_PATH at start) with an
asyncio loop; it prints every HealthEvent its sink receives as one JSON line. The test
appends events to the stand-in's events file and reads what comes out.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.health.nvml import NvmlEventWatcher, mig_instances
from dra_driver.gpu.health.tracker import HealthEvent
from tests.unit.gpu.discovery.test_nvml_backend import FakeNode, fake_lib_dir, make_node

__all__ = ["fake_lib_dir"]  # the stand-in library's fixture, shared with the backend tests

# Short waits keep the tests quick; the stop test uses the watcher's own period.
WAIT_MS = 200
QUIET = 3 * WAIT_MS / 1000

_WATCH = """
import asyncio, dataclasses, json, sys, threading, time
from dra_driver import logs
from dra_driver.gpu.health.nvml import NvmlEventWatcher
logs.configure("json")  # logs go to stderr, as in the agent; stdout carries the events

def alive():
    return any(t.name == "nvml-events" for t in threading.enumerate())

def say(record):
    print(json.dumps(record), flush=True)

async def report_end(watcher):
    try:
        await watcher.ended()
    except Exception as exc:
        say({"ended": f"{type(exc).__name__}: {exc}"})

async def main():
    uuids, overrides = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    for name, value in overrides.items():  # WAIT_MS, LOST_RETRY_S, RETRY_S, ...
        setattr(NvmlEventWatcher, name, value)
    loop = asyncio.get_running_loop()
    # (GPU UUID, GPU instance id, MIG UUID) triples: the MIG devices the agent publishes.
    migs = {(gpu, gi): mig for gpu, gi, mig in json.loads(sys.argv[3])}
    kwargs = {"migs": migs} if migs else {}
    watcher = NvmlEventWatcher(uuids, lambda e: say(dataclasses.asdict(e)), loop, **kwargs)
    watcher.start()
    # As with NVML, events written before the event set exists are never reported.
    await watcher.watching()
    ending = asyncio.create_task(report_end(watcher))
    say({"started": True})
    # stdin: "stop" stops the watcher; "alive" asks whether its thread still runs.
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        if line == "alive":
            say({"alive": alive()})
        elif line == "stop":
            began = time.monotonic()
            watcher.stop()
            await ending  # a stopped watcher ends without an error
            while alive():
                await asyncio.sleep(0.01)
            say({"stopped_after": time.monotonic() - began})
            # Events the thread handed over just before it ended still reach the sink.
            await asyncio.sleep(0.1)
            return

asyncio.run(main())
"""


class Watcher:
    """The child process running an NvmlEventWatcher, and the lines it prints."""

    def __init__(
        self,
        node: FakeNode,
        events: Path,
        wait_ms: int | None,
        uuids: list[str] | None = None,
        *,
        retry_s: float | None = None,
        max_replacements: int | None = None,
        migs: dict[tuple[str, int], str] | None = None,
        **env: str,
    ) -> None:
        self.node = node
        self.events = events
        if uuids is None:
            uuids = [g.uuid for g in node.inventory.gpus]
        overrides: dict[str, float] = {}
        if wait_ms is not None:
            overrides["WAIT_MS"] = wait_ms
        if retry_s is not None:
            overrides["LOST_RETRY_S"] = overrides["RETRY_S"] = retry_s
        if max_replacements is not None:
            overrides["MAX_REPLACEMENTS"] = max_replacements
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCH,
                json.dumps(uuids),
                json.dumps(overrides),
                json.dumps([[gpu, gi, mig] for (gpu, gi), mig in (migs or {}).items()]),
            ],
            env=node.env(FAKE_NVML_EVENTS=str(events), **env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # Lines before "started" (GPUs found lost while registering) are read first later.
        self._early: list[dict[str, Any]] = []  # empty while reading: next() reads the queue
        early = []
        while (line := self.next(timeout=30)) != {"started": True}:
            early.append(line)
        self._early = early

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def uuid(self, index: int) -> str:
        return self.node.inventory.gpus[index].uuid

    def inject(self, *lines: str) -> None:
        with self.events.open("a") as f:
            f.writelines(f"{line}\n" for line in lines)

    def next(self, timeout: float = 10) -> dict[str, Any]:
        if self._early:
            return self._early.pop(0)
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"nothing from the watcher within {timeout}s; stderr: {self.stderr()}")

    def events_out(self, count: int) -> list[HealthEvent]:
        return [HealthEvent(**self.next()) for _ in range(count)]

    def quiet(self, seconds: float) -> None:
        """Nothing comes out for ``seconds``."""
        time.sleep(seconds)
        assert not self._early and self.lines.empty(), self._early + list(self.lines.queue)

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def alive(self) -> bool:
        self.command("alive")
        answer = self.next()
        return bool(answer["alive"])

    def stop(self) -> float:
        """Stop the watcher; seconds until its thread ended."""
        self.command("stop")
        answer = self.next()
        assert self.proc.wait(timeout=30) == 0, self.stderr()
        assert self.lines.empty(), list(self.lines.queue)
        return float(answer["stopped_after"])

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)


@pytest.fixture
def node(tmp_path: Path, fake_lib_dir: Path) -> FakeNode:
    return make_node("dgx-h100", tmp_path, fake_lib_dir)


@pytest.fixture
def watch(node: FakeNode, tmp_path: Path) -> Iterator[Watcher]:
    watcher = Watcher(node, tmp_path / "nvml.events", WAIT_MS)
    yield watcher
    watcher.close()


def _clean(stderr: str) -> None:
    # No traceback from the thread, no complaint from the stand-in (e.g. a leaked event set).
    assert "Traceback" not in stderr, stderr
    assert "fakenvml:" not in stderr, stderr


def test_critical_xid_names_the_gpu(watch: Watcher) -> None:
    watch.inject(f"{watch.uuid(2)} xid 79")
    assert watch.events_out(1) == [HealthEvent(watch.uuid(2), "xid", 79)]
    # Later events on other GPUs come through the same wait loop.
    watch.inject(f"{watch.uuid(5)} xid 94", f"{watch.uuid(0)} xid 13")
    assert watch.events_out(2) == [
        HealthEvent(watch.uuid(5), "xid", 94),
        # Application Xids are filtered by the tracker, not here.
        HealthEvent(watch.uuid(0), "xid", 13),
    ]
    watch.stop()
    _clean(watch.stderr())


def test_double_bit_ecc_is_xid_48(watch: Watcher) -> None:
    watch.inject(f"{watch.uuid(7)} dbe")
    assert watch.events_out(1) == [HealthEvent(watch.uuid(7), "xid", 48)]
    watch.stop()
    _clean(watch.stderr())


def test_an_xid_of_a_mig_device_names_that_mig_device(tmp_path: Path, fake_lib_dir: Path) -> None:
    """NVML reports a MIG device's Xid on its GPU's handle with the GPU and compute instance
    ids: it must name that MIG device, not the GPU (which would taint every MIG device of
    the GPU, other tenants' included)."""
    mixed = make_node("mixed", tmp_path, fake_lib_dir)
    gpu = mixed.inventory.gpus[0]
    assert gpu.mig_enabled and len(gpu.mig_devices) >= 2
    first, second = gpu.mig_devices[:2]
    watch = Watcher(mixed, tmp_path / "nvml.events", WAIT_MS, migs=mig_instances(mixed.inventory))
    try:
        watch.inject(f"{first.uuid} xid 94", f"{second.uuid} dbe", f"{gpu.uuid} xid 79")
        assert watch.events_out(3) == [
            HealthEvent(first.uuid, "xid", 94),
            HealthEvent(second.uuid, "xid", 48),
            HealthEvent(gpu.uuid, "xid", 79),  # the GPU's own: all of it
        ]
        watch.stop()
        _clean(watch.stderr())
    finally:
        watch.close()


def test_lost_gpu_nobody_can_name_marks_every_gpu_and_the_watch_goes_on(watch: Watcher) -> None:
    watch.inject(f"{watch.uuid(1)} xid 79")
    assert watch.events_out(1) == [HealthEvent(watch.uuid(1), "xid", 79)]
    watch.inject("lost")  # every GPU answers its UUID lookup: none can be named
    uuids = [g.uuid for g in watch.node.inventory.gpus]
    assert watch.events_out(len(uuids)) == [HealthEvent(u, "gpu-lost") for u in uuids]
    # Still watching, on a new event set, which does not deliver the first Xid again.
    watch.inject(f"{watch.uuid(4)} xid 94")
    assert watch.events_out(1) == [HealthEvent(watch.uuid(4), "xid", 94)]
    watch.quiet(QUIET)
    assert watch.alive()
    watch.stop()
    _clean(watch.stderr())


@pytest.fixture
def health(tmp_path: Path) -> Path:
    """The stand-in's health file (FAKE_NVML_HEALTH): "<uuid> lost" makes a GPU lost."""
    path = tmp_path / "nvml.health"
    path.write_text("")
    return path


def test_lost_gpu_is_named_and_the_others_stay_watched(
    node: FakeNode, tmp_path: Path, health: Path
) -> None:
    watch = Watcher(node, tmp_path / "nvml.events", WAIT_MS, FAKE_NVML_HEALTH=str(health))
    try:
        watch.inject(f"{watch.uuid(1)} xid 79")
        assert watch.events_out(1) == [HealthEvent(watch.uuid(1), "xid", 79)]
        health.write_text(f"{watch.uuid(2)} lost\n")
        watch.inject("lost")
        assert watch.events_out(1) == [HealthEvent(watch.uuid(2), "gpu-lost")]
        # The others are still watched; the lost GPU's events cannot come (it is gone).
        watch.inject(f"{watch.uuid(2)} xid 79", f"{watch.uuid(5)} xid 94", f"{watch.uuid(1)} dbe")
        assert watch.events_out(2) == [
            HealthEvent(watch.uuid(5), "xid", 94),
            HealthEvent(watch.uuid(1), "xid", 48),
        ]
        watch.quiet(QUIET)  # nothing delivered twice
        assert watch.alive()
        watch.stop()
        _clean(watch.stderr())
    finally:
        watch.close()


def test_lost_gpu_is_watched_again_once_it_answers(
    node: FakeNode, tmp_path: Path, health: Path
) -> None:
    watch = Watcher(
        node,
        tmp_path / "nvml.events",
        WAIT_MS,
        FAKE_NVML_HEALTH=str(health),
        retry_s=0.2,
    )
    try:
        health.write_text(f"{watch.uuid(3)} lost\n")
        watch.inject("lost")
        assert watch.events_out(1) == [HealthEvent(watch.uuid(3), "gpu-lost")]
        health.write_text("")  # reset: it answers again (a re-check untaints it)
        # The watcher looks at lost GPUs every LOST_RETRY_S; until it registers this one
        # again its events are not reported (NVML reports none from before registration).
        xid = HealthEvent(watch.uuid(3), "xid", 79)
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the GPU was not watched again"
            watch.inject(f"{watch.uuid(3)} xid 79")
            try:
                got = watch.lines.get(timeout=0.3)
            except queue.Empty:
                continue
            assert HealthEvent(**got) == xid
            break
        watch.quiet(QUIET)
        watch.stop()
        _clean(watch.stderr())
    finally:
        watch.close()


def test_timeouts_are_quiet_and_the_watch_goes_on(watch: Watcher) -> None:
    watch.quiet(QUIET)  # several waits time out
    assert watch.alive()
    watch.inject(f"{watch.uuid(1)} xid 79")
    assert watch.events_out(1) == [HealthEvent(watch.uuid(1), "xid", 79)]
    watch.stop()
    _clean(watch.stderr())


def _faults(path: Path, text: str) -> None:
    """Set the stand-in's failures at once: NVML's thread reads the file at every call, and
    must never read it half written."""
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)


def test_a_set_whose_waits_keep_failing_is_replaced(node: FakeNode, tmp_path: Path) -> None:
    """Waits that fail (not time out) watch nothing: after a few the set is replaced, and
    events are seen again."""
    fail = tmp_path / "fail"
    fail.write_text("")
    watch = Watcher(
        node,
        tmp_path / "nvml.events",
        WAIT_MS,
        retry_s=0.05,
        max_replacements=1000,  # however long this machine takes to clear the faults
        FAKE_NVML_FAIL_FILE=str(fail),
    )
    try:
        _faults(fail, "nvmlEventSetWait_v2=999\n")
        time.sleep(10 * 0.05 + 3 * WAIT_MS / 1000)  # several failed waits, a new set
        _faults(fail, "")
        # A set replaced now starts after what the file holds (as NVML's): inject later.
        time.sleep(0.5)
        watch.inject(f"{watch.uuid(2)} xid 79")
        assert watch.events_out(1) == [HealthEvent(watch.uuid(2), "xid", 79)]
        assert watch.alive()
    finally:
        watch.close()


def test_waits_failing_on_every_new_set_end_the_watch(node: FakeNode, tmp_path: Path) -> None:
    """...but when the new sets fail as well, NVML itself is in trouble: the thread ends and
    says why, so the supervised health loop starts it again on a fresh NVML (and counts the
    crash) instead of replacing sets blind for as long as the agent runs."""
    fail = tmp_path / "fail"
    fail.write_text("")
    watch = Watcher(
        node, tmp_path / "nvml.events", WAIT_MS, retry_s=0.05, FAKE_NVML_FAIL_FILE=str(fail)
    )
    try:
        _faults(fail, "nvmlEventSetWait_v2=999\n")
        ended = watch.next(timeout=10)
        assert ended["ended"].startswith(
            "WatchEnded: NVML event waits keep failing on 4 event sets in a row"
        ), ended
        assert not watch.alive()
    finally:
        watch.close()


def test_a_set_that_only_fails_and_cannot_be_replaced_ends_the_watch(
    node: FakeNode, tmp_path: Path
) -> None:
    """...and when no new set can be made, the thread ends and says why: the agent's
    supervised health loop ends with it (and fails liveness if it cannot start again)."""
    fail = tmp_path / "fail"
    fail.write_text("")
    watch = Watcher(
        node, tmp_path / "nvml.events", WAIT_MS, retry_s=0.05, FAKE_NVML_FAIL_FILE=str(fail)
    )
    try:
        _faults(fail, "nvmlEventSetWait_v2=999\nnvmlEventSetCreate\n")
        ended = watch.next(timeout=10)
        assert ended["ended"].startswith("WatchEnded: no NVML event set"), ended
        assert not watch.alive()
    finally:
        watch.close()


def test_gpus_register_only_supported_events(node: FakeNode, tmp_path: Path) -> None:
    # GPU 3 supports Xid events only (nvmlEventTypeXidCriticalError): asking NVML for ECC
    # events too must not cost it its Xid events. GPU 6 supports neither (PState only).
    gpu3, gpu6 = node.inventory.gpus[3].uuid, node.inventory.gpus[6].uuid
    text = node.data.read_text()
    text = text.replace(f"gpu {gpu3}\n", f"gpu {gpu3}\nevents 8\n")
    text = text.replace(f"gpu {gpu6}\n", f"gpu {gpu6}\nevents 0x4\n")
    node.data.write_text(text)
    watch = Watcher(node, tmp_path / "nvml.events", WAIT_MS)
    try:
        watch.inject(f"{gpu3} dbe", f"{gpu3} xid 79", f"{gpu6} xid 79", f"{watch.uuid(4)} dbe")
        assert watch.events_out(2) == [
            HealthEvent(gpu3, "xid", 79),
            HealthEvent(watch.uuid(4), "xid", 48),
        ]
        watch.stop()
        stderr = watch.stderr()
        _clean(stderr)
        warnings = [json.loads(line) for line in stderr.splitlines()]
        assert [(w["event"], w["uuid"]) for w in warnings] == [
            ("GPU does not report health events", gpu6)
        ]
    finally:
        watch.close()


def test_gpu_lost_before_the_watch_starts(node: FakeNode, tmp_path: Path) -> None:
    # 15 = NVML_ERROR_GPU_IS_LOST from the UUID lookup.
    watch = Watcher(
        node, tmp_path / "nvml.events", WAIT_MS, FAKE_NVML_FAIL="nvmlDeviceGetHandleByUUID=15"
    )
    try:
        uuids = [g.uuid for g in node.inventory.gpus]
        assert watch.events_out(len(uuids)) == [HealthEvent(u, "gpu-lost") for u in uuids]
        watch.stop()
        _clean(watch.stderr())
    finally:
        watch.close()


def test_unknown_gpu_does_not_stop_the_others(node: FakeNode, tmp_path: Path) -> None:
    # A GPU NVML cannot find (gone since discovery) is skipped, the rest are watched.
    uuids = [g.uuid for g in node.inventory.gpus[:2]]
    uuids.insert(1, "GPU-00000000-0000-0000-0000-000000000000")
    watch = Watcher(node, tmp_path / "nvml.events", WAIT_MS, uuids)
    try:
        watch.inject(f"{watch.uuid(1)} xid 79")
        assert watch.events_out(1) == [HealthEvent(watch.uuid(1), "xid", 79)]
        watch.stop()
    finally:
        watch.close()


def test_registration_failure_is_logged_not_fatal(node: FakeNode, tmp_path: Path) -> None:
    watch = Watcher(
        node, tmp_path / "nvml.events", WAIT_MS, FAKE_NVML_FAIL="nvmlDeviceRegisterEvents=3"
    )
    try:
        watch.inject(f"{watch.uuid(2)} xid 79")
        watch.quiet(QUIET)
        watch.stop()
        stderr = watch.stderr()
        assert "GPU does not report health events" in stderr
        assert "Traceback" not in stderr
    finally:
        watch.close()


def test_stop_ends_the_thread_within_one_wait(node: FakeNode, tmp_path: Path) -> None:
    watch = Watcher(node, tmp_path / "nvml.events", None)
    try:
        time.sleep(0.3)  # inside a wait
        period = NvmlEventWatcher.WAIT_MS / 1000
        assert watch.stop() < period * 1.5
        _clean(watch.stderr())
    finally:
        watch.close()


_PROBE = """
import json, sys
from dra_driver import logs
from dra_driver.gpu.health.nvml import NvmlProber
logs.configure("json")  # logs go to stderr; stdout carries the answer
print(json.dumps(NvmlProber().probe(json.loads(sys.argv[1]))))
"""


def _probe(node: FakeNode, health: Path, uuids: list[str], **env: str) -> dict[str, str | None]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(uuids)],
        env=node.env(FAKE_NVML_HEALTH=str(health), **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    _clean(result.stderr)
    answer: dict[str, str | None] = json.loads(result.stdout)
    return answer


def test_probe_reports_what_still_needs_a_reset(node: FakeNode, tmp_path: Path) -> None:
    health = tmp_path / "nvml.health"
    gpus = [g.uuid for g in node.inventory.gpus]
    health.write_text(
        f"{gpus[1]} lost\n{gpus[2]} pages-pending\n{gpus[3]} remap-pending\n"
        f"{gpus[4]} remap-failed\n{gpus[5]} no-retire\n{gpus[5]} no-remap\n"
    )
    assert _probe(node, health, [*gpus[:6], "GPU-unknown"]) == {
        gpus[0]: None,
        gpus[1]: "GPU is lost",
        gpus[2]: "retired memory pages wait for a GPU reset",
        gpus[3]: "remapped rows wait for a GPU reset",
        gpus[4]: "row remapping failed",
        gpus[5]: None,  # neither check exists on this GPU: reachable is healthy
        "GPU-unknown": "GPU not reachable: Not Found",
    }
    # The same GPUs after a reset: healthy, as the agent's next re-check finds them.
    health.write_text("")
    assert set(_probe(node, health, gpus[:6]).values()) == {None}


def test_probe_of_a_mig_device_asks_its_gpu(tmp_path: Path, fake_lib_dir: Path) -> None:
    mixed = make_node("mixed", tmp_path, fake_lib_dir)
    gpu = mixed.inventory.gpus[0]
    assert gpu.mig_enabled
    mig = gpu.mig_devices[0].uuid
    health = tmp_path / "nvml.health"
    health.write_text(f"{gpu.uuid} remap-pending\n")
    assert _probe(mixed, health, [mig]) == {mig: "remapped rows wait for a GPU reset"}
    health.write_text("")
    assert _probe(mixed, health, [mig]) == {mig: None}


def test_probe_without_nvml_reports_every_device(node: FakeNode, tmp_path: Path) -> None:
    uuid = node.inventory.gpus[0].uuid
    answer = _probe(node, tmp_path / "none", [uuid], FAKE_NVML_FAIL="nvmlInitWithFlags=9")
    assert answer == {uuid: "NVML did not initialise: Driver Not Loaded"}


def test_probe_answers_though_nvml_does_not_shut_down(node: FakeNode, tmp_path: Path) -> None:
    # A failed nvmlShutdown (as the event thread's, only logged) must not throw away the
    # answers: the re-check loop would crash on every round and never untaint anything.
    health = tmp_path / "nvml.health"
    gpus = [g.uuid for g in node.inventory.gpus[:2]]
    health.write_text(f"{gpus[1]} lost\n")
    answer = _probe(node, health, gpus, FAKE_NVML_FAIL="nvmlShutdown")
    assert answer == {gpus[0]: None, gpus[1]: "GPU is lost"}
