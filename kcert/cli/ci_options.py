"""The ``--junit`` and ``--sarif`` options that ``certify`` and ``lint`` share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JUnitOption = Annotated[Path | None, typer.Option(
    "--junit", metavar="FILE",
    help="Also write JUnit XML: one testcase per check, per kernel (failures carry the "
         "check's message).")]  # fmt: skip
SarifOption = Annotated[Path | None, typer.Option(
    "--sarif", metavar="FILE",
    help="Also write SARIF 2.1.0: compiler and lint findings at their source lines, failing "
         "checks at the kernel's definition.")]  # fmt: skip
