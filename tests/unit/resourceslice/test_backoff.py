"""Backoff delays: exponential, capped near 30 s, jittered downwards, reset on success."""

from __future__ import annotations

import pytest

from dra_driver.resourceslice.backoff import Backoff, backoff_delay


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (5, 16.0), (6, 30.0), (60, 30.0), (10_000, 30.0)],
)
def test_delay_doubles_up_to_the_cap(attempt: int, expected: float) -> None:
    assert backoff_delay(attempt, rand=lambda: 0.0) == expected


def test_jitter_shrinks_the_delay_by_at_most_half() -> None:
    assert backoff_delay(6, rand=lambda: 1.0) == 15.0
    assert backoff_delay(6, rand=lambda: 0.5) == 22.5
    assert backoff_delay(3, jitter=0.0, rand=lambda: 1.0) == 4.0


def test_jitter_spreads_real_random_delays() -> None:
    delays = {backoff_delay(8) for _ in range(50)}
    assert len(delays) > 1
    assert all(15.0 <= d <= 30.0 for d in delays)


def test_negative_attempt_is_rejected() -> None:
    with pytest.raises(ValueError):
        backoff_delay(-1)


def test_stateful_backoff_grows_and_resets() -> None:
    backoff = Backoff(rand=lambda: 0.0)
    assert [backoff.next_delay() for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_retry_after_is_honoured_but_capped() -> None:
    backoff = Backoff(rand=lambda: 0.0)
    assert backoff.next_delay(at_least=7.0) == 7.0
    assert backoff.next_delay(at_least=600.0) == 30.0
