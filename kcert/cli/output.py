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
from typing import TYPE_CHECKING, Any

from kcert.errors import KcertError

if TYPE_CHECKING:
    from rich.console import Console

    #: Human-facing text and progress go to stderr so that stdout stays parseable.
    err_console: Console
    #: Tables and results a person asked for.
    out_console: Console

#: Columns a console that is not a terminal lays text out in: wider than any line we write.
PIPE_WIDTH = 4096


def _make_consoles() -> None:
    # Rich takes a good part of ``kcert --version``'s start: made on first use instead.
    # lazy: rich loads only when something is printed
    from rich.console import Console, ConsoleDimensions

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

    globals().update(err_console=_Console(stderr=True, highlight=False),
                     out_console=_Console(highlight=False))  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in ("err_console", "out_console"):
        _make_consoles()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _err() -> Console:
    # Inside this module a bare name does not go through the module's __getattr__.
    console: Console = __getattr__("err_console") if "err_console" not in globals() else (
        globals()["err_console"])  # fmt: skip
    return console


def emit_json(value: Any) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def emit_error(exc: KcertError, *, as_json: bool) -> None:
    """Show an error; with ``--json`` it is also the one object on stdout."""
    # lazy: rich loads only when something is printed
    from rich.markup import escape

    text = exc.diagnostics()
    # Messages quote spec text such as "[kernel.args]" or "f32[m, n]": not rich markup.
    _err().print(f"[bold red]error:[/] {escape(text)}", markup=True, soft_wrap=True)
    if as_json:
        emit_json({"error": {"type": exc.kind, "detail": text}})


@contextmanager
def progress(label: str) -> Iterator[Callable[[str], None]]:
    """Show long work on stderr; yields a function that reports each step.

    On a terminal a spinner shows the latest step; elsewhere each step is one
    line (``label: step``), so a CI log shows where a slow run spends its time.
    """
    # lazy: rich loads only when something is printed
    from rich.markup import escape

    console = _err()
    if console.is_terminal:
        with console.status(escape(label), spinner="dots") as status:
            yield lambda text: status.update(f"{escape(label)}: {escape(text)}")
        return
    last: list[str] = []

    def step(text: str) -> None:
        if last and last[0] == text:
            return  # the same step again says nothing new
        last[:] = [text]
        console.print(f"{label}: {text}", markup=False, highlight=False)

    yield step
