"""Arithmetic on the Triton interpreter computed as the compiled kernel computes it.

**bfloat16.** The interpreter (``TRITON_INTERPRET=1``) keeps a bfloat16 tensor
as its raw 16 bits in a ``uint16`` array and hands those integers to NumPy:
``x * w`` on two bfloat16 tensors multiplies their bit patterns (0.707 times
1.0 comes out as 2.4e23), a comparison orders negative values backwards,
``tl.sum`` adds bit patterns, and a cast to or from an integer copies bits as
numbers. It also truncates float32 to bfloat16 where the compiler rounds to
nearest even. A correct bfloat16 kernel therefore fails every value check
there, and a certificate made on the interpreter would say nothing about what
a GPU computes. The compiler lowers each bfloat16 operation to one rounding of
the exact result (native ``bf16`` instructions on sm_90), or to float32
arithmetic rounded back to bfloat16 where there is no native instruction
(``exp``, ``sqrt``, division). :func:`install` wraps the interpreter's
arithmetic entry points so that every operation with a bfloat16 operand
decodes the operands to float32, runs the interpreter's own float32 operation,
and rounds a bfloat16 result back to nearest even (NaN kept NaN). A product of
two bfloat16 values is exact in float32, so it rounds once, as on a GPU; a sum
can round twice (float32, then bfloat16), which differs from one rounding only
when the float32 sum lands exactly halfway between two bfloat16 values.

**float16 accumulators.** ``tl.dot(a, b, out_dtype=tl.float16)`` accumulates in
float16 on a GPU (the MMA instructions' float16 accumulator), but the
interpreter calls NumPy's float16 ``matmul``, which sums in float32 and rounds
once: a kernel whose long float16 accumulation is far off on a GPU looks
accurate there. The wrapped ``dot`` adds the products of each run of
:data:`MMA_K` along K in float32 (one MMA instruction's worth) and rounds the
accumulator to float16 after each, as the instructions do.

It runs in the sandboxed worker only, before the kernel's module is imported.
It is not a security boundary (the kernel runs in that process and can undo
it); a kernel that does so only fails its own checks. :func:`install` checks
that the interpreter still has the entry points it wraps and raises
:class:`Unsupported` otherwise: a Triton release that restructured the
interpreter must not silently bring the raw-bits arithmetic back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

#: InterpreterBuilder methods, and the position of the operand whose dtype is the result's.
_BUILDER_OPS = {"binary_op": 0, "unary_op": 0, "ternary_op": 2, "create_fma": 2,
                "create_erf": 0, "create_rsqrt": 0}  # fmt: skip
#: Reductions and scans whose NumPy implementation reads the bits as integers.
_REDUCE_OPS = ("sum", "min_max")
_SCAN_OPS = ("cumsum", "cumprod")
_MARK = "_kcert_numerics"
#: The K extent of one float16 MMA instruction (wgmma and mma.sync take K = 16 for float16).
MMA_K = 16


class Unsupported(RuntimeError):
    """This Triton's interpreter lacks an entry point the bfloat16 arithmetic wraps."""


