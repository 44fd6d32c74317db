"""``kcert perf compare --html``: one self-contained page for a latency comparison.

The page has no script and fetches nothing (the certificate report's
Content-Security-Policy and style, :mod:`kcert.attest.html_report`): an inline
SVG draws each kernel's latency CDF on a log axis from the comparison's
quantiles, with its p50/p95/p99 as marks and their bootstrap intervals as
bands, and a table gives the figures and the change of each percentile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from kcert.attest.html_plots import text
from kcert.attest.html_report import PAGE_CSP, PAGE_CSS
from kcert.registry.perf import CDF_LEVELS, LatencySummary, PerfComparison

#: Before and after (colour-blind safe: blue and orange).
BEFORE_COLOUR = "#1f77b4"
AFTER_COLOUR = "#e66100"
_W, _H = 860, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 24, 20, 52
_CSS = """
svg .cdf { fill: none; stroke-width: 2.5; }
svg .band { opacity: .22; }
svg .mark { stroke-width: 1.5; stroke-dasharray: 4 3; }
.key i { display: inline-block; width: 22px; height: 4px; vertical-align: 3px; margin: 0 6px 0 0; }
.key span { margin-right: 18px; }
"""


def render_perf_html(result: PerfComparison) -> str:
    """The page for ``result`` (a :class:`kcert.registry.perf.PerfComparison`)."""
    pct = round(result.confidence * 100)
    title = f"latency on {result.target}: before and after"
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="mute">{pct}% bootstrap intervals, {result.resamples} rounds, seed '
        f"{result.seed}</p>",
        _key(result),
        _plot(result),
        _table(result),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{PAGE_CSS}{_CSS}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _key(result: PerfComparison) -> str:
    def one(label: str, colour: str, s: LatencySummary) -> str:
        return (f'<span><i style="background:{colour}"></i>{label} <code>{_e(s.kernel)}</code> '
                f"({s.samples} samples)</span>")  # fmt: skip

    return (f'<p class="key">{one("before", BEFORE_COLOUR, result.before)}'
            f'{one("after", AFTER_COLOUR, result.after)}</p>')  # fmt: skip


def _plot(result: PerfComparison) -> str:
    sides = ((result.before, BEFORE_COLOUR), (result.after, AFTER_COLOUR))
    values = [v for s, _ in sides for v in [*s.quantiles_us, *_bounds(s)] if v > 0]
    if not values:
        return '<p class="none">no positive latencies to plot</p>'
    lo = math.floor(math.log10(min(values)) * 4) / 4
    hi = math.ceil(math.log10(max(values)) * 4) / 4
    hi = hi if hi > lo else lo + 1
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x_of(us: float) -> float:
        return _LEFT + (math.log10(max(us, 10**lo)) - lo) / (hi - lo) * width

    def y_of(fraction: float) -> float:
        return _TOP + (1 - fraction) * height

    parts = [f'<svg class="plot" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
             'role="img" aria-label="latency CDFs, before and after">']  # fmt: skip
    # 1-2-5 ticks: a comparison often spans less than a decade
    for decade in range(math.floor(lo), math.ceil(hi) + 1):
        for step in (1, 2, 5):
            us = step * 10.0**decade
            if not lo <= math.log10(us) <= hi:
                continue
            x = x_of(us)
            parts.append(f'<line class="grid" x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" '
                         f'y2="{_TOP + height}"/>')  # fmt: skip
            parts.append(text(x, _TOP + height + 16, _us(us)))
    for f in (0.0, 0.25, 0.5, 0.75, 0.95, 1.0):
        y = y_of(f)
        parts.append(f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + width}" '
                     f'y2="{y:.1f}"/>')  # fmt: skip
        parts.append(text(_LEFT - 6, y + 4 if f < 1 else y + 2, f"{f:g}", anchor="end"))
    for summary, colour in sides:
        for p in summary.percentiles:  # the intervals first, under the curves
            x0, x1 = x_of(p.low_us), x_of(p.high_us)
            parts.append(f'<rect class="band" x="{x0:.1f}" y="{_TOP}" '
                         f'width="{max(x1 - x0, 1.0):.1f}" height="{height}" fill="{colour}">'
                         f"<title>p{p.q:g} {_us(p.value_us)} [{_us(p.low_us)}, "
                         f"{_us(p.high_us)}]</title></rect>")  # fmt: skip
    for summary, colour in sides:
        points = " ".join(f"{x_of(v):.1f},{y_of(q / 100):.1f}"
                          for q, v in zip(CDF_LEVELS, summary.quantiles_us, strict=False))
        parts.append(f'<polyline class="cdf" stroke="{colour}" points="{points}"/>')
        for p in summary.percentiles:
            x = x_of(p.value_us)
            parts.append(f'<line class="mark" stroke="{colour}" x1="{x:.1f}" y1="{_TOP}" '
                         f'x2="{x:.1f}" y2="{_TOP + height}"/>')  # fmt: skip
    parts.append(f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{width}" '
                 f'height="{height}"/>')  # fmt: skip
    parts.append(text(_LEFT + width / 2, _H - 12, "latency per call (log scale)"))
    parts.append(text(16, _TOP + height / 2, "fraction of calls at or below", rotate=True))
    parts.append("</svg>")
    return "".join(parts)


def _bounds(summary: LatencySummary) -> Sequence[float]:
    return [v for p in summary.percentiles for v in (p.low_us, p.high_us)]


def _table(result: PerfComparison) -> str:
    rows = []
    for b, a, c in zip(result.before.percentiles, result.after.percentiles, result.changes,
                       strict=True):  # fmt: skip
        rows.append(
            f"<tr><th>p{b.q:g}</th><td>{_us(b.value_us)} [{_us(b.low_us)}, {_us(b.high_us)}]"
            f"</td><td>{_us(a.value_us)} [{_us(a.low_us)}, {_us(a.high_us)}]</td>"
            f"<td>{c.change_pct:+.1f}% [{c.low_pct:+.1f}, {c.high_pct:+.1f}]</td></tr>"
        )
    return ("<table><tr><th></th><th>before</th><th>after</th><th>change</th></tr>"
            + "".join(rows) + "</table>")  # fmt: skip


def _us(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value >= 1e6:
        return f"{value / 1e6:.3g} s"
    if value >= 1e3:
        return f"{value / 1e3:.3g} ms"
    return f"{value:.3g} µs"
