"""Commands of this group (filled in by the issue that owns them)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to app."""
