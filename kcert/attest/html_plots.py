"""Inline SVG pictures of a recorded error profile, for the HTML report.

A profile (``kcert.certify.report.ErrorProfile``, JSON in the certificate) holds
one level per bin of the largest error relative to its allowed bound. A vector
is drawn as bars over the flattened index on a log scale with the bound marked;
a matrix as a heat map. Both share one colour scale: blues up to the bound,
oranges to dark red past it, black for NaN, Inf or elements never written.
Everything here is built from numbers the certificate holds, but labels are
escaped anyway: the caller's output name and probe id are attacker-influenced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from kcert.certify.report import (
    PROFILE_ALPHABET,
    PROFILE_BOUND_LEVEL,
    PROFILE_NONFINITE_LEVEL,
    PROFILE_STEPS_PER_DECADE,
)

EXACT_COLOUR = "#c9ced4"
NONFINITE_COLOUR = "#111111"
_PASS_STOPS = ((0.0, (222, 235, 247)), (0.5, (107, 174, 214)), (1.0, (8, 48, 107)))
_FAIL_STOPS = ((0.0, (253, 174, 97)), (0.5, (244, 109, 67)), (1.0, (165, 0, 38)))
#: Ratios at or below 10**_PALE_DECADE get the palest blue: finer shades would hide the
#: differences near the bound, which are the ones that matter.
_PALE_DECADE = -8.0


class ProfileError(ValueError):
    """A recorded profile that does not add up (the schema checks its parts, not its sums)."""


def decode(profile: Mapping[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """``(extent, bins, levels)`` of a profile's JSON, checked to be consistent."""
    extent = [int(v) for v in profile["extent"]]
    bins = [int(v) for v in profile["shape"]]
    text = str(profile["levels"])
    if len(extent) != len(bins) or len(text) != math.prod(bins):
        raise ProfileError(f"profile of {len(text)} levels does not fill {bins} bins")
    if any(b > max(e, 1) for e, b in zip(extent, bins, strict=True)):
        raise ProfileError(f"profile has more bins {bins} than elements {extent}")
    try:
        levels = [PROFILE_ALPHABET.index(ch) for ch in text]
    except ValueError:
        raise ProfileError("profile levels hold a character outside the alphabet") from None
    return extent, bins, levels


def decade(level: int) -> float:
    """log10 of the largest ratio a finite level (1..62) stands for."""
    return (level - PROFILE_BOUND_LEVEL) / PROFILE_STEPS_PER_DECADE


def colour(level: int) -> str:
    if level == 0:
        return EXACT_COLOUR
    if level >= PROFILE_NONFINITE_LEVEL:
        return NONFINITE_COLOUR
    if level > PROFILE_BOUND_LEVEL:
        span = PROFILE_NONFINITE_LEVEL - 1 - PROFILE_BOUND_LEVEL - 1
        return _mix(_FAIL_STOPS, (level - PROFILE_BOUND_LEVEL - 1) / span)
    return _mix(_PASS_STOPS, min(1.0, max(0.0, (decade(level) - _PALE_DECADE) / -_PALE_DECADE)))


def describe(level: int) -> str:
    """What a level says, in words (tooltips and the legend)."""
    if level == 0:
        return "exact (no error)"
    if level >= PROFILE_NONFINITE_LEVEL:
        return "FAIL: NaN, Inf or never written"
    word = "FAIL: " if level > PROFILE_BOUND_LEVEL else ""
    if level == 1:
        return f"max err/allowed \u2264 {_ratio(decade(1))}"
    if level == PROFILE_NONFINITE_LEVEL - 1:
        return f"{word}max err/allowed > {_ratio(decade(level - 1))}"
    return f"{word}max err/allowed in ({_ratio(decade(level - 1))}, {_ratio(decade(level))}]"


def _mix(stops: Sequence[tuple[float, tuple[int, int, int]]], t: float) -> str:
    for (t0, c0), (t1, c1) in zip(stops, stops[1:], strict=False):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            rgb = (round(a + (b - a) * f) for a, b in zip(c0, c1, strict=True))
            return "#" + "".join(f"{v:02x}" for v in rgb)
    return "#" + "".join(f"{v:02x}" for v in stops[-1][1])


def _ratio(log10: float) -> str:
    if log10 == int(log10):
        return {-2: "0.01", -1: "0.1", 0: "1", 1: "10"}.get(int(log10), f"1e{int(log10)}")
    return f"{10.0**log10:.2g}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _span(i: int, count: int, size: int) -> tuple[int, int]:
    """Elements ``[first, last]`` of bin ``i`` of ``count`` over ``size`` elements."""
    return i * size // count, max(i * size // count, (i + 1) * size // count - 1)


def _text(x: float, y: float, body: str, *, anchor: str = "middle", cls: str = "ax",
          rotate: bool = False) -> str:  # fmt: skip
    turn = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}"{turn}>'
            f"{escape(body)}</text>")  # fmt: skip


