"""``kcert fingerprint``: this machine's environment and its drift fingerprint."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from kcert.certify.environment import EXECUTOR_CHOICES, collect_environment, gpu_status
from kcert.cli.output import emit_json, err_console, out_console
from kcert.errors import UsageError


def fingerprint_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            help="auto (the GPU when there is one), cuda, triton or triton-interpreter.",
        ),
    ] = "auto",
) -> None:
    """Show this machine's environment and fingerprint (the CPU stack when no GPU is found)."""
    if executor not in EXECUTOR_CHOICES:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTOR_CHOICES)}, "
                         f"not {executor!r}")  # fmt: skip
    note = None
    if executor == "auto":
        found, reason = gpu_status()
        if not found:
            note = f"no GPU found ({reason}); showing the CPU interpreter's stack"
    env = collect_environment(executor)
    drift = env.drift_fields()
    digest = env.fingerprint()
    if as_json:
        emit_json({
            "hw_class": env.hw_class,
            "gpu_found": env.device is not None,
            "note": note,
            "environment": dict(env.fields),
            "drift_fields": list(drift),
            "fingerprint": str(digest),
        })  # fmt: skip
        return
    if note is not None:
        err_console.print(note, soft_wrap=True)
    table = Table(show_header=True, header_style="bold")
    table.add_column("field")
    table.add_column("value")
    table.add_column("drift")
    for name, value in env.fields.items():
        table.add_row(name, "-" if value is None else str(value), "yes" if name in drift else "")
    out_console.print(table)
    out_console.print(f"hardware class: {env.hw_class}", soft_wrap=True)
    out_console.print(f"fingerprint: {digest}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``kcert fingerprint`` to the application."""
    app.command("fingerprint")(fingerprint_command)
