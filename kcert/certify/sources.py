"""The bytes of a certification's inputs, read once and digested.

A certificate names the bytes that ran. So the kernel source, every file it
includes and the reference module are each read exactly once, when the spec is
loaded, into frozen :class:`SourceFile` values; from then on nothing reads them
from disk again. Builds, sandboxed workers and the reference all get these
bytes, and the certificate's subjects are their digests: a file that changes on
disk during certification changes nothing.

A CUDA source's local includes (``#include "name.h"``) are read here too, but
only headers (:data:`HEADER_SUFFIXES`) from the source's own folder and its
subfolders: a kernel that includes ``"/root/.kcert/signing.key"`` or
``"reference.py"`` must not get the certifier to read that file and hand it to
the compiler, whose error log would quote it. Any other include is left to
NVRTC, which cannot see those files inside the sandbox and fails there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kcert.digest import Digest

#: One source file may be this large; a kernel or reference is never near it.
MAX_SOURCE_BYTES = 8 << 20
#: Local headers followed from one CUDA source, transitively.
MAX_INCLUDES = 64

#: What a local include may name: headers, never the reference, the spec or a key.
HEADER_SUFFIXES = frozenset({".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl"})

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)


class SourceReadError(Exception):
    """A source file that cannot be read; the spec loader turns it into a SpecError."""


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file's name (relative to the kernel's folder) and the bytes read from it."""

    name: str
    data: bytes

    @property
    def digest(self) -> Digest:
        return Digest.of_bytes(self.data)

    def text(self) -> str:
        """The bytes as UTF-8; raises ``UnicodeDecodeError`` for anything else."""
        return self.data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class SourceBundle:
    """A kernel's source and the local headers it includes, as read once."""

    main: SourceFile
    includes: tuple[SourceFile, ...] = ()

    @property
    def digest(self) -> Digest:
        """The digest of the kernel source's own bytes (the certificate's subject)."""
        return self.main.digest

    def files(self) -> tuple[SourceFile, ...]:
        return (self.main, *self.includes)


def read_file(path: Path, name: str | None = None) -> SourceFile:
    """Read ``path`` once (bounded); ``name`` defaults to the file's own name."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise SourceReadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceReadError(f"{path} is larger than {MAX_SOURCE_BYTES >> 20} MiB")
    return SourceFile(name or path.name, data)


def read_kernel_source(path: Path, language: str) -> SourceBundle:
    """The kernel source and, for CUDA C, the local headers it includes."""
    main = read_file(path)
    if language != "cuda":
        return SourceBundle(main)
    root = path.parent.resolve()
    found: dict[str, SourceFile] = {}
    pending = [(main, path.parent)]
    while pending:
        current, folder = pending.pop()
        for match in _INCLUDE.finditer(current.data):
            header = _local_header(root, folder, match.group(1))
            if header is None:
                continue
            name = header.relative_to(root).as_posix()
            if name in found or name == main.name:
                continue
            if len(found) >= MAX_INCLUDES:
                raise SourceReadError(f"{path} includes more than {MAX_INCLUDES} local headers")
            found[name] = read_file(header, name)
            pending.append((found[name], header.parent))
    return SourceBundle(main, tuple(found[k] for k in sorted(found)))


def _local_header(root: Path, folder: Path, raw: bytes) -> Path | None:
    """The header a quoted include names, if it is a file inside ``root``; else None."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    candidate = (folder / text).resolve()
    if candidate.suffix.lower() not in HEADER_SUFFIXES:
        return None
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate
