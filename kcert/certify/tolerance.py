"""Default tolerances: how far a correct kernel's output may be from the reference.

Fixed ``atol``/``rtol`` pairs cannot serve every kernel: a sum of 10^5 float32
values, a K=4096 matmul on large inputs and an elementwise add differ by
orders of magnitude in the rounding error a *correct* float32 kernel commits.
So the default bound is computed per element from an estimate of the
operation's own rounding error at the kernel's precision, derived from the
reference itself. For every element ``i`` of a floating-point output::

    allowed[i] = tiny(out) + 2·u_out·|ref[i]| + R·u_c·|ref[i]| + K·u_c·√L·(|ref[i]| + S[i])

* ``u_out`` is the unit roundoff of the output dtype (the final rounding and
  the comparison's own); ``u_c`` that of the compute precision: float64 when
  any buffer is float64, else float32, since f16/bf16 kernels accumulate in
  float32 (a float16 accumulator is exactly the bug to catch). ``tiny`` is
  the smallest normal number of the output dtype, which excuses flushing
  subnormals to zero. ``R = 2**9`` is a floor for short, well-conditioned
  computations (a few ops, transcendental functions within a few ulps).
* ``L`` is the accumulation length: the product of the dims that appear in
  some input buffer's shape but not in this output's (``k`` for a matmul,
  ``n`` for a row sum, 1 for elementwise kernels). Probabilistic rounding
  analysis (Higham & Mary, 2019) puts the error of a length-L accumulation at
  about ``√L·u`` times the size of its partial sums, whatever the order of
  summation; the worst case ``L·u`` needs adversarially correlated rounding.
  When the reference is not homogeneous (below) it may reduce internally
  along an axis the output keeps (softmax, layernorm), so ``L`` is then at
  least the longest axis of any input.
* ``S[i]`` measures the size of the terms that cancel into ``ref[i]``:
  - when the reference is positively homogeneous (``f(2x) = 2^d f(x)`` for
    its float inputs, ``d >= 1``: sums, dot products, matmuls, convolutions,
    scalings, max), ``S = √|f(x∘x)|``, the 2-norm of the terms of a
    multilinear sum. The partial sums of a zero-mean sum stay of the order
    of ``‖terms‖₂``, those of a biased one of ``|ref|``; the bound covers both.
  - otherwise (softmax, exp, normalisation) ``S`` is the reference's response
    to random relative perturbations of its float inputs, measured at size
    ``2**-16`` and scaled down to ``u_c`` (root mean square of three draws of
    random signs): the backward-error view, in which a stable algorithm
    returns the exact answer to inputs perturbed by about ``u_c`` each. It
    captures conditioning, e.g. ``exp`` amplifying an argument's rounding.
* ``K = 2`` is the safety factor: a correct accumulation's root-mean-square
  error is about ``u_c·√(L/3)·|ref|`` (biased terms) or ``u_c·√(L/6)·‖terms‖₂``
  (zero-mean terms), so the bound sits five to six standard deviations out.

The model assumes rounding errors behave like random variables, which holds
for the probes' inputs. It does not hold when one sequential accumulator adds
positive terms spanning many binades, so that small terms fall below half an
ulp of the partial sum and are lost systematically (stagnation); the error
then approaches the worst case ``L·u·|ref|`` and such a kernel needs a
``[kernel.tolerance]`` entry.

Both the bound and an accumulator's error grow like ``√L``, so for float32
a float16 accumulator (``u = 2**-11``, 8192 times float32's) lands two
orders of magnitude outside the bound whatever ``L`` is, and a constant off
by 1e-3 is caught too (the floor is ``2**9·2**-24 ≈ 3e-5``). Integer and
bool outputs must match exactly. A ``[kernel.tolerance]`` entry for the
output dtype replaces all of this with exactly ``atol + rtol·|ref|``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kcert.certify.executors.base import host_dtype
from kcert.certify.expr import Expr
from kcert.certify.spec import FLOAT_DTYPES, BufferArg, Intent, KernelSpec
from kcert.errors import KcertError

#: Unit roundoff (half an ulp of 1.0) per dtype.
UNIT_ROUNDOFF = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24, "f64": 2.0**-53}
FLOOR_FACTOR = 2.0**9
SAFETY = 2.0
PERTURBATION = 2.0**-16
PERTURBATION_DRAWS = 3

#: Runs the reference on float64 inputs by name and returns float64 outputs by name.
ReferenceCall = Callable[[Mapping[str, np.ndarray[Any, Any]]], Mapping[str, np.ndarray[Any, Any]]]


@dataclass(frozen=True)
class Allowance:
    """The per-element bound for one output, and how it was made."""

    allowed: np.ndarray[Any, Any]
    atol: float
    rtol: float
    method: str  # "exact", "spec", "homogeneous", "perturbation"
    accumulation: int = 1

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "atol": self.atol, "rtol": self.rtol,
                "accumulation_length": self.accumulation}  # fmt: skip


def compute_dtype(kernel: KernelSpec) -> str:
    return "f64" if any(b.dtype == "f64" for b in kernel.buffers) else "f32"


def float_info(dtype: str) -> Any:
    """``finfo`` of a float spec dtype, bfloat16 included (through ml_dtypes)."""
    import ml_dtypes

    return ml_dtypes.finfo(host_dtype(dtype))  # type: ignore[no-untyped-call]


def tiny(dtype: str) -> float:
    return float(float_info(dtype).tiny)


def accumulation_length(kernel: KernelSpec, output: BufferArg, dims: Mapping[str, int]) -> int:
    """Product of the dims some input is shaped by but ``output`` is not."""
    out_names = _names(output.shape)
    in_names: set[str] = set()
    for buf in kernel.buffers:
        if buf.intent is not Intent.OUT:
            in_names |= _names(buf.shape)
    length = 1
    for name in sorted((in_names - out_names) & set(dims)):
        length *= max(1, int(dims[name]))
    return length


def allowances(
    kernel: KernelSpec,
    reference: ReferenceCall,
    inputs: Mapping[str, np.ndarray[Any, Any]],
    expected: Mapping[str, np.ndarray[Any, Any]],
    dims: Mapping[str, int],
) -> dict[str, Allowance]:
    """The bound of every output; ``expected`` is the reference's float64 answer on ``inputs``."""
    result: dict[str, Allowance] = {}
    modelled: list[BufferArg] = []
    for out in kernel.outputs:
        ref = np.asarray(expected[out.name], dtype=np.float64)
        override = kernel.tolerance.get(out.dtype)
        if override is not None:
            allowed = override.atol + override.rtol * np.abs(ref)
            result[out.name] = Allowance(allowed, override.atol, override.rtol, "spec")
        elif out.dtype not in FLOAT_DTYPES:
            result[out.name] = Allowance(np.zeros(ref.shape), 0.0, 0.0, "exact")
        else:
            modelled.append(out)
    if not modelled:
        return result
    u_c = UNIT_ROUNDOFF[compute_dtype(kernel)]
    wide = {name: np.asarray(v, dtype=np.float64) if _is_float(kernel, name) else v
            for name, v in inputs.items()}  # fmt: skip
    try:
        scales = _homogeneous_scales(kernel, reference, wide, expected)
    except KcertError:
        scales = {}  # the reference refuses scaled inputs: measure its response instead
    perturbed: Mapping[str, np.ndarray[Any, Any]] | None = None
    for out in modelled:
        ref = np.abs(np.asarray(expected[out.name], dtype=np.float64))
        length = accumulation_length(kernel, out, dims)
        spread = scales.get(out.name)
        method = "homogeneous"
        if spread is None:
            if perturbed is None:
                try:
                    perturbed = _perturbation_response(kernel, reference, wide, expected)
                except KcertError:  # no response measured: the floor and |ref| terms remain
                    perturbed = {name: np.zeros(np.shape(v)) for name, v in expected.items()}
            spread, method = perturbed[out.name], "perturbation"
            # a nonlinear reference may reduce along any input axis inside (softmax, layernorm)
            length = max(length, _longest_axis(inputs))
        u_out = UNIT_ROUNDOFF[out.dtype]
        rtol = 2 * u_out + FLOOR_FACTOR * u_c
        atol = tiny(out.dtype)
        with np.errstate(all="ignore"):
            model = SAFETY * u_c * np.sqrt(length) * (ref + spread)
            allowed = atol + rtol * ref + np.where(np.isfinite(model), model, 0.0)
        result[out.name] = Allowance(allowed, atol, rtol, method, length)
    return result


