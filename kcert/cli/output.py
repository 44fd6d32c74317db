"""Output helpers shared by the commands: JSON on stdout, people on stderr.

When a stream is not a terminal (a pipe, a CI log, a file) nothing is wrapped:
a digest cut across two lines can be neither searched for nor pasted, and a
log has no width. Progress there is one plain line per step instead of a
spinner that a log would record as control characters.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from kcert.errors import KcertError

#: Columns a console that is not a terminal lays text out in: wider than any line we write.
PIPE_WIDTH = 4096


class _Console(Console):
    """A console that wraps at the terminal's width on a terminal and nowhere else."""

    @property
    def size(self) -> ConsoleDimensions:
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(PIPE_WIDTH, 25)
        return super().size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


#: Human-facing text and progress go to stderr so that stdout stays parseable.
err_console: Console = _Console(stderr=True, highlight=False)
#: Tables and results a person asked for.
out_console: Console = _Console(highlight=False)


def emit_json(value: Any) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def emit_error(exc: KcertError, *, as_json: bool) -> None:
    """Show an error; with ``--json`` it is also the one object on stdout."""
    text = exc.diagnostics()
    # Messages quote spec text such as "[kernel.args]" or "f32[m, n]": not rich markup.
    err_console.print(f"[bold red]error:[/] {escape(text)}", markup=True, soft_wrap=True)
    if as_json:
        emit_json({"error": {"type": exc.kind, "detail": text}})


@contextmanager
def progress(label: str) -> Iterator[Callable[[str], None]]:
    """Show long work on stderr; yields a function that reports each step.

    On a terminal a spinner shows the latest step; elsewhere each step is one
    line (``label: step``), so a CI log shows where a slow run spends its time.
    """
    if err_console.is_terminal:
        with err_console.status(escape(label), spinner="dots") as status:
            yield lambda text: status.update(f"{escape(label)}: {escape(text)}")
        return
    last: list[str] = []

    def step(text: str) -> None:
        if last and last[0] == text:
            return  # the same step again says nothing new
        last[:] = [text]
        err_console.print(f"{label}: {text}", markup=False, highlight=False)

    yield step
