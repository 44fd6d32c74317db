"""What a certification did not cover: notes for the report, never a verdict.

A pass vouches for the probes that ran. Two things can leave an obvious hazard
unexercised, and the report says so rather than let a pass imply more:

- the spec's value domains: a kernel that calls ``exp`` whose inputs never
  come near exp's overflow (a softmax without max subtraction passes), or one
  that takes a square root of a spread (a normalization) whose inputs are
  never offset by a large mean (a one-pass ``E[x²] − E[x]²`` variance passes);
- the executor: the Triton interpreter runs one program at a time in float32
  on the CPU, so races between programs and TF32 rounding cannot show there.

What a kernel computes is read from its source as text (the calls it makes,
comments and strings left out): a heuristic, so each note says what it saw.
"""

from __future__ import annotations

import io
import math
import re
import tokenize

from kcert.certify.errors import SpecError
from kcert.certify.probes import domain_ends
from kcert.certify.report import ScopeNote
from kcert.certify.spec import FLOAT_DTYPES, Intent, KernelSpec, ValueDomain

#: Where exp overflows, by the precision the kernel most likely computes in (f16 and
#: bf16 inputs are usually widened to float32 before exp).
EXP_OVERFLOW = {"f16": 88.72, "bf16": 88.72, "f32": 88.72, "f64": 709.78}
#: A mean this many spreads away from 0 makes a one-pass variance lose about
#: log10(ratio²) digits: at 10 about two of float32's seven.
LARGE_MEAN_RATIO = 10.0
#: Magnitude ``auto`` reaches (its "large" family), as a power of two: probes.py's figures.
_AUTO_LARGE_EXP = {"f16": 6, "bf16": 12, "f32": 12, "f64": 20}

_EXP_CALL = re.compile(r"\b(?:exp|expf|exp2|exp2f|__expf|expm1|expm1f)\s*\(")
_SQRT_CALL = re.compile(r"\b(?:sqrt|sqrtf|rsqrt|rsqrtf|__fsqrt_rn|__frsqrt_rn)\s*\(")
_DOT_CALL = re.compile(r"\bdot\s*\(")
_ATOMIC_CALL = re.compile(r"\batomic_\w+\s*\(")


def scope_notes(kernel: KernelSpec, executor: str) -> tuple[ScopeNote, ...]:
    """The notes for ``kernel`` certified on ``executor`` (empty when nothing is known missing)."""
    code = _code_text(kernel)
    notes = list(_value_notes(kernel, code))
    if executor == "triton-interpreter":
        notes.extend(_interpreter_notes(code))
    return tuple(notes)


# ---------------------------------------------------------------------------- values


def _value_notes(kernel: KernelSpec, code: str) -> list[ScopeNote]:
    inputs = [b for b in kernel.buffers if b.intent is not Intent.OUT and b.dtype in FLOAT_DTYPES]
    if not inputs:
        return []
    notes: list[ScopeNote] = []
    domains = {b.name: _domain(kernel, b.name) for b in inputs}
    if _EXP_CALL.search(code):
        low = {b.name: reach for b in inputs
               if (reach := _reach(domains[b.name], b.dtype)) < EXP_OVERFLOW[b.dtype]}  # fmt: skip
        if len(low) == len(inputs):
            limit = min(EXP_OVERFLOW[b.dtype] for b in inputs)
            said = ", ".join(f"{n} reaches |x| <= {r:.3g} ({domains[n].spec_text()})"
                             for n, r in low.items())  # fmt: skip
            notes.append(ScopeNote("values", (
                f"the source calls exp, but no input comes near its overflow at {limit:g}: "
                f"{said}; an exp of unshifted inputs (a softmax without max subtraction) "
                "passes these probes; widen [kernel.values] (e.g. \"auto\") to exercise it")))
    if _SQRT_CALL.search(code):
        centred = [b.name for b in inputs if _centred(domains[b.name])]
        if len(centred) == len(inputs):
            said = ", ".join(f"{n} ({domains[n].spec_text()})" for n in centred)
            notes.append(ScopeNote("values", (
                f"the source takes a square root, as a normalization does, but every input is "
                f"centred near 0 (mean within {LARGE_MEAN_RATIO:g} spreads): {said}; a variance "
                "computed as E[x²] − E[x]², which cancels when the mean is large beside the "
                "spread, passes these probes; a domain like \"normal(1000, 1)\" exercises it")))
    return notes


