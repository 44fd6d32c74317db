"""``kcert perf compare --html``: the page's content, and the page in a real browser."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kcert.registry.perf import CDF_LEVELS, PerfComparison, compare_values
from kcert.registry.perf_html import AFTER_COLOUR, BEFORE_COLOUR, render_perf_html

BEFORE, AFTER = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def _comparison() -> PerfComparison:
    rng = np.random.default_rng(1)
    before = rng.lognormal(np.log(100), 0.2, 4000)  # about 100 µs
    after = rng.lognormal(np.log(160), 0.3, 4000)  # slower and wider
    return compare_values("prod-a", (BEFORE, before), (AFTER, after), resamples=200)


def test_the_page_draws_both_cdfs_and_every_percentile_with_its_interval() -> None:
    result = _comparison()
    page = render_perf_html(result)
    assert "<script" not in page and "default-src 'none'" in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    curves = re.findall(r'<polyline class="cdf" stroke="(#[0-9a-f]{6})" points="([^"]+)"', page)
    assert [c for c, _ in curves] == [BEFORE_COLOUR, AFTER_COLOUR]
    for _, points in curves:
        xs = [float(p.split(",")[0]) for p in points.split()]
        assert len(xs) == len(CDF_LEVELS) and xs == sorted(xs)  # a CDF never goes back
    # the after curve sits to the right (slower) at the median
    assert float(curves[1][1].split()[100].split(",")[0]) > float(
        curves[0][1].split()[100].split(",")[0])
    assert page.count('class="band"') == page.count('class="mark"') == 6
    for summary in (result.before, result.after):
        for p in summary.percentiles:
            assert p.low_us <= p.value_us <= p.high_us
    for q in ("p50", "p95", "p99"):
        assert f"<th>{q}</th>" in page
    change = result.changes[0]
    assert f"{change.change_pct:+.1f}%" in page
    assert BEFORE in page and AFTER in page


def test_kernel_names_and_targets_are_escaped() -> None:
    result = _comparison().model_copy(update={"target": "<b>x</b>"})
    assert "<b>x</b>" not in render_perf_html(result)


@pytest.mark.browser
def test_the_page_renders_in_chromium_without_a_console_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the certificate report's browser harness: same Chromium flags, PNG decoder, console check
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "attest"))
    from test_html_browser import _chromium, _console, _count, _pixels

    page = tmp_path / "perf.html"
    page.write_text(render_perf_html(_comparison()), encoding="utf-8")
    shot = tmp_path / "perf.png"
    log = _chromium(tmp_path, page, shot)
    assert _console(log) == []  # nothing blocked by the policy, no script
    pixels = _pixels(shot.read_bytes())
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20
    # both curves are drawn (2.5 px strokes, hundreds of pixels each) besides the key's swatch
    assert _count(pixels, BEFORE_COLOUR) > 300
    assert _count(pixels, AFTER_COLOUR) > 300
