"""Human output off a terminal: no wrapping inside digests, no ``None``, plain progress."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from rich.table import Table

from kcert.cli import audit_cmds, output

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    buffer = io.StringIO()  # not a terminal, as in a pipe or a CI log
    monkeypatch.delenv("COLUMNS", raising=False)
    consoles = (output.out_console, output.err_console)
    for console in consoles:
        console.file = buffer
    yield buffer
    # Not monkeypatch: it would restore `file` to the stream the property returned then
    # (this test's captured stderr) for good; None makes the consoles follow
    # sys.stdout/sys.stderr again, as later CliRunner invocations swap them.
    for console in consoles:
        console.file = None  # type: ignore[assignment]


def test_a_long_line_with_a_digest_stays_on_one_line(captured: io.StringIO) -> None:
    line = f"kernel saxpy ({DIGEST}), verdict pass, hardware cpu, signed by {'ab' * 32}"
    assert len(line) > 80
    output.out_console.print(line)
    assert captured.getvalue() == line + "\n"


def test_a_table_cell_with_a_digest_is_not_folded(captured: io.StringIO) -> None:
    table = Table()
    for column in ("check", "message"):
        table.add_column(column, overflow="fold")
    table.add_row("correctness", f"output y differs from the reference anchor {DIGEST} at 3")
    output.out_console.print(table)
    assert re.search(re.escape(DIGEST) + r" at 3", captured.getvalue())


def test_plain_progress_lines_off_a_terminal(captured: io.StringIO) -> None:
    with output.progress("certifying saxpy") as step:
        step("fixed probe 1/3: n=1")
        step("fixed probe 1/3: n=1")
        step("fixed probe 2/3: n=33")
    assert captured.getvalue().splitlines() == [
        "certifying saxpy: fixed probe 1/3: n=1",
        "certifying saxpy: fixed probe 2/3: n=33",
    ]


def _replay(certificate: str | None, allow: bool) -> dict[str, Any]:
    return {
        "index": 4, "kind": "promotion", "same": True, "included": True, "differences": [],
        "objects": [], "rerun": None,
        "replayed": {"allow": allow, "certificate": certificate},
    }  # fmt: skip


def test_a_denied_replay_says_no_certificate_not_none(captured: io.StringIO) -> None:
    audit_cmds._show_replay(_replay(None, allow=False))
    text = captured.getvalue()
    assert "None" not in text
    assert "replayed: deny, no certificate" in text
    audit_cmds._show_replay(_replay(DIGEST, allow=True))
    assert f"replayed: allow, certificate {DIGEST}" in captured.getvalue()