def vector_plot(extent: Sequence[int], bins: Sequence[int], levels: Sequence[int],
                title: str) -> str:  # fmt: skip
    """Bars of each bin's largest err/allowed on a log axis, over the flattened index."""
    n, count = extent[0], bins[0]
    width, height, left, right, top, bottom = 760, 230, 62, 58, 26, 44
    finite = [decade(v) for v in levels if 0 < v < PROFILE_NONFINITE_LEVEL]
    lo = min(-2, math.floor(min(finite, default=-2.0)))
    hi = max(1, math.ceil(max(finite, default=1.0)))
    plot_w, plot_h = width - left - right, height - top - bottom

    def y_of(log10: float) -> float:
        return top + plot_h * (hi - log10) / (hi - lo)

    parts = [f'<svg class="plot" role="img" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(title)}</title>",
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    step = max(1, math.ceil((hi - lo) / 6))
    for d in range(lo, hi + 1, step):
        y = y_of(d)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     'class="grid"/>')
        parts.append(_text(left - 6, y + 4, _ratio(d), anchor="end"))
    bar_w = plot_w / count
    inner_w = max(bar_w - 1, 0.8)
    for i, level in enumerate(levels):
        first, last = _span(i, count, n)
        x = left + i * bar_w
        tip = f"elements {first}\u2013{last}: {describe(level)}"
        if level == 0:  # a sliver at the floor, so that exact bins are seen to be there
            parts.append(f'<rect x="{x:.2f}" y="{top}" width="{bar_w:.2f}" height="{plot_h}" '
                         f'fill="transparent"><title>{escape(tip)}</title></rect>'
                         f'<rect x="{x:.2f}" y="{top + plot_h - 3}" width="{inner_w:.2f}" '
                         f'height="3" fill="{EXACT_COLOUR}"/>')
            continue
        y = top if level >= PROFILE_NONFINITE_LEVEL else y_of(decade(level))
        parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{inner_w:.2f}" '
                     f'height="{top + plot_h - y:.2f}" fill="{colour(level)}">'
                     f"<title>{escape(tip)}</title></rect>")
        if level > PROFILE_BOUND_LEVEL:
            parts.append(_text(x + bar_w / 2, top - 4, "\u2715", cls="fail-mark"))
    bound = y_of(0)
    parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{bound:.1f}" y2="{bound:.1f}" '
                 'class="bound"/>')
    parts.append(_text(left + plot_w + 5, bound + 4, "bound", anchor="start", cls="bound-label"))
    ticks = {0: (0.5, 0), count - 1: (count - 0.5, max(n - 1, 0))}
    if count > 2:
        ticks[count // 2] = (count // 2 + 0.5, _span(count // 2, count, n)[0])
    for where, index in ticks.values():
        parts.append(_text(left + where * bar_w, top + plot_h + 16, str(index)))
    parts.append(_text(left + plot_w / 2, height - 8,
                       f"flattened output index ({_count(n, 'element')}, {_count(count, 'bin')})"))
    parts.append(_text(16, top + plot_h / 2, "max |err| / allowed", rotate=True))
    parts.append("</svg>")
    return "".join(parts)


def matrix_plot(extent: Sequence[int], bins: Sequence[int], levels: Sequence[int],
                title: str) -> str:  # fmt: skip
    """A heat map of each bin's largest err/allowed over rows and columns."""
    rows, cols = extent
    r, c = bins
    cell = max(6.0, min(18.0, 520 / max(r, c)))
    left, top, right, bottom = 70, 34, 14, 16
    width = left + c * cell + right
    height = top + r * cell + bottom
    parts = [f'<svg class="plot" role="img" viewBox="0 0 {width:.0f} {height:.0f}" '
             f'width="{width:.0f}" height="{height:.0f}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(title)}</title>"]
    for i in range(r):
        r0, r1 = _span(i, r, rows)
        for j in range(c):
            level = levels[i * c + j]
            c0, c1 = _span(j, c, cols)
            tip = f"rows {r0}\u2013{r1}, cols {c0}\u2013{c1}: {describe(level)}"
            x, y = left + j * cell, top + i * cell
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
                         f'fill="{colour(level)}" class="cell"><title>{escape(tip)}</title>'
                         "</rect>")  # fmt: skip
            if level > PROFILE_BOUND_LEVEL and cell >= 9:
                parts.append(_text(x + cell / 2, y + cell * 0.72, "\u2715", cls="cell-mark"
                                   + (" on-dark" if level >= 58 else "")))  # fmt: skip
    parts.append(f'<rect x="{left}" y="{top}" width="{c * cell:.1f}" height="{r * cell:.1f}" '
                 'class="frame"/>')
    parts.append(_text(left, top - 8, "col 0", anchor="start"))
    parts.append(_text(left + c * cell, top - 8, f"col {cols - 1}", anchor="end"))
    parts.append(_text(left + c * cell / 2, top - 8,
                       f"{_count(cols, 'column')}, {_count(c, 'bin')}"))
    parts.append(_text(left - 6, top + 10, "row 0", anchor="end"))
    parts.append(_text(left - 6, top + r * cell, f"row {rows - 1}", anchor="end"))
    parts.append(_text(22, top + r * cell / 2, f"{_count(rows, 'row')}, {_count(r, 'bin')}",
                       rotate=True))
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    """The colour scale shared by every plot."""
    swatches = [(0, "exact"), (1, "\u2264 1e-8"), (32, "1e-4"), (PROFILE_BOUND_LEVEL, "1 (bound)"),
                (PROFILE_BOUND_LEVEL + 4, "FAIL \u2264 10"),
                (PROFILE_NONFINITE_LEVEL - 1, "FAIL \u226b"),
                (PROFILE_NONFINITE_LEVEL, "NaN/Inf/unwritten")]  # fmt: skip
    parts = ['<div class="legend"><span class="legend-title">max |err| / allowed per bin:</span>']
    for level, label in swatches:
        parts.append(f'<span class="swatch"><i style="background:{colour(level)}"></i>'
                     f"{escape(label)}</span>")
    parts.append("</div>")
    return "".join(parts)
