"""Sizes nobody listed: the dims fresh probes draw, and the shape scope a certificate covers.

The fixed probes take the spec's ``dims`` values only, so a kernel that is
wrong at a size the spec's author did not think of (``n % 4 == 2``, a prime,
anything past the largest listed value) would pass. Fresh probes therefore
draw their sizes from the certification's fresh seed, per dim:

1. one size past the largest listed value drawn log-uniformly over the whole
   stretch up to the dim's cap, so that every region of it is reachable across
   seeds (a kernel wrong only between the largest listed value and 7/8 of the
   cap is found), and, when at least three sizes are drawn, one more in the top
   eighth of the stretch (a prime where it holds one), so that the largest size
   probed comes near the cap; the certificate's scope records the sizes
   actually probed, never the cap as if it had been;
2. then sizes inside the listed range, drawn log-uniformly (small sizes are
   cheap and are where tails go wrong) and picked, among a few candidates,
   to cover the residues modulo 2, 3, 4, 5, 7 and 8 that neither the listed
   values nor earlier draws cover; the first of them is a prime.

The cap is ``probes.draw_up_to`` for the dim: an integer (at least the
largest listed value), or ``"listed"`` for a dim whose size must be one of
the listed values (a head dimension the kernel only supports at 64 and 128).
A dim not named there is capped at twice its largest listed value; a dim
with a single listed value is a fixed size and is not drawn. Dims draw their
large sizes in different probes, and a probe over ``probes.max_elements``
takes smaller listed values for its other dims, so the few fresh probes stay
affordable on the Triton interpreter. Where two or more dims are drawn, one
more fresh probe takes every drawn dim at its largest drawn size together
(scaled down, each no lower than its largest listed value, to fit under
``probes.max_elements``): a kernel wrong only once a buffer's element count
(``m * n``) passes what any listed combination reaches is found there, and the
certificate records the largest buffer probed (``largest_elements``).

Two more fresh probes sit on tile boundaries (:func:`tile_sizes`). A Triton
kernel splits a dim into tiles of a power of two (16 to 4096 elements), and a
wrong program-id mapping (tiles that overlap, or leave gaps between them) hides
wherever the last, partial tile masks the damage away: it shows only at an
exact multiple of the tile, with two tiles or more. Per drawn dim whose cap
holds two tiles of 16, ``T`` is the largest power of two up to 4096 of which
the cap holds two; the first tile probe takes a drawn multiple ``k * T``
(``k >= 2``), which is a multiple of every smaller power of two too, so one size
puts every likely block size at two tiles or more; the second takes another
drawn multiple one below or one above it (the sign drawn), where the last
tile is short by one lane or holds one. Every tiled dim of a probe sits on its
tile boundary at once; the others take their largest listed value, and the
probe is halved toward smaller multiples to fit ``probes.max_elements``. So
the fresh probes are at most ``probes.fresh + 3`` whatever the number of dims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcert.certify.errors import SpecError
from kcert.certify.probes import _name_word, _Stream
from kcert.certify.spec import KernelSpec

#: Residues modulo these are covered, with the listed values, as far as the draws allow.
MODULI = (2, 3, 4, 5, 7, 8)
#: A dim not named in ``probes.draw_up_to`` is drawn up to this multiple of its largest value.
DEFAULT_GROWTH = 2
#: Block sizes a kernel likely tiles a dim by: the tile probes put every one of them
#: that fits twice under the cap at two tiles or more.
TILE_SIZES = tuple(1 << e for e in range(4, 13))
_CANDIDATES = 48


def size_cap(kernel: KernelSpec, name: str) -> int | None:
    """The largest size fresh probes may give dim ``name``; None: only its listed values."""
    listed = kernel.dims[name]
    if name in kernel.probes.draw_up_to:
        return kernel.probes.draw_up_to[name]
    if len(set(listed)) == 1:
        return None
    return DEFAULT_GROWTH * max(listed)


def drawn_sizes(kernel: KernelSpec, fresh_seed: int, count: int) -> dict[str, tuple[int, ...]]:
    """Per dim, ``count`` sizes from ``fresh_seed`` (none for a dim probed at its listed values)."""
    sizes: dict[str, tuple[int, ...]] = {}
    for name, values in kernel.dims.items():
        cap = size_cap(kernel, name)
        if cap is None or count <= 0:
            sizes[name] = ()
            continue
        stream = _Stream([fresh_seed, _name_word(name), 0x73697A65])
        sizes[name] = tuple(_draw_dim(stream, sorted(set(values)), cap, count))
    return sizes


def _draw_dim(stream: _Stream, listed: list[int], cap: int, count: int) -> list[int]:
    lo, hi = listed[0], listed[-1]
    chosen: list[int] = []
    if cap > hi:
        chosen.append(_log_uniform_int(stream, hi + 1, cap))
        if count >= 3:
            bottom = max(hi + 1, cap - (cap - hi) // 8)
            top = _uniform_int(stream, bottom, cap)
            top = _prime_at_or_below(top, bottom) or top
            if top not in chosen:
                chosen.append(top)
    first = True
    while len(chosen) < count:
        covered = {(m, v % m) for v in (*listed, *chosen) for m in MODULI}
        best, best_gain = None, -1
        for _ in range(_CANDIDATES):
            candidate = _log_uniform_int(stream, max(lo, 2), max(hi, 2))
            if first:
                candidate = _prime_at_or_below(candidate, max(lo, 2)) or candidate
            gain = sum((m, candidate % m) not in covered for m in MODULI)
            if candidate not in chosen and gain > best_gain:
                best, best_gain = candidate, gain
        first = False
        if best is None:  # every size in range already taken: repeat one rather than loop
            best = chosen[-1] if chosen else lo
        chosen.append(best)
    return chosen[:count]


def fresh_dims(kernel: KernelSpec, fresh_seed: int, count: int) -> list[dict[str, int]]:
    """The dims of the fresh probes: ``count + 3`` at most.

    ``count`` with drawn sizes (large ones of different dims apart), then the joint
    probe and the two tile probes where they apply.
    """
    sizes = drawn_sizes(kernel, fresh_seed, count)
    stream = _Stream([fresh_seed, 0x6672657368])
    limit = kernel.probes.max_elements
    result: list[dict[str, int]] = []
    for i in range(count):
        dims: dict[str, int] = {}
        for j, (name, values) in enumerate(kernel.dims.items()):
            drawn = sizes[name]
            if drawn:
                # dim j's first (large) size lands in probe -j mod count
                dims[name] = drawn[(i + j) % len(drawn)]
            else:
                dims[name] = values[int(stream.integers(0, len(values) - 1, 1)[0])]
        fitted = _fit(kernel, dims, limit)
        if fitted is not None:
            result.append(fitted)
    joint = _joint(kernel, sizes, limit)
    if joint is not None and joint not in result:
        result.append(joint)
    if count > 0:
        for tiled in _tile_probes(kernel, tile_sizes(kernel, fresh_seed), limit):
            if tiled not in result:
                result.append(tiled)
    return result


@dataclass(frozen=True, slots=True)
class TileDraw:
    """One dim's tile boundaries: ``multiple`` and ``other`` are ``k * tile`` with ``k >= 2``."""

    tile: int
    #: The first tile probe's size.
    multiple: int
    #: The second tile probe's size is ``other + step``: one below or one above a boundary.
    other: int
    step: int


