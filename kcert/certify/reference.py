"""Loading a kernel's NumPy reference and calling it safely.

The reference is the user's own code, so it runs in the certifier's process,
but nothing it does may turn into a traceback: an import error, an exception
or an unusable answer becomes a :class:`ReferenceFailure` that says which
function, which probe and what to fix. An answer of another shape than the
spec declares is the spec's or the reference's mistake, a
:class:`~kcert.certify.errors.SpecError`: it is never reshaped to fit.

Float buffers reach the reference as float64 copies (a lossless widening), so
a reference written plainly (``a @ b``) computes in double precision; integer
and bool buffers keep their dtype. Every call gets fresh copies, so the
inputs the kernel sees stay pristine whatever the reference does to its
arguments. ``out`` buffers are passed as zeros of their shape.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kcert.certify.errors import ReferenceFailure
from kcert.certify.executors.base import host_dtype
from kcert.certify.lowp import as_float32, is_float32
from kcert.certify.spec import (
    FLOAT_DTYPES,
    BufferArg,
    ConstArg,
    Intent,
    KernelSpec,
    Launch,
    NoneArg,
)
from kcert.digest import Digest

_IMPORT_LOCK = threading.Lock()


class Reference:
    """A loaded reference function bound to one kernel spec."""

    def __init__(self, kernel: KernelSpec) -> None:
        self.kernel = kernel
        self.text = kernel.reference.text
        self.digest: Digest = kernel.reference.code.digest
        module = _load_module(kernel.reference.path, kernel)
        fn = getattr(module, kernel.reference.function, None)
        if not callable(fn):
            raise ReferenceFailure(
                f"{self.text}: {kernel.reference.path.name} defines no function "
                f"'{kernel.reference.function}' (kernel '{kernel.name}', key 'reference')"
            )
        self._fn: Callable[..., Any] = fn

    def __call__(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], launch: Launch, *, probe: str = ""
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Outputs by name: float64 for float outputs, the output dtype otherwise."""
        kwargs = self._arguments(inputs, launch, float32=False)
        where = f"{self.text} (kernel '{self.kernel.name}', probe {probe or '?'})"
        try:
            with np.errstate(all="ignore"):
                result = self._fn(**kwargs)
        except (Exception, SystemExit) as exc:  # the user's code: reported, never escapes
            raise ReferenceFailure(f"{where} raised {type(exc).__name__}: {exc}") from exc
        return self._outputs(result, launch, where)

    def call_float32(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], launch: Launch, *, probe: str = ""
    ) -> tuple[dict[str, np.ndarray[Any, Any]], bool]:
        """The reference evaluated in float32 (:mod:`kcert.certify.lowp`), as float64 arrays,
        and whether its float answers stayed float32 throughout."""
        kwargs = self._arguments(inputs, launch, float32=True)
        where = f"{self.text} in float32 (kernel '{self.kernel.name}', probe {probe or '?'})"
        try:
            with np.errstate(all="ignore"):
                result = self._fn(**kwargs)
        except (Exception, SystemExit) as exc:  # the user's code: reported, never escapes
            raise ReferenceFailure(f"{where} raised {type(exc).__name__}: {exc}") from exc
        floats = [o.name for o in self.kernel.outputs if o.dtype in FLOAT_DTYPES]
        raw = [result.get(n) for n in floats] if isinstance(result, Mapping) else [result]
        return self._outputs(result, launch, where), all(is_float32(v) for v in raw)

    def _arguments(self, inputs: Mapping[str, np.ndarray[Any, Any]], launch: Launch, *,
                   float32: bool) -> dict[str, Any]:  # fmt: skip
        """The reference's keyword arguments; float buffers as float32 arrays when ``float32``."""
        kwargs: dict[str, Any] = {}
        for arg in self.kernel.args:
            if isinstance(arg, BufferArg):
                value = self._argument(arg, inputs, launch)
                if float32 and arg.dtype in FLOAT_DTYPES:
                    value = as_float32(value)
                kwargs[arg.name] = value
            elif isinstance(arg, ConstArg):
                kwargs[arg.name] = launch.consts[arg.name]
            elif isinstance(arg, NoneArg):
                kwargs[arg.name] = None
            else:
                kwargs[arg.name] = launch.scalars[arg.name]
        return kwargs

    def _argument(self, arg: BufferArg, inputs: Mapping[str, np.ndarray[Any, Any]],
                  launch: Launch) -> np.ndarray[Any, Any]:  # fmt: skip
        wide = np.float64 if arg.dtype in FLOAT_DTYPES else host_dtype(arg.dtype)
        if arg.intent is Intent.OUT:
            return np.zeros(launch.shapes[arg.name], dtype=wide)
        return np.array(inputs[arg.name], dtype=wide, copy=True)

    def _outputs(self, result: Any, launch: Launch, where: str) -> dict[str, np.ndarray[Any, Any]]:
        outputs = self.kernel.outputs
        if isinstance(result, Mapping):
            missing = [o.name for o in outputs if o.name not in result]
            if missing:
                raise ReferenceFailure(f"{where} returned a dict without {', '.join(missing)}")
            values = {o.name: result[o.name] for o in outputs}
        elif len(outputs) == 1:
            values = {outputs[0].name: result}
        else:
            names = ", ".join(o.name for o in outputs)
            raise ReferenceFailure(f"{where} must return a dict with {names} (several outputs)")
        return {o.name: self._coerce(o, values[o.name], launch, where) for o in outputs}

    def _coerce(self, out: BufferArg, value: Any, launch: Launch,
                where: str) -> np.ndarray[Any, Any]:  # fmt: skip
        shape = launch.shapes[out.name]
        try:
            array = np.asarray(value)
        except Exception as exc:
            raise ReferenceFailure(f"{where}: output '{out.name}' is not an array: {exc}") from exc
        if _narrow_float(array.dtype):
            # a reference that rounds like the kernel (ml_dtypes' bfloat16, float8...)
            array = array.astype(np.float64)
        if array.dtype.kind not in "biuf":
            raise ReferenceFailure(f"{where}: output '{out.name}' has dtype {array.dtype}; "
                                   "return numbers")  # fmt: skip
        if array.shape != shape:
            if not _same_layout(array.shape, shape):
                # reshaping a transpose to fit would blame the kernel for the reference's answer
                raise self.kernel.error(
                    "reference", f"{where}: output '{out.name}' was returned with shape "
                    f"{array.shape}, but the spec declares {shape} "
                    f"({out.spec_text()}); return it in the declared shape")  # fmt: skip
            array = array.reshape(shape)  # only axes of length 1 differ: the same elements
        if out.dtype in FLOAT_DTYPES:
            return array.astype(np.float64)
        if out.dtype == "bool":
            return array.astype(bool)
        target = host_dtype(out.dtype)
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)):
                raise ReferenceFailure(f"{where}: integer output '{out.name}' has NaN or Inf")
            array = np.rint(array)
        return array.astype(target)