def _domain(kernel: KernelSpec, name: str) -> ValueDomain:
    domain = kernel.values.get(name, ValueDomain("auto"))
    if domain.bounds is None:
        return domain
    # bounds over the dims: judged where the dims are largest
    largest = {dim: max(values) for dim, values in kernel.dims.items()}
    try:
        return kernel.bind(largest).domains.get(name, domain)
    except SpecError:
        return ValueDomain("auto")


def _reach(domain: ValueDomain, dtype: str) -> float:
    """The largest magnitude the probes draw from ``domain`` (probes.py's families)."""
    if domain.kind == "uniform":
        return max(abs(domain.a), abs(domain.b))
    if domain.kind == "normal":
        return abs(domain.a) + 5.0 * domain.b  # the "large" family reaches mu ± 5 sigma
    return float(2 ** _AUTO_LARGE_EXP[dtype])


def _centred(domain: ValueDomain) -> bool:
    if domain.kind == "uniform":
        mean, spread = (domain.a + domain.b) / 2, (domain.b - domain.a) / math.sqrt(12)
    elif domain.kind == "normal":
        mean, spread = domain.a, domain.b
    else:
        return True  # auto: symmetric around 0
    return abs(mean) <= LARGE_MEAN_RATIO * spread


def domain_note(kernel: KernelSpec) -> tuple[ScopeNote, ...]:
    """A note stating the magnitudes each float input was drawn over: what a pass covers.

    A kernel wrong only outside them (``1/x`` for ``|x| < 2**-21``) passes; the
    certificate says so rather than let a pass read as "for every float".
    """

    parts = []
    for buf in kernel.buffers:
        if buf.intent is Intent.OUT or buf.dtype not in FLOAT_DTYPES:
            continue
        domain = _domain(kernel, buf.name)
        centre, tiny, large, both = domain_ends(buf.dtype, domain)
        around = f"{centre:g} " if centre else ""
        sign = "±" if both else ("-" if domain.kind == "uniform" and domain.b <= 0 else "+")
        zero = both or (domain.kind == "uniform" and 0.0 in (domain.a, domain.b))
        parts.append(f"{buf.name} ({domain.spec_text()}): {around}{sign}[{_power(tiny)}, "
                     f"{_power(large)}]{' and 0' if zero else ''}")  # fmt: skip
    if not parts:
        return ()
    return (ScopeNote("values", (
        "inputs were drawn only with magnitudes between these ends: " + "; ".join(parts)
        + "; behaviour outside them (a reciprocal of a tinier value, a square of a larger "
        "one) was not probed; widen [kernel.values] to vouch for more")),)


def _power(value: float) -> str:
    """``2^k (v)`` for a power of two, else ``v``."""
    exponent = math.log2(value) if value > 0 else 0.0
    if value > 0 and exponent == int(exponent):
        return f"2^{int(exponent)} ({value:.4g})"
    return f"{value:.4g}"


# ---------------------------------------------------------------------------- executor


def _interpreter_notes(code: str) -> list[ScopeNote]:
    notes = [ScopeNote("executor", (
        "probed on the Triton interpreter only: it runs one program at a time on the CPU, so "
        "races between programs (a shared output written without atomics, a missing barrier) "
        "cannot show; certify with --executor triton on a GPU to see them"))]
    if _DOT_CALL.search(code):
        notes.append(ScopeNote("executor", (
            "the source calls dot: the interpreter computes it in full float32, while a GPU "
            "rounds its inputs to TF32 (10-bit mantissa) by default; that error was not "
            "measured here")))
    if _ATOMIC_CALL.search(code):
        notes.append(ScopeNote("executor", (
            "the source uses atomics: their order, and the rounding differences it causes, "
            "never varies under the interpreter")))
    return notes


def _code_text(kernel: KernelSpec) -> str:
    """The kernel's source without comments and strings (a docstring may name any function)."""
    text = kernel.code.main.data.decode("utf-8", errors="replace")
    if kernel.language == "cuda":
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        return re.sub(r"//[^\n]*", " ", text)
    kept: list[str] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type not in (tokenize.COMMENT, tokenize.STRING):
                kept.append(token.string)
    except (tokenize.TokenError, SyntaxError):
        return text
    return " ".join(kept)
