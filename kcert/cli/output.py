"""Output helpers shared by the commands: JSON on stdout, people on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from kcert.errors import KcertError

#: Human-facing text and progress go to stderr so that stdout stays parseable.
err_console = Console(stderr=True, highlight=False)
#: Tables and results a person asked for.
out_console = Console(highlight=False)


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