def tile_sizes(kernel: KernelSpec, fresh_seed: int) -> dict[str, TileDraw]:
    """Per dim with room under its cap for two tiles of 16, its tile boundaries from the seed."""
    result: dict[str, TileDraw] = {}
    for name in kernel.dims:
        cap = size_cap(kernel, name)
        fitting = [t for t in TILE_SIZES if cap is not None and 2 * t <= cap]
        if cap is None or not fitting:
            continue
        tile = fitting[-1]
        stream = _Stream([fresh_seed, _name_word(name), 0x74696C65])
        most = cap // tile
        multiple = tile * _uniform_int(stream, 2, most)
        other = tile * _uniform_int(stream, 2, most)
        step = 1 if float(stream.uniform(1)[0]) < 0.5 and other < cap else -1
        result[name] = TileDraw(tile, multiple, other, step)
    return result


def _tile_probes(kernel: KernelSpec, tiles: Mapping[str, TileDraw],
                 limit: int) -> list[dict[str, int]]:  # fmt: skip
    """The two tile probes (on the boundaries; next to them), each fitted under ``limit``."""
    if not tiles:
        return []
    probes = []
    for near in (False, True):
        bases = {name: draw.other if near else draw.multiple for name, draw in tiles.items()}
        steps = {name: draw.step if near else 0 for name, draw in tiles.items()}
        fitted = _fit_tiles(kernel, bases, steps, limit)
        if fitted is not None:
            probes.append(fitted)
    return probes


