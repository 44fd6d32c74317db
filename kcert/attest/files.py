"""Reading and writing the small files of attestation (keys, certificates, reports)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kcert.attest.errors import OutputFileError
from kcert.errors import KcertError


def read_bounded(path: Path, *, limit: int, what: str, error: type[KcertError]) -> bytes:
    """Read ``path`` whole, refusing folders, unreadable files and files over ``limit`` bytes.

    Reading stops one byte past the limit, so a huge file is never loaded.
    """
    try:
        if path.is_dir():
            raise error(f"{path} is a directory; expected a {what} file")
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError as exc:
        raise error(f"{what} file {path} does not exist") from exc
    except PermissionError as exc:
        raise error(f"cannot read {what} file {path}: permission denied") from exc
    except OSError as exc:
        raise error(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if len(data) > limit:
        raise error(f"{path} is too large to be a {what} file")
    return data


def write_atomic(path: Path, data: bytes, *, what: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputFileError(f"cannot write {what} {path}: {exc.strerror}") from exc
