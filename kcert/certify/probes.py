"""Probes: which shapes a kernel is run on, and the inputs it is given there.

The probe set is a pure function of the spec's ``dims``:

1. the all-smallest and the all-largest assignment (edge values together);
2. covering rows, so that every value of every dim appears in some probe
   (dims are walked in alternating directions, so a large value of one dim
   meets small values of the next rather than always the large ones);
3. the remaining corners (every mix of each dim's min and max).

Probes over ``probes.max_elements`` are dropped (a covering row first retries
with the other dims at their minimum), and the set is capped at
``probes.max_probes``; values left uncovered either way are recorded.

Inputs come from a seed derived from the spec digest and the probe id, drawn
with PCG64 raw bits and our own transforms (NumPy's distribution methods may
change between releases; the raw bit stream may not), so an input anchor can
be reproduced anywhere. Each element is drawn from one of several families,
all inside the buffer's ``[kernel.values]`` domain: the bulk distribution,
large magnitudes, tiny magnitudes and signed zeros.

Fresh probes use a seed drawn at certification time (``secrets``), recorded
in the report; they draw sizes the spec never listed (:mod:`kcert.certify.sizes`)
and new inputs, so a kernel tuned to the fixed probes' sizes or inputs is caught.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kcert.certify.executors.base import host_dtype
from kcert.certify.spec import FLOAT_DTYPES, BufferArg, Intent, KernelSpec, Launch, ValueDomain
from kcert.certify.tolerance import float_info

#: Largest and smallest magnitudes of the "large" and "tiny" families under
#: ``auto``, as powers of two. Large values stay far enough below each dtype's
#: maximum that products and long sums of them remain finite (f16: 2**6, so a
#: product is 4096 and a sum of a few of those still fits in 65504).
_AUTO_LARGE_EXP = {"f16": 6, "bf16": 12, "f32": 12, "f64": 20}
_AUTO_TINY_EXP = {"f16": -10, "bf16": -20, "f32": -20, "f64": -40}
#: Probability of each family for one float element: bulk, large, tiny, zero, then
#: (:func:`_spread_families`) every binade between the domain's ends, integer values and
#: the domain's edges.
_FAMILY_WEIGHTS = (0.50, 0.10, 0.10, 0.05, 0.13, 0.08, 0.04)
_BINADES, _INTEGERS, _EDGES = 4, 5, 6
#: Rows (the innermost axis) whose real values all share one sign: negative, positive.
_ROW_SIGN_WEIGHTS = (0.30, 0.15)
#: Share of elements that are non-finite, in buffers whose spec opts in (``nonfinite``).
_NONFINITE_RATE = 0.05
#: Non-finite values go to this share of the rows (the innermost axis; blocks of
#: ``_NONFINITE_BLOCK`` elements in a 1-D buffer), so that most rows stay finite and a
#: reduction's finite answers are still compared: at 5% per element everywhere, every
#: row longer than about a hundred would hold one and its reference be NaN or Inf.
_NONFINITE_ROWS = 0.25
_NONFINITE_BLOCK = 64
NONFINITE_KINDS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True, slots=True)
class Probe:
    """One assignment of dims, with its launch bound and the seed of its inputs."""

    id: str
    kind: str  # "fixed" or "fresh"
    seed: int
    dims: Mapping[str, int]
    launch: Launch

    @property
    def elements(self) -> int:
        return self.launch.elements()


@dataclass(frozen=True, slots=True)
class ProbeSet:
    probes: tuple[Probe, ...]
    #: Dim values no probe takes, because of the caps (dim -> values).
    uncovered: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def probe_id(kernel: KernelSpec, dims: Mapping[str, int]) -> str:
    """``"m=33,n=1"``: dims in the spec's order."""
    return ",".join(f"{name}={dims[name]}" for name in kernel.dims)


#: Seeds are below 2**53 so that canonical JSON (RFC 8785) carries them exactly.
SEED_BITS = 53


