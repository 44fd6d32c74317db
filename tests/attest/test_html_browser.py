"""The HTML report in a real browser: headless Chromium renders it without a console message.

Needs the ``chromium`` binary (Debian: ``apt-get install -y chromium``); set
``KCERT_CHROMIUM`` to use another. The screenshot is decoded here (PNG is zlib
plus five row filters) so the test can look for what the page must show: the
verdict badge, and the colours of failing and NaN bins in the plots.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from html_samples import sample_report

from kcert.attest.certificate import inspect_envelope, sign_report
from kcert.attest.html_plots import NONFINITE_COLOUR, colour
from kcert.attest.html_report import render_html
from kcert.attest.keys import generate_private_key
from kcert.certify.report import PROFILE_NONFINITE_LEVEL

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("KCERT_CHROMIUM") or shutil.which("chromium")
WIDTH, HEIGHT = 1200, 3400
VERDICT_RED = "#c62828"


def _chromium(tmp_path: Path, page: Path, shot: Path) -> str:
    """Render ``page`` to ``shot``; return Chromium's log (stderr and stdout)."""
    if CHROMIUM is None:
        pytest.skip("needs the chromium binary (Debian: apt-get install -y chromium)")
    done = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=1", f"--window-size={WIDTH},{HEIGHT}",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    log = done.stderr + done.stdout
    assert done.returncode == 0 and shot.is_file(), log[-3000:]
    return log


def _console(log: str) -> list[str]:
    """What the page wrote to its console (messages, uncaught errors, CSP refusals)."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def _pixels(png: bytes) -> np.ndarray[Any, Any]:
    """The ``(height, width, 3)`` RGB pixels of an 8-bit RGB or RGBA PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, header = 8, b"", b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        chunk, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        header = body if chunk == b"IHDR" else header
        data += body if chunk == b"IDAT" else b""
        at += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6), (depth, colour_type)
    bpp = 3 if colour_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(data), dtype=np.uint8).reshape(height, width * bpp + 1)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.uint8)
    for y in range(height):
        kind, line = int(raw[y, 0]), raw[y, 1:].copy()
        if kind == 1:  # Sub: a running sum along each channel, modulo 256
            summed = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) % 256
            line = summed.astype(np.uint8).reshape(-1)
        elif kind == 2:
            line = line + prev
        elif kind in (3, 4):  # Average and Paeth depend on the byte just decoded
            row, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(len(row)):
                a = row[i - bpp] if i >= bpp else 0
                b, c = up[i], up[i - bpp] if i >= bpp else 0
                if kind == 3:
                    pred = (a + b) >> 1
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                row[i] = (row[i] + pred) & 0xFF
            line = np.frombuffer(bytes(row), dtype=np.uint8)
        out[y] = prev = line
    return out.reshape(height, width, bpp)[:, :, :3]


def _count(pixels: np.ndarray[Any, Any], colour: str) -> int:
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(pixels == rgb, axis=2).sum())


def test_report_renders_in_chromium_with_plots_and_no_console_message(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    contents = inspect_envelope(sign_report(sample_report(), generate_private_key()))
    page.write_text(render_html(contents, keyid=None), encoding="utf-8")
    shot = tmp_path / "report.png"
    log = _chromium(tmp_path, page, shot)
    assert _console(log) == []
    pixels = _pixels(shot.read_bytes())
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20  # not blank, not one colour
    assert _count(pixels, VERDICT_RED) > 200  # the FAIL badge
    # each colour is in the legend's 14x14 swatch once; the rest is the plots' bars and cells
    swatch = 14 * 14
    assert _count(pixels, NONFINITE_COLOUR) > swatch + 400  # the NaN bins of both plots
    failing = colour(PROFILE_NONFINITE_LEVEL - 1)  # the 0.5 errors (ratio 5e4) in both plots
    assert _count(pixels, failing) > swatch + 400


def test_the_console_check_sees_scripts_and_blocked_loads(tmp_path: Path) -> None:
    """The check above could not pass by accident: a page that logs, throws and fetches fails it."""
    page = tmp_path / "noisy.html"
    page.write_text('<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
                    "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>x"
                    "<script>console.log('hello'); missing();</script>"
                    '<img src="https://example.invalid/x.png"></body></html>')  # fmt: skip
    log = _chromium(tmp_path, page, tmp_path / "noisy.png")
    lines = _console(log)
    assert any("hello" in line for line in lines)
    assert any("Uncaught ReferenceError" in line for line in lines)
    assert any("Content Security Policy" in line for line in lines)