def _fit_tiles(kernel: KernelSpec, bases: dict[str, int], steps: Mapping[str, int],
               limit: int) -> dict[str, int] | None:  # fmt: skip
    """Tiled dims at ``base + step``, the others at their largest listed value, under ``limit``.

    Too large: the others go to their smallest listed value, then every base that
    stays a multiple of 16, two tiles of 16 or more, is halved (a boundary of half
    the tile, or of half as many tiles), until it fits or nothing can shrink.
    """
    others = {n: max(v) for n, v in kernel.dims.items() if n not in bases}
    bases = dict(bases)
    for attempt in range(40):
        dims = {n: bases[n] + steps[n] if n in bases else others[n] for n in kernel.dims}
        try:
            if kernel.bind(dims).elements() <= limit:
                return dims
        except SpecError:
            return None
        if attempt == 0 and others:
            others = {n: min(kernel.dims[n]) for n in others}
            continue
        smaller = {n: b // 2 for n, b in bases.items() if b % (4 * TILE_SIZES[0]) == 0}
        if not smaller:
            return None
        bases.update(smaller)
    return None


def _joint(kernel: KernelSpec, sizes: Mapping[str, tuple[int, ...]],
           limit: int) -> dict[str, int] | None:  # fmt: skip
    """Every drawn dim at its largest drawn size at once, scaled to fit ``limit``; or None."""
    drawn = [name for name, values in sizes.items() if values]
    if len(drawn) < 2:
        return None
    floor = {name: max(kernel.dims[name]) for name in drawn}
    dims = {name: (max(sizes[name]) if name in drawn else max(kernel.dims[name]))
            for name in kernel.dims}  # fmt: skip
    for _ in range(32):
        try:
            elements = kernel.bind(dims).elements()
        except SpecError:
            return None
        if elements <= limit:
            return dims
        ratio = (limit / elements) ** (1 / len(drawn)) * 0.98
        shrunk = {n: max(floor[n], int(dims[n] * ratio)) for n in drawn}
        if shrunk == {n: dims[n] for n in drawn}:
            return None  # at the listed maxima and still too large
        dims.update(shrunk)
    return None


def _fit(kernel: KernelSpec, dims: dict[str, int], limit: int) -> dict[str, int] | None:
    """``dims``, or dims with the others shrunk to their smallest listed value, under ``limit``."""
    order = sorted(kernel.dims, key=lambda n: -dims[n])
    current = dict(dims)
    for shrink in [None, *order[1:], order[0]]:
        if shrink is not None:
            current[shrink] = min(kernel.dims[shrink])
        try:
            if kernel.bind(current).elements() <= limit:
                return current
        except SpecError:
            return None
    return None


def shape_scope(kernel: KernelSpec, probed: Sequence[Mapping[str, int]]) -> dict[str, Any]:
    """Per dim: the listed values, the drawn ones probed, the cap, and the smallest and largest."""
    scope: dict[str, Any] = {}
    for name, values in kernel.dims.items():
        seen = sorted({int(d[name]) for d in probed if name in d})
        listed = sorted(set(values))
        cap = size_cap(kernel, name)
        scope[name] = {
            "listed": listed,
            "drawn": [v for v in seen if v not in listed],
            "min": seen[0] if seen else None,
            "max": seen[-1] if seen else None,
            "draw_up_to": "listed" if cap is None else cap,
        }
    return scope


def largest_elements(kernel: KernelSpec, probed: Sequence[Mapping[str, int]]) -> int | None:
    """The most elements any one buffer held in any of the ``probed`` dims."""
    largest = None
    for dims in probed:
        try:
            shapes = kernel.bind(dict(dims)).shapes.values()
        except SpecError:
            continue
        most = max((math.prod(shape) for shape in shapes), default=0)
        largest = most if largest is None else max(largest, most)
    return largest


# ---------------------------------------------------------------------------- numbers


def _uniform_int(stream: _Stream, lo: int, hi: int) -> int:
    return int(stream.integers(lo, hi, 1)[0])


def _log_uniform_int(stream: _Stream, lo: int, hi: int) -> int:
    if hi <= lo:
        return lo
    u = float(stream.uniform(1)[0])
    value = int(math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo))))
    return min(max(value, lo), hi)


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the bases that decide every n below 3.4e14 exactly."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17)
    if n in bases:
        return True
    if any(n % p == 0 for p in bases):
        return False
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _prime_at_or_below(n: int, floor: int) -> int | None:
    """The largest prime in ``[floor, n]``, looking at most a few hundred numbers down."""
    for value in range(n, max(floor, 2) - 1, -1):
        if n - value > 512:
            return None
        if _is_prime(value):
            return value
    return None
