"""The error profile: per-element levels, binning, and the bound on its size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kcert.certify.checks import compare, error_profile
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.profile import MAX_BINS_1D, MAX_SIDE, bin_counts, element_levels, view_extent
from kcert.certify.report import (
    PROFILE_ALPHABET,
    PROFILE_BOUND_LEVEL,
    PROFILE_NONFINITE_LEVEL,
    Status,
)
from kcert.certify.spec import load_spec
from kcert.certify.tolerance import Allowance


def _levels(text: str) -> list[int]:
    return [PROFILE_ALPHABET.index(ch) for ch in text]


def _allow(shape: tuple[int, ...], atol: float = 1e-5) -> Allowance:
    return Allowance(np.full(shape, atol), atol, 0.0, "spec")


def test_levels_put_the_bound_between_48_and_49() -> None:
    ratio = np.array([0.0, 1e-20, 1e-4, 1.0, 1.0001, 1e3, 1e30, np.nan, np.inf, np.inf])
    failed = np.array([False, False, False, False, True, True, True, True, True, False])
    got = element_levels(ratio, failed).tolist()
    assert got[0] == 0  # exact
    assert got[1] == 1  # far below the scale: the lowest finite level
    assert got[2] == PROFILE_BOUND_LEVEL - 16  # four levels per decade
    assert got[3] == PROFILE_BOUND_LEVEL  # exactly at the bound passes
    assert got[4] == PROFILE_BOUND_LEVEL + 1
    assert got[5] == PROFILE_BOUND_LEVEL + 12
    assert got[6] == PROFILE_NONFINITE_LEVEL - 1  # clamped, still finite
    assert got[7] == PROFILE_NONFINITE_LEVEL  # NaN output
    assert got[8] == PROFILE_NONFINITE_LEVEL - 1  # integer off by one with nothing allowed
    # an excused overflow (Inf where the exact answer overflows) is not a failure
    assert got[9] <= PROFILE_BOUND_LEVEL


def test_a_failure_without_a_ratio_above_one_shows_as_nan_or_poison() -> None:
    levels = element_levels(np.array([0.5, 0.0]), np.array([True, True]))
    assert levels.tolist() == [PROFILE_NONFINITE_LEVEL, PROFILE_NONFINITE_LEVEL]


def test_vector_failures_land_in_the_bins_that_hold_them() -> None:
    ref = np.linspace(1.0, 2.0, 1000).astype(np.float32)
    got = ref.copy()
    got[990:] += np.float32(1e-3)  # the tail is wrong
    got[5] = np.nan
    unwritten = np.zeros(ref.shape, dtype=bool)
    unwritten[500] = True
    profile = error_profile("f32", got, ref, _allow(ref.shape), unwritten=unwritten)
    assert profile.extent == (1000,) and profile.bins == (MAX_BINS_1D,)
    levels = _levels(profile.levels)
    failing = [i for i, v in enumerate(levels) if v > PROFILE_BOUND_LEVEL]
    # bin i covers [i*1000//64, (i+1)*1000//64): 5 -> 0, 500 -> 32, 990.. -> 63
    assert failing == [0, 32, 63]
    assert levels[0] == levels[32] == PROFILE_NONFINITE_LEVEL
    assert PROFILE_BOUND_LEVEL < levels[63] < PROFILE_NONFINITE_LEVEL
    assert set(levels) - {0, levels[63], PROFILE_NONFINITE_LEVEL} == set()
    # the profile counts what compare counts, plus the unwritten element
    assert compare("f32", got, ref, _allow(ref.shape)).bad_count == 11


def test_matrix_heat_map_finds_a_bad_column_and_small_outputs_keep_every_element() -> None:
    rng = np.random.default_rng(1)
    ref = rng.random((100, 70)).astype(np.float32)
    got = ref + np.float32(1e-7)
    got[:, 69] += 1.0
    profile = error_profile("f32", got, ref, _allow(ref.shape), unwritten=np.zeros((100, 70), bool))
    assert profile.extent == (100, 70) and profile.bins == (MAX_SIDE, MAX_SIDE)
    grid = np.array(_levels(profile.levels)).reshape(MAX_SIDE, MAX_SIDE)
    assert (grid[:, -1] > PROFILE_BOUND_LEVEL).all()
    assert (grid[:, :-1] <= PROFILE_BOUND_LEVEL).all()
    small = error_profile("f32", got[:3, :5], ref[:3, :5], _allow((3, 5)),
                          unwritten=np.zeros((3, 5), bool))  # fmt: skip
    assert small.bins == (3, 5) and len(small.levels) == 15


@pytest.mark.parametrize(("shape", "extent"), [
    ((), (1,)), ((7,), (7,)), ((1, 1, 300), (300,)), ((4, 1, 9), (4, 9)), ((2, 3, 5), (6, 5)),
])  # fmt: skip
def test_outputs_are_viewed_as_vectors_or_matrices(shape: tuple[int, ...],
                                                   extent: tuple[int, ...]) -> None:  # fmt: skip
    assert view_extent(shape) == extent


def test_a_probe_budget_is_shared_by_its_outputs() -> None:
    assert bin_counts((10_000, 10_000), 1024) == (32, 32)
    assert bin_counts((10_000, 10_000), 1024 // 3) == (18, 18)
    assert bin_counts((10_000,), 1024 // 40) == (25,)
    assert bin_counts((0,), 1024) == (1,)


@pytest.mark.slow
def test_the_pipeline_records_where_a_kernel_left_its_tail_unwritten() -> None:
    """A grid rounded down leaves the last partial block unwritten: the profile shows the tail."""
    spec = Path(__file__).resolve().parents[1] / "assets" / "triton" / "kcert.toml"
    kernel = load_spec(spec).kernel("add_grid_rounded_down")
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", max_probes=3,
                                            timing=False, minimize=False))  # fmt: skip
    coverage = next(c for c in report.checks if c.name == "coverage")
    assert coverage.status is Status.FAIL
    probe = next(p for p in report.probes if p.id == coverage.probe)
    metrics = probe.metrics["out"]
    assert metrics.profile is not None and probe.to_json()["metrics"]["out"]["profile"]
    (n,) = metrics.profile.extent
    first_unwritten = coverage.details["out"]["first_index"][0]
    levels = _levels(metrics.profile.levels)
    count = len(levels)
    for i, level in enumerate(levels):
        last = (i + 1) * n // count - 1
        # unwritten (poison) elements are failures; everything before them is exact here
        assert (level == PROFILE_NONFINITE_LEVEL) == (last >= first_unwritten), (i, level)
    for other in report.probes:
        assert all(m.profile is not None for m in other.metrics.values())
    # one copy per probe and output: the checks' summaries of the worst error leave it out
    assert "levels" not in json.dumps([c.to_json() for c in report.checks])
