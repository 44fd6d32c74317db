"""Latency: the fixed log-spaced histogram and the guard's timing of every call."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from guard_factory import pair

from kcert.guard import BOUNDS_US, Guard
from kcert.guard.latency import Histogram


def test_bounds_are_one_two_five_steps_from_a_microsecond_to_ten_seconds() -> None:
    assert BOUNDS_US[:6] == (1, 2, 5, 10, 20, 50)
    assert BOUNDS_US[-1] == 10_000_000 and len(BOUNDS_US) == 22


def test_values_land_in_the_first_bucket_whose_bound_holds_them() -> None:
    h = Histogram()
    for value in (0.2, 1.0, 1.5, 2.0, 7.0, 3e7):
        h.add(value)
    counts = h.snapshot().counts
    assert len(counts) == len(BOUNDS_US) + 1
    assert counts[0] == 2 and counts[1] == 2 and counts[3] == 1 and counts[-1] == 1
    assert sum(counts) == 6


def test_reset_starts_a_new_window_and_keeps_the_total() -> None:
    h = Histogram()
    h.add(3.0)
    assert h.snapshot(reset=True).total == 1
    h.add(30.0)
    assert h.snapshot().counts == h.snapshot().counts and h.snapshot().total == 1
    assert h.since_start().total == 2


def test_every_call_is_timed_at_any_rate(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=0.0, seed=0)

    def sleepy(x_ptr: Any, y_ptr: Any) -> None:
        time.sleep(0.003)

    wrapped = guard.wrap(sleepy)
    for seed in range(5):
        wrapped(*pair(10, seed))
    assert guard.flush(30)
    latency = guard.stats().latency
    assert latency.total == 5
    # a 3 ms sleep lasts at least 3 ms: nothing lands at or below the 2 ms bound
    assert sum(latency.counts[: BOUNDS_US.index(2000) + 1]) == 0
    reports = guard.reporter.body()["reports"]  # type: ignore[attr-defined]
    summed = [sum(r["latency"]["counts"][i] for r in reports) for i in range(len(BOUNDS_US) + 1)]
    assert summed == list(latency.counts)
