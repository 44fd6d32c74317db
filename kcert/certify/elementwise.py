"""Element-wise facts about a kernel's output, shared by the probe checks and the comparison.

Everything here compares arrays element by element and returns masks, first
indices or counts: which elements hold the same bytes, where a guard band was
written, which NaN or Inf values the reference does not excuse, and the spacing
of a dtype (its ulp). The checks (:mod:`kcert.certify.probe_checks`) turn these
into findings; :mod:`kcert.certify.checks` turns them into error metrics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kcert.certify.execution import PaddedBuffer
from kcert.certify.spec import FLOAT_DTYPES
from kcert.certify.tolerance import float_info


def data_region(buf: PaddedBuffer, padded: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The data region of ``padded`` (laid out as ``buf``), viewed with the buffer's shape."""
    return padded[buf.guard : buf.guard + buf.size].reshape(buf.shape)


def same_bytes(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Where ``a`` and ``b`` hold identical bytes (NaN payloads and signed zeros included)."""
    same: np.ndarray[Any, Any] = np.all(_rows(a) == _rows(b), axis=1)
    return same.reshape(a.shape)


def first_index(mask: np.ndarray[Any, Any]) -> tuple[int, ...]:
    """The first set element of a non-empty ``mask``, in C order."""
    flat = int(np.flatnonzero(mask.reshape(-1))[0])
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def changed(before: np.ndarray[Any, Any],
            after: np.ndarray[Any, Any]) -> tuple[int, tuple[int, ...]] | None:  # fmt: skip
    """How many elements' bytes changed, and the first; None when none did."""
    differ = ~same_bytes(before, after)
    if not differ.any():
        return None
    return int(differ.sum()), first_index(differ)


def guard_damage(buf: PaddedBuffer, got: np.ndarray[Any, Any]) -> dict[str, Any] | None:
    """Where a guard band was written: element counts and the farthest distance on each side."""
    end = buf.guard + buf.size
    before = ~same_bytes(got[: buf.guard], buf.padded[: buf.guard])
    after = ~same_bytes(got[end:], buf.padded[end:])
    if not before.any() and not after.any():
        return None
    parts: list[str] = []
    info: dict[str, Any] = {"guard_elements": buf.guard}
    if after.any():
        far = int(np.flatnonzero(after)[-1]) + 1
        info["after"] = {"written": int(after.sum()), "farthest": far}
        parts.append(f"written up to {far} element(s) past its end ({int(after.sum())} written)")
    if before.any():
        far = buf.guard - int(np.flatnonzero(before)[0])
        info["before"] = {"written": int(before.sum()), "farthest": far}
        parts.append(f"written up to {far} element(s) before its start ({int(before.sum())} "
                     "written)")  # fmt: skip
    info["text"] = " and ".join(parts)
    return info


def ulp(dtype: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The spacing of ``dtype`` at each value (integers: 1)."""
    if dtype not in FLOAT_DTYPES:
        return np.ones(np.shape(values))
    info = float_info(dtype)
    with np.errstate(all="ignore"):
        _, exponent = np.frexp(np.abs(values))
    # frexp(0) gives exponent 0; zero's spacing is that of the subnormals
    exponent = np.where(values == 0, int(info.minexp), np.maximum(exponent - 1, int(info.minexp)))
    spacing: np.ndarray[Any, Any] = np.ldexp(1.0, exponent - int(info.nmant))
    return spacing


def overflow_excused(dtype: str, g: np.ndarray[Any, Any], r: np.ndarray[Any, Any],
                     allowed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """An Inf is a correct rounding when the exact answer may lie past the overflow threshold."""
    top = float(float_info(dtype).max)
    threshold = top + float(ulp(dtype, np.array([top]))[0]) / 2
    with np.errstate(all="ignore"):
        reach = np.abs(r) + allowed
        excused: np.ndarray[Any, Any] = (np.isinf(g) & np.isfinite(r) & (np.sign(g) == np.sign(r))
                                         & (reach >= threshold))
        return excused


def unexpected_specials(dtype: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
                        allowed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """Where the kernel gave NaN or Inf and the reference, within ``allowed``, does not."""
    if dtype not in FLOAT_DTYPES:
        return np.zeros(got.shape, dtype=bool)
    g, r = as_float64(got), as_float64(ref)
    allowed = np.broadcast_to(allowed, g.shape)
    nonfinite = ~np.isfinite(g)
    excused = overflow_excused(dtype, g, r, allowed) | (np.isinf(g) & np.isinf(r))
    bad: np.ndarray[Any, Any] = (nonfinite & np.isfinite(r) & ~excused) | (np.isnan(g)
                                                                          & ~np.isnan(r))
    return bad


def lost_specials(dtype: str, got: np.ndarray[Any, Any],
                  ref: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """Where the reference is NaN or ±Inf and the kernel's element is not the same."""
    if dtype not in FLOAT_DTYPES:
        return np.zeros(got.shape, dtype=bool)
    g, r = as_float64(got), as_float64(ref)
    lost: np.ndarray[Any, Any] = (np.isnan(r) & ~np.isnan(g)) | (np.isinf(r) & (g != r))
    return lost


def as_float64(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` in float64; NaN payloads of low-precision dtypes (ml_dtypes' bfloat16) make
    NumPy warn "invalid value encountered in cast", which says nothing about the kernel."""
    with np.errstate(invalid="ignore"):
        return array.astype(np.float64)


def _rows(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Each element's bytes as one row of a uint8 matrix."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8).reshape(flat.size, flat.dtype.itemsize)
