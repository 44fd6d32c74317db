"""Outputs for CI: JUnit XML and SARIF 2.1.0 from the checks of one or many kernels.

Each format is one :class:`OutputFormat` in :data:`FORMATS`; the CLI's
``--junit FILE`` and ``--sarif FILE`` options name formats from there and
:func:`write_outputs` writes them. A file is written whole or not at all (a
temporary file renamed over it), so a CI step never reads half a report.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kcert.certify.ci.outcome import KernelOutcome
from kcert.errors import UsageError


class OutputFormat(Protocol):
    def render(self, outcomes: Sequence[KernelOutcome], *, command: str, base: Path) -> bytes:
        """The whole file for ``outcomes`` of ``kcert <command>``; paths relative to ``base``."""
        ...


@dataclass(frozen=True, slots=True)
class _JUnit:
    def render(self, outcomes: Sequence[KernelOutcome], *, command: str, base: Path) -> bytes:
        # lazy: a format loads only when it is written (and it imports this package back)
        from kcert.certify.ci import junit

        return junit.render(outcomes, command=command)


@dataclass(frozen=True, slots=True)
class _Sarif:
    def render(self, outcomes: Sequence[KernelOutcome], *, command: str, base: Path) -> bytes:
        # lazy: a format loads only when it is written (and it imports this package back)
        from kcert.certify.ci import sarif

        return sarif.render(outcomes, command=command, base=base)


#: The CI output formats by the name of their CLI option.
FORMATS: Mapping[str, OutputFormat] = {"junit": _JUnit(), "sarif": _Sarif()}


def check_targets(targets: Mapping[str, Path | None]) -> None:
    """Refuse, before any work, an output file whose folder does not exist."""
    for name, path in targets.items():
        if name not in FORMATS:
            raise UsageError(f"unknown output format '{name}'; known: {', '.join(FORMATS)}")
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"--{name} {path}: the folder {path.parent} does not exist")
        if path is not None and path.is_dir():
            raise UsageError(f"--{name} {path}: is a folder; name a file")


def write_outputs(targets: Mapping[str, Path | None], outcomes: Sequence[KernelOutcome], *,
                  command: str, base: Path | None = None) -> None:  # fmt: skip
    """Write each named format's file for ``outcomes``."""
    check_targets(targets)
    for name, path in targets.items():
        if path is None:
            continue
        data = FORMATS[name].render(outcomes, command=command, base=base or Path.cwd())
        _write_whole(path, data)


def _write_whole(path: Path, data: bytes) -> None:
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc


__all__ = ["FORMATS", "KernelOutcome", "OutputFormat", "check_targets", "write_outputs"]
