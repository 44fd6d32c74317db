"""Command groups that two command modules fill.

``keys`` is one group: ``kcert.cli.attest_cmds`` adds ``keys generate`` and
``kcert.cli.registry_cmds`` adds ``keys trust`` and ``keys revoke``. It lives
here so that neither module imports the other: ``kcert gate`` loads the
registry's commands, and with them no certificate code.
"""

from __future__ import annotations

import typer

keys_app = typer.Typer(
    name="keys", help="Signing keys: generate (and, with a registry, trust or revoke).",
    no_args_is_help=True,
)  # fmt: skip
