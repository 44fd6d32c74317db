"""Default tolerances: how far a correct kernel's output may be from the reference.

Fixed ``atol``/``rtol`` pairs cannot serve every kernel: a sum of 10^5 float32
values, a K=4096 matmul on large inputs and an elementwise add differ by
orders of magnitude in the rounding error a *correct* float32 kernel commits.
So the default bound is computed per element from an estimate of the
operation's own rounding error at the kernel's precision, derived from the
reference itself. For every element ``i`` of a floating-point output::

    allowed[i] = atol + rtol·|ref[i]| + max(M[i], C·E[i])
    atol = tiny(out) + 4·u_c·median|ref|        rtol = 2·u_out + R·u_c
    M[i] = K·u_c·√L[i]·(|ref[i]| + S[i])        (the error model)

* ``E[i]`` is the yardstick of the best kernel test suites (FlashAttention's
  accept a kernel within about twice the error of the PyTorch implementation
  run in the kernel's precision): the error of the reference itself evaluated
  in float32 (:mod:`kcert.certify.lowp`), against its float64 answer, at the
  inputs and at three nearby points, taken as the worst among alike elements
  (same span of binades of ``|ref|`` and of ``|ref| + S``; see
  :func:`matched_errors`). ``C = 3``: FlashAttention's 2, and room for a
  kernel's elementary functions being 1-2 ulps where NumPy's are about half
  of one. It is what lets a correct float32 tanh-GELU, softplus or
  log-softmax through where their formulas cancel internally: the reference's
  formula cancels the same way in float32. It exists when the compute
  precision is float32 and the reference accepts float32 arrays.
* ``R`` is the floor for short computations: 2 (one ulp) with an ``E`` whose
  evaluation stayed float32 throughout, 8 otherwise (four ulps, for
  elementary functions a few ulps off); ``2·u_out`` is the
  final rounding and the comparison's own. ``atol`` excuses flushed subnormals
  (``tiny``) and is normwise beyond that: four ``u_c`` of the median magnitude
  of the output's nonzero elements, below which a formula that adds O(1) constants (``1 + exp(x)``)
  loses what it adds to.
* ``u_out`` is the unit roundoff of the output dtype; ``u_c`` that of the
  compute precision: float64 when any buffer is float64, else float32, since
  f16/bf16 kernels accumulate in float32 (a float16 accumulator is exactly the
  bug to catch). ``tiny`` is the smallest normal number of the output dtype.
* ``L`` is the accumulation length: the product of the dims that appear in
  some input buffer's shape but not in this output's (``k`` for a matmul,
  ``n`` for a row sum, 1 for elementwise kernels). Probabilistic rounding
  analysis (Higham & Mary, 2019) puts the error of a length-L accumulation at
  about ``√L·u`` times the size of its partial sums, whatever the order of
  summation; the worst case ``L·u`` needs adversarially correlated rounding.
  When the reference is not homogeneous (below) it may reduce internally
  along an axis the output keeps (softmax, layernorm), so ``L`` is then at
  least the longest axis of any input. A homogeneous one may too (a
  cumulative sum keeps the axis it sums along): ``L[i]`` is at least
  ``|f(1, 1, ...)[i]|``, the number of terms element ``i`` sums, capped at
  the longest axis.
* ``S[i]`` measures the size of the terms that cancel into ``ref[i]``:
  - when the reference is positively homogeneous (``f(2x) = 2^d f(x)`` for
    its float inputs, ``d >= 1``: sums, dot products, matmuls, convolutions,
    scalings, max), ``S = √|f(x∘x)|``, the 2-norm of the terms of a
    multilinear sum; where terms of opposite signs cancel in it along with
    the result (``a·cos − b·sin``), half the perturbation response below.
    The partial sums of a zero-mean sum stay of the order of ``‖terms‖₂``,
    those of a biased one of ``|ref|``; the bound covers both.
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
by 1e-3 is caught too (scale errors down to 5e-7 in an add, 4e-6 in a
K=256 matmul: tests/certify/test_tolerance_yardstick.py). Integer and
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
#: ``R`` with and without a precision-matched evaluation of the reference.
MATCHED_FLOOR = 2.0
FLOOR_FACTOR = 8.0
SAFETY = 2.0
#: ``C``: how many times the float32 reference's error a kernel may commit.
MATCHED_FACTOR = 3.0
#: Evaluations of the float32 reference: at the inputs and at inputs nearby.
MATCHED_SAMPLES = 4
#: Elements are alike when ``|ref|`` and ``|ref| + S`` fall in the same span of this many binades.
GROUP_BINADES = 2
NEARBY = 2.0**-6
#: The normwise floor: this many ``u_c`` of the output's median magnitude.
TYPICAL_FACTOR = 4.0
PERTURBATION = 2.0**-16
#: A homogeneous reference's ``S`` is at least this share of its perturbation response.
PERTURBED_SHARE = 0.5
PERTURBATION_DRAWS = 3

#: Runs the reference on float64 inputs by name and returns float64 outputs by name.
ReferenceCall = Callable[[Mapping[str, np.ndarray[Any, Any]]], Mapping[str, np.ndarray[Any, Any]]]
#: The same reference evaluated in float32 (:mod:`kcert.certify.lowp`), its answers widened
#: to float64, and whether they stayed float32 throughout (no plain float64 array on the way).
Float32Call = Callable[[Mapping[str, np.ndarray[Any, Any]]],
                       tuple[Mapping[str, np.ndarray[Any, Any]], bool]]  # fmt: skip


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
    # lazy: ml_dtypes is needed only for the narrow float dtypes
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
    *,
    float32: Float32Call | None = None,
) -> dict[str, Allowance]:
    """The bound of every output; ``expected`` is the reference's float64 answer on ``inputs``.

    ``float32`` evaluates the reference in float32; with it (and a float32 compute
    precision) the bound adds ``C·E`` and its floor drops to :data:`MATCHED_FLOOR`.
    """
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
    try:
        perturbed = _perturbation_response(kernel, reference, wide, expected)
    except KcertError:  # no response measured: the floor and |ref| terms remain
        perturbed = {name: np.zeros(np.shape(v)) for name, v in expected.items()}
    counts = _term_counts(kernel, reference, wide, scales) if scales else {}
    spreads: dict[str, np.ndarray[Any, Any]] = {}
    lengths: dict[str, np.ndarray[Any, Any]] = {}
    methods: dict[str, str] = {}
    for out in modelled:
        length: Any = accumulation_length(kernel, out, dims)
        spread = scales.get(out.name)
        method = "homogeneous"
        if spread is not None and out.name in counts:
            # a scan keeps the axis it accumulates along: count its terms per element
            length = np.maximum(length, counts[out.name])
        if spread is not None:
            # terms of opposite signs (a·cos - b·sin) cancel in f(x∘x) with the result;
            # the response to perturbing each input does not (it counts a product's
            # terms once per factor, hence the half)
            spread = np.maximum(spread, PERTURBED_SHARE * perturbed[out.name])
        else:
            spread, method = perturbed[out.name], "perturbation"
            # a nonlinear reference may reduce along any input axis inside (softmax, layernorm)
            length = max(length, _longest_axis(inputs))
        spreads[out.name], lengths[out.name], methods[out.name] = spread, length, method
    matched: dict[str, np.ndarray[Any, Any]] = {}
    throughout = False
    if float32 is not None and compute_dtype(kernel) == "f32":
        matched, throughout = matched_errors(kernel, reference, float32, wide, expected, spreads)
    for out in modelled:
        ref = np.abs(np.asarray(expected[out.name], dtype=np.float64))
        spread, length = spreads[out.name], lengths[out.name]
        error = matched.get(out.name)
        u_out = UNIT_ROUNDOFF[out.dtype]
        floor = MATCHED_FLOOR if error is not None and throughout else FLOOR_FACTOR
        rtol = 2 * u_out + floor * u_c
        atol = tiny(out.dtype) + TYPICAL_FACTOR * u_c * _typical(ref)
        with np.errstate(all="ignore"):
            model = SAFETY * u_c * np.sqrt(length) * (ref + spread)
            if error is not None:
                model = np.maximum(model, MATCHED_FACTOR * error)
            allowed = atol + rtol * ref + np.where(np.isfinite(model), model, 0.0)
        suffix = "" if error is None else "+float32" if throughout else "+float32-partial"
        method = methods[out.name] + suffix
        result[out.name] = Allowance(allowed, atol, rtol, method, int(np.max(length)))
    return result


def _typical(ref: np.ndarray[Any, Any]) -> float:
    """The median magnitude of an output's finite nonzero elements (0 when it has none).

    Nonzero: an output that is mostly padding or masked zeros still has a scale.
    """
    finite = ref[np.isfinite(ref) & (ref != 0)]
    return float(np.median(finite)) if finite.size else 0.0


def matched_errors(
    kernel: KernelSpec, reference: ReferenceCall, float32: Float32Call,
    inputs: Mapping[str, np.ndarray[Any, Any]], expected: Mapping[str, np.ndarray[Any, Any]],
    spreads: Mapping[str, np.ndarray[Any, Any]],
) -> tuple[dict[str, np.ndarray[Any, Any]], bool]:  # fmt: skip
    """``E``: the float32 reference's error, as the worst one among elements like each.

    Also whether the evaluation stayed float32 throughout: a reference that fills a
    float64 array (``np.zeros``) with float32 results is evaluated only in part, its
    ``E`` is a lower estimate, and the floor stays that of the model.

    The reference runs in float32 at the inputs and at inputs moved a little
    (:func:`_nearby`); each run's error against the float64 reference at the
    same inputs is one sample per element. One sample is a poor estimate of an
    element's error (a rounding may land exactly), so elements are grouped by the
    binade of ``|ref|`` and of ``|ref| + S``, i.e. by size and conditioning, and
    each gets the largest error of its group: a normwise bound within groups of
    alike elements. Empty when the reference refuses float32.
    """
    floats = [name for name in inputs if _is_float(kernel, name)]
    if not floats:
        return {}, False
    rng = np.random.Generator(np.random.PCG64(0x66333272))  # fixed: the bound is reproducible
    samples: list[tuple[Mapping[str, np.ndarray[Any, Any]], Mapping[str, np.ndarray[Any, Any]],
                        Mapping[str, np.ndarray[Any, Any]]]] = []  # fmt: skip
    throughout = True
    for k in range(MATCHED_SAMPLES):
        if k == 0:
            moved, truth = inputs, expected
        else:
            moved = {n: _nearby(v, rng) if n in floats else v for n, v in inputs.items()}
            try:
                truth = reference(moved)
            except KcertError:
                break
        try:
            low, stayed = float32(moved)
        except KcertError:
            return {}, False
        throughout = throughout and stayed
        samples.append((moved, truth, low))
    result: dict[str, np.ndarray[Any, Any]] = {}
    for name, spread in spreads.items():
        ref = np.abs(np.asarray(expected[name], dtype=np.float64))
        codes, errors = [], []
        for _, truth, low in samples:
            exact = np.asarray(truth[name], dtype=np.float64)
            with np.errstate(all="ignore"):
                error = np.abs(np.asarray(low[name], dtype=np.float64) - exact)
            errors.append(np.where(np.isfinite(error), error, 0.0).reshape(-1))
            codes.append(_group_code(np.abs(exact), spread).reshape(-1))
        mine = _group_code(ref, spread).reshape(-1)
        groups, inverse = np.unique(np.concatenate([mine, *codes]), return_inverse=True)
        worst = np.zeros(groups.size)
        np.maximum.at(worst, inverse[mine.size:], np.concatenate(errors))
        result[name] = worst[inverse[: mine.size]].reshape(ref.shape)
    return result, throughout


def _group_code(ref: np.ndarray[Any, Any], spread: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Per element, one integer for the spans of binades of ``|ref|`` and of ``|ref| + S``."""
    with np.errstate(all="ignore"):
        size = np.broadcast_to(np.abs(spread), ref.shape) + ref
        low = np.frexp(np.where(np.isfinite(ref), ref, 0.0))[1].astype(np.int64)
        high = np.frexp(np.where(np.isfinite(size), size, 0.0))[1].astype(np.int64)
    low = np.where(ref == 0, -8192, low // GROUP_BINADES)  # zero apart from the subnormals
    high = high // GROUP_BINADES
    code: np.ndarray[Any, Any] = (low + 8192) * 16384 + (high + 8192)
    return code


def _nearby(value: np.ndarray[Any, Any], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """``value`` moved by a random relative amount up to :data:`NEARBY`, rounded to float32.

    Thousands of float32 ulps: far enough that every rounding inside the reference
    lands differently, near enough that the element stays alike (same binades).
    """
    shift = 1.0 + NEARBY * (2.0 * rng.random(np.shape(value)) - 1.0)
    with np.errstate(all="ignore"):
        moved = np.asarray(np.asarray(value, dtype=np.float64) * shift, dtype=np.float32)
    keep = ~np.isfinite(moved)
    return np.where(keep, value, moved.astype(np.float64))


def _term_counts(
    kernel: KernelSpec, reference: ReferenceCall, inputs: Mapping[str, np.ndarray[Any, Any]],
    scales: Mapping[str, np.ndarray[Any, Any]],
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    """How many terms each element of a homogeneous output sums: ``|f(1, 1, ...)|``.

    A cumulative sum keeps the axis it accumulates along, so the dims alone say 1;
    on all-ones inputs its ``i``-th element is ``i + 1``. Capped at the longest input
    axis, the length a non-homogeneous reference is credited with anyway.
    """
    ones = {n: np.ones(np.shape(v)) if _is_float(kernel, n) else v for n, v in inputs.items()}
    try:
        answer = reference(ones)
    except KcertError:
        return {}
    cap = _longest_axis(inputs)
    counts = {}
    for name in scales:
        with np.errstate(all="ignore"):
            count = np.abs(np.asarray(answer[name], dtype=np.float64))
        counts[name] = np.clip(np.where(np.isfinite(count), np.rint(count), 1.0), 1, cap)
    return counts


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
