"""``kcert digest``: the content address the registry knows a kernel by.

``gate``, ``promote`` and the API name a kernel by the ``sha256:`` digest of
its source file's own bytes (the certificate's first subject). A deploy
script holds the file it is about to ship, not its certificate, so it needs
that digest from the file alone, without loading a spec or the certifier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kcert.cli.output import emit_json, out_console
from kcert.digest import Digest
from kcert.errors import UsageError


def digest_command(
    files: Annotated[
        list[Path], typer.Argument(help="Kernel source files (or any files).", metavar="FILE...")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Print the sha256: digest of each file, one a line: what --kernel takes."""
    digests: list[tuple[Path, Digest]] = []
    for path in files:
        try:
            digests.append((path, Digest.of_file(path)))
        except IsADirectoryError:
            raise UsageError(f"{path}: is a folder, not a file") from None
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if as_json:
        emit_json({"digests": [{"file": str(p), "digest": str(d)} for p, d in digests]})
        return
    for _path, digest in digests:
        out_console.print(str(digest), soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``kcert digest`` to the application."""
    app.command("digest")(digest_command)