def _homogeneous_scales(
    kernel: KernelSpec, reference: ReferenceCall, inputs: Mapping[str, np.ndarray[Any, Any]],
    expected: Mapping[str, np.ndarray[Any, Any]],
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    """``√|f(x∘x)|`` for each output the reference is positively homogeneous in."""
    floats = [name for name in inputs if _is_float(kernel, name)]
    if not floats:
        return {}
    doubled = reference({n: v * 2.0 if n in floats else v for n, v in inputs.items()})
    homogeneous = [name for name in expected
                   if _degree(np.asarray(expected[name]), np.asarray(doubled[name])) >= 1]
    if not homogeneous:
        return {}
    with np.errstate(all="ignore"):
        squared = reference({n: v * v if n in floats else v for n, v in inputs.items()})
    scales = {}
    for name in homogeneous:
        ref = np.asarray(expected[name], dtype=np.float64)
        with np.errstate(all="ignore"):
            spread = np.sqrt(np.abs(np.asarray(squared[name], dtype=np.float64)))
        if np.all(np.isfinite(spread) | ~np.isfinite(ref)):
            scales[name] = spread
    return scales


def _degree(ref: np.ndarray[Any, Any], doubled: np.ndarray[Any, Any]) -> int:
    """``d`` when ``doubled == 2**d · ref`` everywhere (to 1e-9), else -1."""
    ref = ref.astype(np.float64)
    doubled = doubled.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(doubled)
    nonzero = finite & (ref != 0)
    if not nonzero.any() or not np.array_equal(np.isfinite(ref), np.isfinite(doubled)):
        return -1
    with np.errstate(all="ignore"):
        ratios = np.log2(np.abs(doubled[nonzero] / ref[nonzero]))
    middle = float(np.median(ratios))
    if not np.isfinite(middle):
        return -1
    degree = int(np.rint(middle))
    if not 1 <= degree <= 8:
        return -1
    expect = ref * 2.0**degree
    if np.all(np.abs(doubled[finite] - expect[finite]) <= 1e-9 * np.abs(expect[finite])):
        return degree
    return -1


def _perturbation_response(
    kernel: KernelSpec, reference: ReferenceCall, inputs: Mapping[str, np.ndarray[Any, Any]],
    expected: Mapping[str, np.ndarray[Any, Any]],
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    """RMS change of each output per unit of random relative perturbation of the inputs."""
    rng = np.random.Generator(np.random.PCG64(0x6B636572))  # fixed: the bound is reproducible
    total = {name: np.zeros(np.shape(v)) for name, v in expected.items()}
    for _ in range(PERTURBATION_DRAWS):
        moved = {}
        for name, value in inputs.items():
            if _is_float(kernel, name):
                signs = np.where(rng.random(np.shape(value)) < 0.5, -1.0, 1.0)
                moved[name] = value * (1.0 + PERTURBATION * signs)
            else:
                moved[name] = value
        answer = reference(moved)
        for name in total:
            with np.errstate(all="ignore"):
                delta = np.asarray(answer[name], dtype=np.float64) - np.asarray(expected[name])
            total[name] += np.where(np.isfinite(delta), delta, 0.0) ** 2
    # linear response: the change at size u_c is (u_c / PERTURBATION) times this one,
    # and the caller multiplies by u_c, so the spread is the change per unit perturbation
    return {name: np.sqrt(t / PERTURBATION_DRAWS) / PERTURBATION for name, t in total.items()}


def _longest_axis(inputs: Mapping[str, np.ndarray[Any, Any]]) -> int:
    return max((max(np.shape(v), default=1) for v in inputs.values()), default=1)


def _is_float(kernel: KernelSpec, name: str) -> bool:
    return any(b.name == name and b.dtype in FLOAT_DTYPES for b in kernel.buffers)


def _names(shape: tuple[Expr, ...]) -> set[str]:
    names: set[str] = set()
    for extent in shape:
        names |= set(extent.names())
    return names
