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


async def _behind_a_prepare() -> tuple[_Recorder, _Coalescer, asyncio.Task[Any]]:
    """A coalescer running a prepare of claim ``first`` until the recorder is released."""
    recorder = _Recorder()
    coalescer = _Coalescer(
        NodeLock(None),
        {"prepare": recorder.call("prepare"), "unprepare": recorder.call("unprepare")},
        {"prepare": str, "unprepare": str},
        overtakes="unprepare",
    )
    first = asyncio.create_task(coalescer.run("prepare", ["first"]))
    await recorder.started.wait()
    return recorder, coalescer, first


async def _batches(calls: Sequence[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The driver calls made for ``calls`` (kind, claim), queued in that order behind a
    running prepare of claim ``first``."""
    recorder, coalescer, first = await _behind_a_prepare()
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


async def test_a_cancelled_batch_keeps_its_unprepares_ahead_of_later_prepares() -> None:
    # The unprepare of "d" joins the batch of "b"; that batch's caller hits its deadline in
    # the driver call, so "d" is unprepared on its own call. The prepare of "d" queued after
    # it must still wait for it (its device may be the one the unprepare frees).
    recorder = _Recorder()
    leader_started = asyncio.Event()
    leader_release = asyncio.Event()
    batches = recorder.batches

    async def unprepare(uids: list[str]) -> Mapping[str, None]:
        batches.append(("unprepare", sorted(uids)))
        if "b" in uids:
            leader_started.set()
            await leader_release.wait()  # cancelled with its caller
        return dict.fromkeys(uids)

    coalescer = _Coalescer(
        NodeLock(None),
        {"prepare": recorder.call("prepare"), "unprepare": unprepare},
        {"prepare": str, "unprepare": str},
        overtakes="unprepare",
    )
    first = asyncio.create_task(coalescer.run("prepare", ["first"]))
    await recorder.started.wait()
    tasks = {}
    for kind, uid in [("unprepare", "b"), ("prepare", "c"), ("unprepare", "d"), ("prepare", "d")]:
        tasks[kind, uid] = asyncio.create_task(coalescer.run(kind, [uid]))
        await asyncio.sleep(0)
    recorder.release.set()
    await leader_started.wait()
    assert batches[-1] == ("unprepare", ["b", "d"])
    tasks["unprepare", "b"].cancel()
    await asyncio.gather(first, *(t for k, t in tasks.items() if k != ("unprepare", "b")))
    later = batches[2:]
    assert later.index(("unprepare", ["d"])) < next(
        i for i, (kind, uids) in enumerate(later) if kind == "prepare" and "d" in uids
    ), later


async def test_a_call_answered_by_a_batch_returns_without_waiting_for_the_lock() -> None:
    # The unprepare of "d" runs in the batch of "b", ahead of the prepare of "c": its answer
    # must not wait for that prepare (nor for the lock at all), however long it takes.
    recorder = _Recorder()
    slow_started = asyncio.Event()
    slow_release = asyncio.Event()

    async def prepare(uids: list[str]) -> Mapping[str, None]:
        recorder.batches.append(("prepare", sorted(uids)))
        if uids == ["first"]:
            recorder.started.set()
            await recorder.release.wait()
        else:
            slow_started.set()
            await slow_release.wait()
        return dict.fromkeys(uids)

    coalescer = _Coalescer(
        NodeLock(None),
        {"prepare": prepare, "unprepare": recorder.call("unprepare")},
        {"prepare": str, "unprepare": str},
        overtakes="unprepare",
    )
    first = asyncio.create_task(coalescer.run("prepare", ["first"]))
    await recorder.started.wait()
    tasks = []
    for kind, uid in [("unprepare", "b"), ("prepare", "c"), ("unprepare", "d")]:
        tasks.append(asyncio.create_task(coalescer.run(kind, [uid])))
        await asyncio.sleep(0)
    recorder.release.set()
    await slow_started.wait()
    assert recorder.batches[1:] == [("unprepare", ["b", "d"]), ("prepare", ["c"])]
    assert "d" in await asyncio.wait_for(tasks[2], 1.0)
    slow_release.set()
    await asyncio.gather(first, *tasks)


async def test_a_prepare_taking_a_freed_lock_waits_for_an_unprepare_queued_before_it() -> None:
    # The unprepare of "d" queues while the lock is held; in the same turn of the loop the
    # running driver call returns (freeing the lock) and the prepare of "d" finishes its
    # claim read. The unprepare has not begun waiting for the lock yet, but it came first:
    # the prepare must not take the free lock ahead of it (its device may be the one the
    # unprepare frees).
    recorder, coalescer, first = await _behind_a_prepare()
    fetched = asyncio.Event()

    async def prepare_after_its_claim_read() -> Mapping[str, Any]:
        await fetched.wait()
        return await coalescer.run("prepare", ["d"])

    prepare = asyncio.create_task(prepare_after_its_claim_read())
    await asyncio.sleep(0)
    unprepare = asyncio.create_task(coalescer.run("unprepare", ["d"]))
    recorder.release.set()
    fetched.set()
    await asyncio.gather(first, unprepare, prepare)
    assert recorder.batches[1:] == [("unprepare", ["d"]), ("prepare", ["d"])]
