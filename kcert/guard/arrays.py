"""The arrays a guarded call may take: NumPy, torch (CPU or CUDA) and CuPy.

Three operations per array, chosen so that the caller's thread never waits:

* :func:`snapshot` copies an array *on its own device* before the call (a
  kernel may write its inputs in place). A torch or CuPy copy on a GPU is
  queued on the current stream, so it sees the inputs as they were when the
  call was made and costs the caller a launch, not a device sync.
* :func:`to_host` turns a snapshot into a NumPy array. It runs on the guard's
  worker thread, where waiting for the device is harmless.
* :func:`features` gives the sampler's per-call features (:mod:`kcert.guard.sampler`).
  Value features read at most :data:`SUBSAMPLE` elements at a fixed stride, and
  only from host arrays: reading a GPU array's values would wait for the device,
  so a GPU call is described by its shapes alone.

torch and CuPy are never imported here: an array is recognised by the module
its type comes from, so a process that uses neither pays nothing for them.
CuPy support follows CuPy's documented API (``copy``, ``get``) but has not run
in CI, which has no GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

#: Value features read at most this many elements of a buffer.
SUBSAMPLE = 256
_WIDE_ENOUGH = (np.dtype(np.float32), np.dtype(np.float64))


def kind(value: Any) -> str | None:
    """``"numpy"``, ``"torch"``, ``"cupy"``, or None for anything that is not an array."""
    if isinstance(value, np.ndarray):
        return "numpy"
    module = type(value).__module__
    if module.startswith("torch") and hasattr(value, "detach"):
        return "torch"
    if module.startswith("cupy") and hasattr(value, "get"):
        return "cupy"
    return None


def on_gpu(value: Any) -> bool:
    k = kind(value)
    if k == "torch":
        return bool(value.is_cuda)
    return k == "cupy"


def shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, np.ndarray):
        dims: tuple[int, ...] = value.shape
        return dims
    return tuple(int(e) for e in value.shape)


def snapshot(value: Any) -> Any:
    """A copy of ``value`` on its own device, taken now."""
    k = kind(value)
    if k == "numpy":
        return np.array(value, copy=True)
    if k == "torch":
        return value.detach().clone()
    return value.copy()


def to_host(value: Any) -> np.ndarray[Any, Any]:
    """A NumPy array holding ``value``'s elements (bfloat16 through ml_dtypes)."""
    k = kind(value)
    if k == "numpy":
        return np.asarray(value)
    if k == "cupy":
        host: np.ndarray[Any, Any] = value.get()
        return host
    tensor = value.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        # lazy: ml_dtypes is needed only for the narrow float dtypes
        import ml_dtypes
        import torch

        bits: np.ndarray[Any, Any] = tensor.contiguous().view(torch.int16).numpy()
        return bits.view(ml_dtypes.bfloat16)
    return np.asarray(tensor.numpy())


def features(buffers: Iterable[tuple[Any, bool]]) -> list[float]:
    """The sampler's features of one call's ``(array, is_input)`` pairs, in argument order."""
    out: list[float] = []
    for value, is_input in buffers:
        dims = shape(value)
        out.extend(math.log2(1 + e) for e in dims)
        if is_input and kind(value) != "cupy" and not on_gpu(value):
            out.extend(_value_features(value))
    return out


def _value_features(value: Any) -> list[float]:
    with np.errstate(all="ignore"):  # overflow in a feature is no news to the caller
        return _summary(value)


def _summary(value: Any) -> list[float]:
    """``log2(1 + max|x|)``, mean, std and the fraction of non-finite values of a subsample.

    Four reductions in the common case (every value finite, which a finite sum shows):
    this runs on every call, so it avoids NumPy's ``std`` and boolean masks.
    """
    sample = _subsample(value)
    try:
        # float32 sums 256 values well enough for a feature; integers could overflow
        wide = sample if sample.dtype in _WIDE_ENOUGH else sample.astype(np.float64)
    except (TypeError, ValueError):  # not numbers; ml_dtypes' bfloat16 converts
        return [0.0, 0.0, 0.0, 0.0]
    count = wide.size
    if count == 0:
        return [0.0, 0.0, 0.0, 0.0]
    total, squares = float(wide.sum()), float(np.dot(wide, wide))
    if math.isfinite(total) and math.isfinite(squares):
        nonfinite = 0.0
    else:
        finite = np.isfinite(wide)
        wide = wide[finite].astype(np.float64)  # float32 squares of large values overflow
        nonfinite = 1.0 - wide.size / count
        if wide.size == 0:
            return [0.0, 0.0, 0.0, 1.0]
        total, squares = float(wide.sum()), float(np.dot(wide, wide))
    mean = total / wide.size
    spread = math.sqrt(max(squares / wide.size - mean * mean, 0.0))
    top = max(float(wide.max()), -float(wide.min()))
    return [math.log2(1.0 + top), mean, spread, nonfinite]


def _subsample(value: Any) -> np.ndarray[Any, Any]:
    """At most :data:`SUBSAMPLE` elements of a host array, evenly strided over it."""
    size = math.prod(shape(value))
    step = max(1, -(-size // SUBSAMPLE))
    if kind(value) == "torch":
        flat = value.detach().reshape(-1)[::step]
        if str(flat.dtype) == "torch.bfloat16":
            flat = flat.float()  # NumPy has no bfloat16 of its own
        return np.asarray(flat.numpy())
    array = np.asarray(value)
    if array.flags.c_contiguous:
        return array.reshape(-1)[::step]
    index = np.unravel_index(np.arange(0, size, step), array.shape)
    picked: np.ndarray[Any, Any] = array[index]
    return picked
