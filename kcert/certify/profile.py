"""Where an output's error falls: a small, bounded map of error relative to its bound.

The error metrics of a probe say how large the worst error was and where the
first bad element is; the profile says where the error lies across the whole
output (the last tile, one row, the tail past a multiple of the block), which is
what a person looks at first when a kernel fails. It is signed with the rest of
the certificate, so it has to stay small: every output is reduced to at most
:data:`MAX_BINS_1D` bins, or :data:`MAX_SIDE` by :data:`MAX_SIDE` bins for a
matrix, with a budget of :data:`PROBE_BINS` bins shared by a probe's outputs,
and each bin is one character (:class:`kcert.certify.report.ErrorProfile` says
how to read it). Decimal numbers would cost ten times as much once the
canonical JSON is base64-encoded into the envelope.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kcert.certify.report import (
    PROFILE_ALPHABET,
    PROFILE_BOUND_LEVEL,
    PROFILE_NONFINITE_LEVEL,
    PROFILE_STEPS_PER_DECADE,
    ErrorProfile,
)

MAX_BINS_1D = 64
MAX_SIDE = 32
#: Bins for all the outputs of one probe together: 40 probes stay under ~60 KB.
PROBE_BINS = 1024
_TOP_FINITE = PROFILE_NONFINITE_LEVEL - 1


def element_levels(ratio: np.ndarray[Any, Any],
                   failed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """Per element, its level: ``ratio`` is ``|got - ref| / allowed`` (NaN where it has no
    meaning, such as a NaN output), ``failed`` whether the element fails its checks.

    Failing is what decides the side of the bound, not the ratio: an excused overflow
    stays at most at the bound, and a failure with no ratio above 1 shows as NaN/poison.
    """
    with np.errstate(all="ignore"):
        steps = np.ceil(np.log10(ratio) * PROFILE_STEPS_PER_DECADE)
        level = np.clip(np.nan_to_num(steps, nan=-1e9, posinf=1e9, neginf=-1e9)
                        + PROFILE_BOUND_LEVEL, 1, _TOP_FINITE)  # fmt: skip
        measured = ratio > 0  # False for 0 and NaN
    level = np.where(measured, level, 0).astype(np.uint8)
    over = measured & (ratio > 1)
    level = np.where(failed & ~over, PROFILE_NONFINITE_LEVEL, level)
    level = np.where(~failed, np.minimum(level, PROFILE_BOUND_LEVEL), level)
    result: np.ndarray[Any, Any] = level.astype(np.uint8)
    return result


def view_extent(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``(n,)`` for a vector (axes of 1 dropped), ``(rows, cols)`` for anything wider."""
    long_axes = [s for s in shape if s != 1]
    if len(long_axes) <= 1:
        return (math.prod(shape),)
    return (math.prod(shape[:-1]), shape[-1])


def bin_counts(extent: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """Bins along each axis of ``extent`` for ``budget`` bins at most."""
    if len(extent) == 1:
        return (max(1, min(extent[0], MAX_BINS_1D, budget)),)
    side = max(1, min(MAX_SIDE, math.isqrt(budget)))
    return (max(1, min(extent[0], side)), max(1, min(extent[1], side)))


def profile(levels: np.ndarray[Any, Any], shape: tuple[int, ...], *,
            budget: int = PROBE_BINS) -> ErrorProfile:  # fmt: skip
    """Bin per-element ``levels`` (of an output of ``shape``) by their maximum."""
    extent = view_extent(shape)
    bins = bin_counts(extent, budget)
    if math.prod(extent) == 0:
        return ErrorProfile(extent, bins, PROFILE_ALPHABET[0] * math.prod(bins))
    grid = levels.reshape(extent if len(extent) == 2 else (1, extent[0]))
    for axis, count in enumerate(bins if len(extent) == 2 else (1, bins[0])):
        size = grid.shape[axis]
        starts = (np.arange(count) * size) // count
        grid = np.maximum.reduceat(grid, starts, axis=axis)
    text = "".join(PROFILE_ALPHABET[int(v)] for v in grid.reshape(-1))
    return ErrorProfile(extent, bins, text)

