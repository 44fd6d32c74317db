"""The reference evaluated in float32: the precision-matched yardstick of the tolerance.

Kernel test suites that hold up best (FlashAttention's, for one) do not fix an
``atol``: they accept a kernel whose error against a high-precision truth is
within a small multiple of the error of a plain implementation run in the
kernel's own precision. kcert's plain implementation is the spec's NumPy
reference, so it is run a second time with its float inputs as float32 arrays
of :class:`Float32Array`, a subclass whose ufuncs (arithmetic, ``exp``,
``tanh``, ``matmul``, reductions, cumulative sums) and array functions
(``concatenate``, ``where``, ``einsum``...) take float64 operands and constants
down to float32 and round every result to float32. A reference
written for float64 (``x.astype(np.float64)``, ``np.float64(a) * x``) is thus
evaluated operation by operation in float32, as a kernel would be; and
``log1p``, ``expm1`` and ``logaddexp``, which Triton's language lacks, are
evaluated as a kernel writes them out (``log(1 + x)``...); a scalar function
applied through ``np.vectorize`` (``math.erf``) is rounded to float32.

A reference that leaves for a plain float64 array on the way
(``np.asarray(x, dtype=np.float64)``, filling ``np.zeros(shape)``) goes on in
float64: its answer is a float32 evaluation only in part, which
:func:`is_float32` tells, and the tolerance keeps its model's floor. This
runs in the certifier's process exactly like the float64 reference call: the
same bytes, the same function, fresh copies of the inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Float32Array(np.ndarray):
    """An ndarray whose ufunc results are float32 (float64 operands are rounded first)."""

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        args = tuple(_narrow(x) for x in inputs)
        naive = _AS_A_KERNEL_WRITES_IT.get(ufunc.__name__)
        if naive is not None and method == "__call__" and not kwargs:
            with np.errstate(all="ignore"):
                return _wrap(naive(*(np.asarray(a, dtype=np.float32) for a in args)))
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o).view(np.ndarray) for o in kwargs["out"])
        if kwargs.get("dtype") in (np.float64, float, "float64", "f8"):
            kwargs["dtype"] = np.float32
        result = getattr(ufunc, method)(*args, **kwargs)
        return _wrap(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # concatenate, where, stack, einsum...: on plain float32 operands, the answer rewrapped
        return _wrap(func(*_narrow_all(args), **_narrow_all(kwargs)))


def _logaddexp(a: Any, b: Any) -> Any:
    top = np.maximum(a, b)
    safe = np.where(np.isfinite(top), top, np.float32(0))
    return np.where(np.isfinite(top), safe + np.log(np.exp(a - safe) + np.exp(b - safe)), top)


def _logaddexp2(a: Any, b: Any) -> Any:
    top = np.maximum(a, b)
    safe = np.where(np.isfinite(top), top, np.float32(0))
    return np.where(np.isfinite(top), safe + np.log2(np.exp2(a - safe) + np.exp2(b - safe)), top)


#: Triton's language has no log1p, expm1 or logaddexp: a kernel writes them out, and they
#: cancel (log(1 + x) for small x loses x below half an ulp of 1). The yardstick
#: evaluates them the way a kernel must, so that a correct kernel is not held to a
#: formula it cannot write.
_AS_A_KERNEL_WRITES_IT: dict[str, Any] = {
    "log1p": lambda x: np.log(np.float32(1) + x),
    "expm1": lambda x: np.exp(x) - np.float32(1),
    "logaddexp": _logaddexp,
    "logaddexp2": _logaddexp2,
}


def as_float32(value: np.ndarray[Any, Any]) -> Float32Array:
    """A fresh float32 copy of ``value`` as a :class:`Float32Array`."""
    array: Float32Array = np.array(value, dtype=np.float32, copy=True).view(Float32Array)
    return array


def is_float32(value: Any) -> bool:
    """Whether a reference's answer came out of a float32 evaluation (see the module doc)."""
    return isinstance(value, Float32Array)


def _narrow_all(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return type(value)(_narrow_all(v) for v in value)
    if isinstance(value, dict):
        return {k: _narrow_all(v) for k, v in value.items()}
    if value is np.float64 or value is float:
        return np.float32  # a dtype argument
    return _narrow(value)


def _narrow(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        plain = value.view(np.ndarray)
        return plain.astype(np.float32) if plain.dtype == np.float64 else plain
    if isinstance(value, float | np.floating) and not isinstance(value, np.float32):
        return np.float32(value)
    return value


def _wrap(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    if isinstance(result, np.ndarray) and result.dtype == object:
        # np.vectorize(math.erf) and other frompyfunc ufuncs: Python floats, rounded to float32
        try:
            return result.astype(np.float32).view(Float32Array)
        except (TypeError, ValueError):
            return result
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        return result.astype(np.float32, copy=False).view(Float32Array)
    if isinstance(result, np.floating):
        return np.float32(result)
    return result