def _same_layout(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Shapes that differ only in axes of length 1 hold the same elements in the same order."""
    return [d for d in got if d != 1] == [d for d in want if d != 1]


def _narrow_float(dtype: np.dtype[Any]) -> bool:
    """ml_dtypes' floats (bfloat16, float8_*): NumPy sees them as kind 'V'."""
    if dtype.kind != "V" or dtype.fields is not None:
        return False
    try:
        # lazy: ml_dtypes is needed only for the narrow float dtypes
        import ml_dtypes

        ml_dtypes.finfo(dtype)  # type: ignore[no-untyped-call]
    except (ImportError, ValueError, TypeError):
        return False
    return True


def _load_module(path: Path, kernel: KernelSpec) -> ModuleType:
    """Run the reference's bytes, as read with the spec, as a fresh module.

    The module's folder is importable while it loads, so a reference may import
    a helper beside it. Never the file on disk: the certificate's reference
    digest names exactly the bytes that ran.
    """
    code = kernel.reference.code
    digest = code.digest
    name = f"kcert_reference_{Digest.of_bytes(str(path).encode()).hex[:16]}"
    with _IMPORT_LOCK:
        cached = sys.modules.get(name)
        if cached is not None and getattr(cached, "__kcert_digest__", None) == digest:
            return cached
        module = ModuleType(name)
        module.__file__ = str(path)
        folder = str(path.parent)
        sys.path.insert(0, folder)
        try:
            exec(compile(code.data, str(path), "exec"), module.__dict__)  # noqa: S102
        except (Exception, SystemExit) as exc:  # the user's code: a diagnostic, no traceback
            raise ReferenceFailure(
                f"importing {path.name} (kernel '{kernel.name}', key 'reference') raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if sys.path and sys.path[0] == folder:
                del sys.path[0]
        module.__kcert_digest__ = digest  # type: ignore[attr-defined]
        sys.modules[name] = module
        return module