def derive_seed(*parts: object) -> int:
    """A seed from any textual parts (a hash, so it cannot be steered)."""
    text = "\0".join(str(p) for p in ("kcert-seed-v1", *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> (64 - SEED_BITS)


def draw_seed() -> int:
    """A seed nobody could have tuned a kernel to: drawn now, recorded in the report."""
    return secrets.randbits(SEED_BITS)


def make_probe(kernel: KernelSpec, dims: Mapping[str, int], *, kind: str = "fixed",
               seed: int | None = None, prefix: str = "") -> Probe:  # fmt: skip
    """Bind ``dims`` to a probe; the seed defaults to one derived from spec digest and id."""
    ordered = {name: int(dims[name]) for name in kernel.dims}
    pid = prefix + probe_id(kernel, ordered)
    if seed is None:
        seed = derive_seed(kernel.digest.hex, pid)
    return Probe(pid, kind, seed, ordered, kernel.bind(ordered))


def fixed_probes(kernel: KernelSpec, *, max_probes: int | None = None) -> ProbeSet:
    """The deterministic probe set of ``kernel`` (see the module docstring)."""
    cap = max_probes if max_probes is not None else kernel.probes.max_probes
    limit = kernel.probes.max_elements
    values = {name: sorted(v) for name, v in kernel.dims.items()}
    names = list(values)
    lows = {n: values[n][0] for n in names}
    highs = {n: values[n][-1] for n in names}

    chosen: list[Probe] = []
    seen: set[str] = set()

    def add(dims: Mapping[str, int]) -> bool:
        if len(chosen) >= cap:
            return False
        probe = make_probe(kernel, dims)
        if probe.id in seen:
            return True
        if probe.elements > limit:
            return False
        seen.add(probe.id)
        chosen.append(probe)
        return True

    add(lows)
    add(highs)
    rows = max(len(v) for v in values.values())
    for i in range(rows):
        row = {}
        for j, name in enumerate(names):
            vals = values[name]
            row[name] = vals[i % len(vals)] if j % 2 == 0 else vals[-1 - i % len(vals)]
        if not add(row) and len(chosen) < cap:
            # too large: keep the value this row is there to cover, shrink the rest
            for name in names:
                if i < len(values[name]):
                    add({**lows, name: row[name]})
    for corner in itertools.product(*[(values[n][0], values[n][-1]) for n in names]):
        add(dict(zip(names, corner, strict=True)))

    if not chosen:
        raise kernel.error("probes.max_elements", f"every probe has more than {limit} elements "
                           "in its buffers; raise the limit or list smaller dims")  # fmt: skip
    covered = {n: {p.dims[n] for p in chosen} for n in names}
    uncovered = {n: tuple(v for v in values[n] if v not in covered[n]) for n in names}
    return ProbeSet(tuple(chosen), {n: v for n, v in uncovered.items() if v})


def fresh_probes(kernel: KernelSpec, fresh_seed: int,
                 count: int | None = None) -> tuple[Probe, ...]:  # fmt: skip
    """``count`` probes whose dims (:mod:`kcert.certify.sizes`) and inputs come from the seed."""
    # lazy: kcert.certify.sizes imports this module back (a cycle inside the package)
    from kcert.certify.sizes import fresh_dims  # it draws with this module's streams

    count = kernel.probes.fresh if count is None else count
    probes: list[Probe] = []
    for dims in fresh_dims(kernel, fresh_seed, count):
        index = len(probes)
        probes.append(make_probe(kernel, dims, kind="fresh", prefix=f"fresh{index}:",
                                 seed=derive_seed(fresh_seed, index)))  # fmt: skip
    return tuple(probes)


# ---------------------------------------------------------------------------- inputs


def make_inputs(kernel: KernelSpec, probe: Probe) -> dict[str, np.ndarray[Any, Any]]:
    """The initial contents of every ``in`` and ``inout`` buffer of ``probe``."""
    inputs = {}
    for buf in kernel.buffers:
        if buf.intent is Intent.OUT:
            continue
        shape = probe.launch.shapes[buf.name]
        # a domain over the dims (``uniform(-1, n)``) comes evaluated with the launch
        domain = probe.launch.domains.get(buf.name) or kernel.values.get(buf.name,
                                                                         ValueDomain("auto"))
        stream = _Stream([probe.seed, _name_word(buf.name)])
        special = tuple(kernel.nonfinite.get(buf.name, ()))
        inputs[buf.name] = draw_values(stream, buf, domain, shape, special)
    return inputs


def draw_values(stream: _Stream, buf: BufferArg, domain: ValueDomain, shape: tuple[int, ...],
                nonfinite: tuple[str, ...] = ()) -> np.ndarray[Any, Any]:  # fmt: skip
    """Values for one buffer, drawn from ``domain`` with the value families mixed in.

    ``nonfinite`` names the non-finite values (``nan``, ``inf``, ``-inf``) the spec
    lets this buffer hold.
    """
    count = math.prod(shape)
    dtype = host_dtype(buf.dtype)
    if buf.dtype == "bool":
        return (stream.uniform(count) < 0.5).reshape(shape)
    if buf.dtype in FLOAT_DTYPES:
        values = _float_values(stream, buf.dtype, domain, count)
        limit = float(float_info(buf.dtype).max) / 4
        values = np.clip(values, -limit, limit)
        values = _sign_rows(stream, buf.dtype, domain, values, shape)
        if nonfinite:
            values = _nonfinite(stream, values, nonfinite, shape)
        result: np.ndarray[Any, Any] = values.astype(dtype).reshape(shape)
        return result
    return _int_values(stream, dtype, domain, count).reshape(shape)


def _float_values(stream: _Stream, dtype: str, domain: ValueDomain, n: int) -> np.ndarray[Any, Any]:
    family = np.searchsorted(np.cumsum(_FAMILY_WEIGHTS), stream.uniform(n), side="right")
    sign = np.where(stream.uniform(n) < 0.5, -1.0, 1.0)
    spread = stream.uniform(n)  # position inside a family's range
    if domain.kind == "uniform":
        lo, hi = domain.a, domain.b
        values = lo + (hi - lo) * stream.uniform(n)
        # large: the last 2% towards either end of the interval
        step = (hi - lo) * 0.02 * spread
        near_end = np.where(sign > 0, hi - step, lo + step)
        values = np.where(family == 1, near_end, values)
        if lo < 0 < hi:
            scale = min(hi, -lo)
            values = np.where(family == 2, sign * scale * np.exp2(-20 + 10 * spread), values)
        if lo <= 0 <= hi:
            values = np.where(family == 3, sign * 0.0, values)
        values = _spread_families(stream, dtype, domain, family, sign, values)
        return np.clip(values, lo, hi)
    if domain.kind == "normal":
        mu, sigma = domain.a, domain.b
        values = mu + sigma * stream.normal(n)
        values = np.where(family == 1, mu + sign * sigma * (3 + 2 * spread), values)
        if abs(mu) <= 3 * sigma:
            values = np.where(family == 2, sign * sigma * np.exp2(-20 + 10 * spread), values)
            values = np.where(family == 3, sign * 0.0, values)
        return _spread_families(stream, dtype, domain, family, sign, values)
    large, tiny = _AUTO_LARGE_EXP[dtype], _AUTO_TINY_EXP[dtype]
    values = stream.normal(n)
    values = np.where(family == 1, sign * np.exp2(large - 4 + 4 * spread), values)
    values = np.where(family == 2, sign * np.exp2(tiny + 4 * spread), values)
    values = np.where(family == 3, sign * 0.0, values)
    return _spread_families(stream, dtype, domain, family, sign, values)


def domain_ends(dtype: str, domain: ValueDomain) -> tuple[float, float, float, bool]:
    """``(centre, tiny, large, both_signs)``: values are ``centre ± m``, ``tiny <= m <= large``."""
    if domain.kind == "uniform":
        lo, hi = domain.a, domain.b
        if lo < 0 < hi:
            return 0.0, min(hi, -lo) * 2.0**-20, max(hi, -lo), True
        top = max(abs(lo), abs(hi))
        bottom = min(abs(lo), abs(hi)) or top * 2.0**-20
        return 0.0, bottom, top, False
    if domain.kind == "normal":
        return domain.a, domain.b * 2.0**-20, domain.b * 5, True
    return 0.0, 2.0 ** _AUTO_TINY_EXP[dtype], 2.0 ** _AUTO_LARGE_EXP[dtype], True


def _spread_families(stream: _Stream, dtype: str, domain: ValueDomain, family: Any, sign: Any,
                     values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """The binade, integer and edge families, inside the domain.

    Binades: magnitudes ``2**e`` for every ``e`` between the domain's tiny and large
    ends, taken in turn, so a buffer with as many such elements as binades has one
    in each. Integers: integer-valued floats, small ones and powers of two up to the
    large end. Edges: the ends themselves (``lo`` and ``hi`` of a uniform domain).
    """
    n = values.size
    centre, tiny, large, both = domain_ends(dtype, domain)
    if not large > 0:
        return values
    if domain.kind == "uniform" and not domain.a < 0 < domain.b:
        sign = np.full(n, 1.0 if domain.b > 0 else -1.0)
    low_e, high_e = math.log2(tiny), math.log2(large)
    count = max(1, math.ceil(high_e - low_e))
    chosen = family == _BINADES
    turn = np.cumsum(chosen) - 1  # the k-th binade element takes binade k mod count
    exponent = np.minimum(low_e + turn % count + stream.uniform(n), high_e)
    values = np.where(chosen, centre + sign * np.exp2(exponent), values)
    small = np.rint(4 * stream.normal(n))
    powers = np.rint(np.exp2(stream.uniform(n) * max(high_e, 0.0)))
    integers = np.where(stream.uniform(n) < 0.5, small, sign * powers)
    integers = np.rint(centre) + integers
    if domain.kind == "uniform":
        inside = (integers >= domain.a) & (integers <= domain.b)
    else:
        inside = np.abs(integers - centre) <= large
    values = np.where((family == _INTEGERS) & inside, integers, values)
    if domain.kind == "uniform":
        edges = np.where(stream.uniform(n) < 0.5, domain.a, domain.b)
    else:
        edges = centre + sign * np.where(stream.uniform(n) < 0.5, large, tiny)
    return np.where(family == _EDGES, edges, values)


def _sign_rows(stream: _Stream, dtype: str, domain: ValueDomain, values: np.ndarray[Any, Any],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:  # fmt: skip
    """Some rows (innermost axis of a buffer of two axes or more) all negative, some positive.

    Signs drawn per element almost never leave a row of one sign, which is where a
    wrong fill value shows (``other=0`` in a row max of negative values). Only in a
    domain centred on zero, or a uniform one across it; zeros in such a row become
    the domain's tiny end, so that every value of the row has the row's sign.
    """
    centre, tiny, _, both = domain_ends(dtype, domain)
    if not both or centre != 0 or values.size == 0 or len(shape) < 2:
        return values
    width = shape[-1] if shape else 1
    rows = values.reshape(-1, width)
    pick = stream.uniform(rows.shape[0])[:, None]
    negative = pick < _ROW_SIGN_WEIGHTS[0]
    positive = (pick >= _ROW_SIGN_WEIGHTS[0]) & (pick < sum(_ROW_SIGN_WEIGHTS))
    if domain.kind == "uniform":
        lo, hi = domain.a, domain.b
        down = np.where(rows > 0, rows * (lo / hi), rows)
        up = np.where(rows < 0, rows * (hi / lo), rows)
    else:
        down, up = -np.abs(rows), np.abs(rows)
    down = np.where(down == 0, -tiny, down)
    up = np.where(up == 0, tiny, up)
    result: np.ndarray[Any, Any] = np.where(negative, down, np.where(positive, up, rows))
    return result.reshape(values.shape)


def _nonfinite(stream: _Stream, values: np.ndarray[Any, Any], kinds: tuple[str, ...],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:  # fmt: skip
    """A share of the elements, in a minority of rows, replaced by the spec's non-finite values."""
    n = values.size
    width = shape[-1] if len(shape) > 1 else _NONFINITE_BLOCK
    rows = -(-n // max(width, 1))
    hosts = np.repeat(stream.uniform(rows) < _NONFINITE_ROWS, max(width, 1))[:n]
    chosen = hosts & (stream.uniform(n) < _NONFINITE_RATE / _NONFINITE_ROWS)
    which = np.minimum((stream.uniform(n) * len(kinds)).astype(np.int64), len(kinds) - 1)
    table = np.array([NONFINITE_KINDS[k] for k in kinds])
    result: np.ndarray[Any, Any] = np.where(chosen, table[which], values)
    return result


def value_families(kernel: KernelSpec) -> dict[str, list[str]]:
    """The value families each input buffer's probes draw from (recorded in the certificate)."""
    families: dict[str, list[str]] = {}
    for buf in kernel.buffers:
        if buf.intent is Intent.OUT:
            continue
        domain = kernel.values.get(buf.name, ValueDomain("auto"))
        if buf.dtype == "bool":
            names = ["bernoulli"]
        elif buf.dtype not in FLOAT_DTYPES:
            names = ["range"] if domain.kind != "auto" else ["small", "large", "zero"]
        else:
            names = ["bulk", "large"]
            if domain.kind == "uniform":
                tiny, zero = domain.a < 0 < domain.b, domain.a <= 0 <= domain.b
            else:  # as _float_values draws them
                tiny = zero = domain.kind == "auto" or abs(domain.a) <= 3 * domain.b
            names += ["tiny"] * tiny + ["zero"] * zero
            names += ["binades", "integers", "edges"]
            centre, _, _, both = domain_ends(buf.dtype, domain)
            if both and centre == 0 and len(buf.shape) >= 2:
                names.append("sign-rows")
            names += list(kernel.nonfinite.get(buf.name, ()))
        families[buf.name] = names
    return families


def _int_values(stream: _Stream, dtype: np.dtype[Any], domain: ValueDomain,
                n: int) -> np.ndarray[Any, Any]:  # fmt: skip
    info = np.iinfo(dtype)
    if domain.kind == "uniform":
        # the raw-bit transform needs a span that fits 64 bits
        lo = max(math.ceil(domain.a), int(info.min), -(1 << 52))
        hi = max(min(math.ceil(domain.b) - 1, int(info.max), 1 << 52), lo)
        return stream.integers(lo, hi, n).astype(dtype)
    if domain.kind == "normal":
        values = np.rint(domain.a + domain.b * stream.normal(n))
        return np.clip(values, info.min, info.max).astype(dtype)
    # auto: small integers, some large ones (a quarter of the type's range) and zeros
    small = 64 if info.min < 0 else 128
    lo = -small if info.min < 0 else 0
    values = stream.integers(lo, small, n)
    big = min(info.max // 4, 1 << 20)
    family = stream.uniform(n)
    large = stream.integers(big // 2, big, n) * (np.where(stream.uniform(n) < 0.5, -1, 1)
                                                 if info.min < 0 else 1)  # fmt: skip
    values = np.where(family < 0.1, large, values)
    values = np.where(family > 0.95, 0, values)
    return values.astype(dtype)


def _name_word(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


class _Stream:
    """Version-stable random numbers: PCG64 raw bits with our own transforms."""

    def __init__(self, words: list[int]) -> None:
        self._bits = np.random.PCG64(np.random.SeedSequence(words))

    def raw(self, n: int) -> np.ndarray[Any, Any]:
        return np.asarray(self._bits.random_raw(n), dtype=np.uint64)

    def uniform(self, n: int) -> np.ndarray[Any, Any]:
        """Doubles in [0, 1) from the top 53 bits."""
        return (self.raw(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def normal(self, n: int) -> np.ndarray[Any, Any]:
        """Standard normals by Box-Muller (one per pair of uniforms)."""
        u1 = 1.0 - self.uniform(n)  # (0, 1]: the log stays finite
        u2 = self.uniform(n)
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def integers(self, lo: int, hi: int, n: int) -> np.ndarray[Any, Any]:
        """Integers in [lo, hi], both ends included."""
        span = hi - lo + 1
        return (self.raw(n) % np.uint64(span)).astype(np.int64) + lo
