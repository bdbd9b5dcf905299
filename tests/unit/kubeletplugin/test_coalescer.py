"""Which queued calls run together, and in which order, under the node lock."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.kubeletplugin.lock import NodeLock
from dra_driver.kubeletplugin.node_service import _Coalescer


class _Recorder:
    """Driver calls that record their batches; the first one waits until released, so the
    calls after it queue up behind the lock."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def call(self, kind: str) -> Any:
        async def run(uids: list[str]) -> Mapping[str, None]:
            self.batches.append((kind, sorted(uids)))
            if len(self.batches) == 1:
                self.started.set()
                await self.release.wait()
            return dict.fromkeys(uids)

        return run


async def _batches(calls: Sequence[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The driver calls made for ``calls`` (kind, claim), queued in that order behind a
    running prepare of claim ``first``."""
    recorder = _Recorder()
    coalescer = _Coalescer(
        NodeLock(None),
        {"prepare": recorder.call("prepare"), "unprepare": recorder.call("unprepare")},
        {"prepare": str, "unprepare": str},
        overtakes="unprepare",
    )
    first = asyncio.create_task(coalescer.run("prepare", ["first"]))
    await recorder.started.wait()
    queued = []
    for kind, uid in calls:
        queued.append(asyncio.create_task(coalescer.run(kind, [uid])))
        await asyncio.sleep(0)  # queued, waiting for the lock
    recorder.release.set()
    results = await asyncio.gather(first, *queued)
    for (_, uid), result in zip(calls, results[1:], strict=True):
        assert uid in result
    return recorder.batches[1:]


async def test_unprepares_run_ahead_of_queued_prepares_of_other_claims() -> None:
    batches = await _batches(
        [("prepare", "a"), ("unprepare", "b"), ("prepare", "c"), ("unprepare", "d")]
    )
    assert batches == [("prepare", ["a"]), ("unprepare", ["b", "d"]), ("prepare", ["c"])]


async def test_a_prepare_never_runs_ahead_of_an_unprepare_queued_before_it() -> None:
    # Its device may be one the unprepare frees.
    batches = await _batches(
        [("unprepare", "a"), ("prepare", "b"), ("unprepare", "c"), ("prepare", "d")]
    )
    assert batches == [("unprepare", ["a", "c"]), ("prepare", ["b", "d"])]
    batches = await _batches([("prepare", "a"), ("unprepare", "b"), ("prepare", "c")])
    assert batches == [("prepare", ["a"]), ("unprepare", ["b"]), ("prepare", ["c"])]


async def test_an_unprepare_never_runs_ahead_of_a_prepare_of_its_claim() -> None:
    batches = await _batches(
        [
            ("prepare", "a"),
            ("unprepare", "b"),
            ("prepare", "c"),
            ("unprepare", "c"),
            ("unprepare", "d"),
        ]
    )
    assert batches == [
        ("prepare", ["a"]),
        ("unprepare", ["b", "d"]),
        ("prepare", ["c"]),
        ("unprepare", ["c"]),
    ]
