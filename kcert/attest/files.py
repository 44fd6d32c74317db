"""Reading the small files of attestation (keys, certificates) with one set of errors."""

from __future__ import annotations

from pathlib import Path

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
