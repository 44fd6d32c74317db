"""The queue: a slow checker never holds the caller up; what does not fit is dropped and counted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from guard_factory import pair, saxpy

from kcert.guard import Guard
from kcert.guard.check import Checker, Sample


def test_a_full_queue_drops_and_counts_without_blocking(
    make_guard: Callable[..., Guard],
) -> None:
    guard = make_guard(sample_rate=1.0, seed=0, queue_size=1)
    entered, release = threading.Event(), threading.Event()
    real = guard.checker.check

    def slow(sample: Sample) -> Any:
        entered.set()
        release.wait(60)
        return real(sample)

    guard.checker.check = slow  # type: ignore[method-assign]
    wrapped = guard.wrap(saxpy)
    results: list[Any] = []

    def caller() -> None:
        x, y = pair(100, 0)
        results.append(wrapped(x, y))
        assert entered.wait(30)  # the worker holds the first sample
        for seed in range(1, 20):
            results.append(wrapped(*pair(100, seed)))

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(30)
    # every call returned while the checker was still stuck on the first sample
    assert not thread.is_alive() and len(results) == 20
    assert not release.is_set()
    stats = guard.stats()
    assert (stats.calls_seen, stats.calls_sampled, stats.dropped) == (20, 20, 18)
    release.set()
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_checked, stats.dropped, stats.mismatches) == (2, 18, 0)


def test_the_window_report_counts_the_drops(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=1.0, seed=0, queue_size=1)
    release = threading.Event()
    real: Callable[[Checker, Sample], Any] = Checker.check

    def slow(sample: Sample) -> Any:
        release.wait(60)
        return real(guard.checker, sample)

    guard.checker.check = slow  # type: ignore[method-assign]
    wrapped = guard.wrap(saxpy)
    for seed in range(10):
        wrapped(*pair(50, seed))
    release.set()
    assert guard.flush(30)
    body = guard.reporter.body()  # type: ignore[attr-defined]
    reports = body["reports"]
    assert sum(r["calls_seen"] for r in reports) == 10
    assert sum(r["dropped"] for r in reports) == guard.stats().dropped >= 8
    assert sum(r["calls_checked"] for r in reports) == 10 - guard.stats().dropped