def decode(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they encode (exactly)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def encode(values: np.ndarray) -> np.ndarray:
    """float values rounded to the nearest bfloat16 (ties to even), as uint16 bit patterns."""
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def install() -> None:
    """Make the interpreter's bfloat16 arithmetic that of the compiler (idempotent)."""
    # lazy: Triton is imported only in the worker that runs a Triton kernel
    from triton.runtime import interpreter

    targets: list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = []
    builder = interpreter.InterpreterBuilder
    for name, position in _BUILDER_OPS.items():
        targets.append((builder, name, functools.partial(_builder_op, interpreter, position)))
    targets.append((builder, "cast_impl", functools.partial(_cast, interpreter)))
    targets.append((builder, "create_dot", functools.partial(_dot, interpreter)))
    for name in _REDUCE_OPS:
        targets.append((interpreter.ReduceOps, name, functools.partial(_reduction, interpreter)))
    for name in _SCAN_OPS:
        targets.append((interpreter.ScanOps, name, functools.partial(_reduction, interpreter)))
    missing = [f"{cls.__name__}.{name}" for cls, name, _ in targets if not hasattr(cls, name)]
    if missing or not hasattr(interpreter, "TensorHandle"):
        lacking = ", ".join(missing or ["TensorHandle"])
        raise Unsupported(f"this Triton's interpreter has no {lacking}: kcert cannot make its "
                          "bfloat16 arithmetic that of the compiler")  # fmt: skip
    for cls, name, wrap in targets:
        original = getattr(cls, name)
        if not getattr(original, _MARK, False):
            wrapped = functools.wraps(original)(wrap(original))
            setattr(wrapped, _MARK, True)
            setattr(cls, name, wrapped)


def _is_bf16(interpreter: Any, value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return (isinstance(value, interpreter.TensorHandle)
            and getattr(dtype, "scalar", None) == interpreter.tl.bfloat16)  # fmt: skip


def _as_f32(interpreter: Any, handle: Any) -> Any:
    return interpreter.TensorHandle(decode(handle.data), interpreter.tl.float32)


def _builder_op(interpreter: Any, position: int,
                original: Callable[..., Any]) -> Callable[..., Any]:  # fmt: skip
    """An InterpreterBuilder method that decodes bfloat16 operands and rounds a bfloat16 result."""

    def op(self: Any, *args: Any) -> Any:
        if not any(_is_bf16(interpreter, a) for a in args):
            return original(self, *args)
        bf16_result = _is_bf16(interpreter, args[position])
        decoded = [_as_f32(interpreter, a) if _is_bf16(interpreter, a) else a for a in args]
        result = original(self, *decoded)
        if bf16_result and result.data.dtype.kind == "f":
            return interpreter.TensorHandle(encode(result.data), interpreter.tl.bfloat16)
        return result  # a comparison's booleans, or a float32 accumulator

    return op


def _dot(interpreter: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``create_dot`` on bfloat16 values, and into a float16 accumulator rounded per MMA."""
    tl = interpreter.tl

    def dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if _is_bf16(interpreter, a) or _is_bf16(interpreter, b):
            a = _as_f32(interpreter, a) if _is_bf16(interpreter, a) else a
            b = _as_f32(interpreter, b) if _is_bf16(interpreter, b) else b
        if d.dtype.scalar != tl.float16 or a.data.dtype != np.float16 \
                or b.data.dtype != np.float16:  # fmt: skip
            return original(self, a, b, d, *args)
        left, right = a.data.astype(np.float32), b.data.astype(np.float32)
        acc = d.data.astype(np.float32)
        for k in range(0, left.shape[-1], MMA_K):
            step = np.matmul(left[..., k:k + MMA_K], right[..., k:k + MMA_K, :])
            acc = (acc + step).astype(np.float16).astype(np.float32)
        return interpreter.TensorHandle(acc.astype(np.float16), tl.float16)

    return dot


def _cast(interpreter: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``cast_impl`` with bfloat16 on one side: through its values, rounded to nearest even.

    The interpreter truncates float32 to bfloat16 (``.to(tl.bfloat16)``, and every store
    of a float32 value through a bfloat16 pointer) where the compiler's ``fptrunc``
    rounds to nearest even, and copies bits as numbers to and from the integers.
    """
    tl = interpreter.tl

    def cast(self: Any, src: Any, dst_type: Any) -> Any:
        source, target = src.dtype.scalar, dst_type.scalar
        if source == tl.bfloat16 and target not in (tl.bfloat16, tl.float32):
            return original(self, _as_f32(interpreter, src), dst_type)
        if target == tl.bfloat16 and source != tl.bfloat16:
            wide = src if source == tl.float32 else original(self, src, tl.float32)
            return interpreter.TensorHandle(encode(wide.data), tl.bfloat16)
        return original(self, src, dst_type)

    return cast


def _reduction(interpreter: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """A reduction or scan over bfloat16 computed on its values, rounded as a GPU rounds."""
    tl = interpreter.tl
    steps: dict[str, Callable[[np.ndarray, int | None, bool], np.ndarray]] = {
        "sum": _tree_sum, "cumsum": functools.partial(_running, np.add),
        "cumprod": functools.partial(_running, np.multiply)}  # fmt: skip
    stepwise = steps.get(original.__name__)

    def reduce(self: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        items = input if isinstance(input, tuple) else (input,)
        if not any(getattr(i, "dtype", None) == tl.bfloat16 for i in items):
            return original(self, input, *args, **kwargs)
        if stepwise is not None:
            bits = stepwise(decode(input.handle.data), self.axis, getattr(self, "keep_dims", True))
            result = self.to_tensor(bits, tl.bfloat16)
            return [result] if original.__name__ in _SCAN_OPS else result
        wide = tuple(_widened(interpreter, i) for i in items)
        return _narrowed(interpreter, original(self, wide if isinstance(input, tuple) else wide[0],
                                               *args, **kwargs))  # fmt: skip

    return reduce


def _tree_sum(values: np.ndarray, axis: int | None, keep_dims: bool) -> np.ndarray:
    """The sum along ``axis`` by pairs, each partial sum rounded to bfloat16 (a reduction tree)."""
    shape = values.shape
    moved = np.moveaxis(values, axis, 0) if axis is not None else values.reshape(-1)
    while moved.shape[0] > 1:
        if moved.shape[0] % 2:
            moved = np.concatenate([moved, np.zeros_like(moved[:1])])
        moved = decode(encode(moved[0::2] + moved[1::2]))
    total = encode(moved[0])
    if not keep_dims:
        return total
    return np.expand_dims(total, axis) if axis is not None else total.reshape([1] * len(shape))


def _running(step: Callable[..., np.ndarray], values: np.ndarray, axis: int | None,
             keep_dims: bool) -> np.ndarray:  # fmt: skip
    """A scan along ``axis`` with every partial result rounded to bfloat16, in order."""
    del keep_dims  # a scan keeps its shape
    if axis is None:
        values, axis = values.reshape(-1), 0
    moved = np.moveaxis(values, axis, 0).copy()
    for i in range(1, moved.shape[0]):
        moved[i] = decode(encode(step(moved[i - 1], moved[i])))
    return encode(np.moveaxis(moved, 0, axis))


def _widened(interpreter: Any, item: Any) -> Any:
    tl = interpreter.tl
    if getattr(item, "dtype", None) != tl.bfloat16:
        return item
    return tl.core.tensor(_as_f32(interpreter, item.handle), _retyped(tl, item.type, tl.float32))


def _narrowed(interpreter: Any, result: Any) -> Any:
    """float32 tensors of a reduction's result as bfloat16; index outputs as they are."""
    tl = interpreter.tl
    if isinstance(result, list | tuple):
        return type(result)(_narrowed(interpreter, r) for r in result)
    if isinstance(result, tl.core.tensor) and result.dtype == tl.float32:
        handle = interpreter.TensorHandle(encode(result.handle.data), tl.bfloat16)
        return tl.core.tensor(handle, _retyped(tl, result.type, tl.bfloat16))
    return result


def _retyped(tl: Any, ty: Any, dtype: Any) -> Any:
    """``ty`` with ``dtype`` for its elements: a block keeps its shape, a scalar is ``dtype``."""
    return tl.block_type(dtype, list(ty.shape)) if isinstance(ty, tl.block_type) else dtype
