"""Sampling: a seeded fixed rate, and the outlier detector that always samples unusual calls."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from guard_factory import pair, saxpy

from kcert.guard import Guard, OutlierDetector, Sampler
from kcert.guard.arrays import features


def decisions(rate: float, seed: int, calls: int = 2000) -> list[bool]:
    sampler = Sampler(rate, seed=seed)
    return [sampler.decide(None).sampled for _ in range(calls)]


def test_rate_is_reproducible_with_a_seed_and_varies_without_it() -> None:
    assert decisions(0.05, seed=3) == decisions(0.05, seed=3)
    assert decisions(0.05, seed=3) != decisions(0.05, seed=4)


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_rate_is_kept(rate: float) -> None:
    calls = 20000
    taken = sum(decisions(rate, seed=11, calls=calls))
    sigma = (calls * rate * (1 - rate)) ** 0.5
    assert abs(taken - calls * rate) < 5 * sigma


def test_rate_zero_and_one_are_exact() -> None:
    assert not any(decisions(0.0, seed=1))
    assert all(decisions(1.0, seed=1))


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_a_rate_outside_zero_to_one_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Sampler(rate)


def test_detector_flags_a_ten_times_larger_input_after_warm_up() -> None:
    detector = OutlierDetector()
    flagged = []
    for seed in range(40):
        x, y = pair(1000 + seed, seed)
        flagged.append(detector.observe(features([(x, True), (y, True)])))
    assert not any(flagged)  # the warm-up and the usual traffic
    big_x, big_y = pair(10000, 99)
    assert detector.observe(features([(big_x, True), (big_y, True)]))
    x, y = pair(1010, 100)
    assert not detector.observe(features([(x, True), (y, True)]))


def test_detector_flags_values_ten_times_larger_in_the_same_shape() -> None:
    detector = OutlierDetector()
    for seed in range(40):
        x, y = pair(1000, seed)
        assert not detector.observe(features([(x, True), (y, True)]))
    x, y = pair(1000, 41)
    assert detector.observe(features([(x * 10, True), (y, True)]))


def test_nothing_is_flagged_during_the_warm_up() -> None:
    detector = OutlierDetector(warmup=16)
    sizes = [10, 10000, 10, 10000] * 3
    assert not any(detector.observe([float(np.log2(s))]) for s in sizes)


def test_guard_at_rate_zero_still_checks_the_outlier(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(sample_rate=0.0, seed=0)
    wrapped = guard.wrap(saxpy)
    for seed in range(30):
        wrapped(*pair(500, seed))
    wrapped(*pair(5000, 77))
    assert guard.flush(30)
    stats = guard.stats()
    assert (stats.calls_seen, stats.calls_sampled, stats.outliers) == (31, 1, 1)
    assert stats.calls_checked == 1 and stats.mismatches == 0


def test_features_survive_huge_and_non_finite_values() -> None:
    x = np.full(1000, 3e38, dtype=np.float32)
    x[::7] = np.nan
    values = features([(x, True)])
    assert all(np.isfinite(values))
    assert values[-1] > 0.1  # the fraction of non-finite elements
