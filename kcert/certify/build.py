"""Compile kernels to PTX and cubin without a GPU, and read what ptxas reports.

CUDA C goes through NVRTC from pip (``cupy.cuda.nvrtc`` over the
``nvidia-cuda-nvrtc`` wheel); no system CUDA and no driver are needed. NVRTC
runs only in a sandboxed child (:mod:`kcert.certify.build_child`) over the
bytes the spec read once; this process only checks and caches what comes back. The
result is a typed :class:`Build`: PTX, cubin, the compiler log and the
entry function's :class:`~kcert.certify.report.Resources`. Builds are cached
under ``$KCERT_HOME/cache/builds`` by a content address over everything that
decides the output (source bytes, options, architecture, compiler version),
so a cached build is the build that would have been made.

Triton sources (``.py``) are compiled by :mod:`kcert.certify.triton_build`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from kcert.certify.build_child import RawBuild, build_in_child
from kcert.certify.environment import HW_CLASSES
from kcert.certify.errors import ArchError, BuildError, CompilerUnavailable
from kcert.certify.report import BuildRecord, Resources
from kcert.certify.sources import SourceBundle
from kcert.certify.spec import KernelSpec
from kcert.digest import Digest

#: Compute architecture per hardware class (``--hw``), for ``--arch``'s default.
#: ``sm_XX`` of every GPU class, from the one hardware table in ``environment``.
HW_ARCH: Mapping[str, str] = {
    name: f"sm_{rule[1][0]}{rule[1][1]}" for name, rule in HW_CLASSES.items() if rule is not None
}

DEFAULT_HW = "H100"
_ARCH = re.compile(r"^sm_(\d{2,3})[af]?$")
#: Bumped whenever the cached layout or the way a build is made changes.
_CACHE_FORMAT = 3


def arch_for_hw(hw_class: str) -> str:
    """The ``sm_XX`` architecture of a hardware class such as ``H100``."""
    key = re.sub(r"[\s_-]", "", hw_class).upper()
    if key not in HW_ARCH:
        known = ", ".join(sorted(HW_ARCH))
        raise ArchError(
            f"unknown hardware class '{hw_class}'; known: {known} "
            "(or name the architecture with --arch sm_XX)"
        )
    return HW_ARCH[key]


def check_arch(arch: str) -> str:
    """Validate an ``sm_XX`` name (``sm_90``, ``sm_90a``, ``sm_100``)."""
    if not _ARCH.match(arch):
        raise ArchError(f"'{arch}' is not an architecture; expected sm_XX such as sm_90 or sm_80")
    return arch


@dataclass(frozen=True, slots=True)
class Build:
    """One compiled kernel: the artifacts, the log and what ptxas said about the entry."""

    entry: str
    language: Literal["cuda", "triton"]
    arch: str
    options: tuple[str, ...]
    compiler: str
    ptx: bytes
    cubin: bytes
    log: str
    resources: Resources | None
    #: Where the build came from: the cache, or a fresh compile.
    cached: bool = False

    @property
    def digest(self) -> Digest:
        """The build digest: the cubin's content address."""
        return Digest.of_bytes(self.cubin)

    @property
    def ptx_digest(self) -> Digest:
        return Digest.of_bytes(self.ptx)

    @property
    def ptx_text(self) -> str:
        return self.ptx.decode("utf-8", errors="replace")

    def record(self) -> BuildRecord:
        return BuildRecord(
            compiler=self.compiler,
            arch=self.arch,
            options=self.options,
            ptx_digest=str(self.ptx_digest),
            cubin_digest=str(self.digest),
            resources=self.resources,
        )


# ------------------------------------------------------------------ ptxas report and PTX


_USED = re.compile(r"Used (\d+) registers")
_FIGURES = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared": re.compile(r"(\d+) bytes smem"),
    "lmem": re.compile(r"(\d+) bytes lmem"),
    "cumulative": re.compile(r"(\d+) bytes cumulative stack size"),
}
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_FUNCTION = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?")


def parse_ptxas_report(log: str, entry: str) -> Resources | None:
    """The entry function's resources from a ``ptxas -v`` log, or None if it has no report.

    ptxas reports each function in a section opened by "Compiling entry
    function 'f'" or "Function properties for f"; the figures that follow belong
    to it. Local memory is what ptxas calls ``lmem`` when it reports it, else
    the cumulative stack (the stack frame plus callees' frames), which is
    where local arrays and spills live.
    """
    figures: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        if match := _FUNCTION.search(line):
            current = match.group(1)
            figures.setdefault(current, {})
            continue
        if current is None:
            continue
        found = figures[current]
        if match := _STACK.search(line):
            found["stack"], found["spill_stores"], found["spill_loads"] = map(int, match.groups())
        if match := _USED.search(line):
            found["registers"] = int(match.group(1))
            found["cmem"] = sum(int(v) for v in _CMEM.findall(line))
            for name, pattern in _FIGURES.items():
                if m := pattern.search(line):
                    found[name] = int(m.group(1))
    found = figures.get(entry, {})
    if "registers" not in found:
        return None
    stack = found.get("stack", 0)
    local = found.get("lmem", max(found.get("cumulative", 0), stack))
    return Resources(
        registers=found["registers"],
        spill_stores=found.get("spill_stores", 0),
        spill_loads=found.get("spill_loads", 0),
        stack_bytes=stack,
        shared_bytes=found.get("shared", 0),
        const_bytes=found.get("cmem", 0),
        local_bytes=local,
        barriers=found.get("barriers", 0),
    )


_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(")
_PARAM_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def ptx_entries(ptx: str) -> tuple[str, ...]:
    """Names of the ``.entry`` functions a PTX module defines."""
    return tuple(_ENTRY.findall(ptx))


def ptx_param_sizes(ptx: str, entry: str) -> tuple[int, ...] | None:
    """Byte size of each parameter of ``entry``, in order; None if the entry is absent."""
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if match is None:
        return None
    sizes: list[int] = []
    for decl in match.group(1).split(","):
        if not decl.strip():
            continue
        if array := re.search(r"\.b8\s+\S+\[(\d+)\]", decl):
            sizes.append(int(array.group(1)))
        elif scalar := re.search(r"\.param\s+\.[a-z](8|16|32|64)\b", decl):
            sizes.append(_PARAM_SIZES[scalar.group(1)])
        else:
            sizes.append(0)
    return tuple(sizes)


# ------------------------------------------------------------------------- NVRTC


def _nvrtc() -> Any:
    try:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        from cupy.cuda import nvrtc
    except (ImportError, OSError, RuntimeError) as exc:  # CuPy missing, or NVRTC failing to load
        raise CompilerUnavailable(
            f"NVRTC cannot be loaded ({exc}); install the nvidia-cuda-nvrtc and cupy wheels"
        ) from exc
    return nvrtc


@cache
def nvrtc_version() -> str:
    """The NVRTC version as ``major.minor``."""
    nvrtc = _nvrtc()
    try:
        major, minor = nvrtc.getVersion()
    except (OSError, RuntimeError) as exc:  # the wheel's library is missing or broken (NVRTCError)
        raise CompilerUnavailable(f"NVRTC is installed but does not load: {exc}") from exc
    return f"{major}.{minor}"


@cache
def _nvrtc_release() -> str:
    """The NVRTC wheel's full release: patch releases share ``major.minor`` but may differ."""
    try:
        return importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def compile_options(kernel: KernelSpec, arch: str) -> tuple[str, ...]:
    """The full NVRTC option list: the architecture, the ptxas report, then the spec's."""
    for option in kernel.build_options:
        if option.startswith(("-arch", "--gpu-architecture")):
            raise kernel.error(
                "build.options",
                f"'{option}': the architecture comes from --arch or --hw, not from the spec",
            )
    return (f"--gpu-architecture={arch}", "--ptxas-options=-v", *kernel.build_options)


def build_cuda(
    kernel: KernelSpec, *, arch: str, use_cache: bool = True, sandbox: bool = True
) -> Build:  # fmt: skip
    """Compile a CUDA C kernel with NVRTC to PTX and cubin for ``arch``, in a sandboxed child.

    The source is the spec's bytes as read once (:mod:`kcert.certify.sources`),
    with the local headers read beside it; NVRTC runs in the child only.
    """
    if kernel.language != "cuda":
        raise BuildError(f"kernel '{kernel.name}' is {kernel.language}, not CUDA C")
    check_arch(arch)
    options = compile_options(kernel, arch)
    compiler = f"nvrtc {nvrtc_version()}"
    key = Digest.of_json(
        {
            "format": _CACHE_FORMAT,
            "language": "cuda",
            "compiler": compiler,
            "release": _nvrtc_release(),
            "arch": arch,
            "options": list(options),
            "name": kernel.code.main.name,
            "source": kernel.code.digest.hex,
            "includes": {f.name: f.digest.hex for f in kernel.code.includes},
        }
    )
    stored = load_cached(key) if use_cache else None
    if stored is not None:
        ptx, cubin, log = stored
        cached = True
    else:
        raw = build_in_child(kernel, arch=arch, sandbox=sandbox).builds[0]
        ptx, cubin, log = raw.ptx, raw.cubin, raw.log
        if use_cache:
            store_cached(key, ptx, cubin, log)
        cached = False
    return finish_build(
        kernel.entry, "cuda", arch, options, compiler, ptx, cubin, log, cached=cached
    )


def compile_cuda(kernel: KernelSpec, arch: str) -> RawBuild:
    """NVRTC over the spec's bytes; runs in the build child (``kcert.certify.worker``)."""
    options = compile_options(kernel, arch)
    ptx, cubin, log = _nvrtc_compile(kernel.code, options, arch)
    return RawBuild(options, f"nvrtc {nvrtc_version()}", ptx, cubin, log)


def _nvrtc_compile(
    code: SourceBundle, options: tuple[str, ...], arch: str
) -> tuple[bytes, bytes, str]:
    nvrtc = _nvrtc()
    name = code.main.name
    try:
        text = code.main.text()
        for header in code.includes:
            header.text()
    except UnicodeDecodeError as exc:
        raise BuildError(f"{name} or a header it includes is not UTF-8 text") from exc
    # cupy takes the headers and their names as bytes
    program = nvrtc.createProgram(text, name, [f.data for f in code.includes],
                                  [f.name.encode() for f in code.includes])  # fmt: skip
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(program).rstrip("\x00")
            if exc.status == 5:  # NVRTC_ERROR_INVALID_OPTION
                raise BuildError(
                    f"NVRTC refused the options {list(options)} for {arch}", log=log
                ) from exc
            raise BuildError(f"{name} does not compile for {arch}", log=log) from exc
        # NVRTC's log and PTX are C strings: drop the terminating NUL.
        log = nvrtc.getProgramLog(program).rstrip("\x00")
        return bytes(nvrtc.getPTX(program)).rstrip(b"\x00"), bytes(nvrtc.getCUBIN(program)), log
    finally:
        nvrtc.destroyProgram(program)


def finish_build(
    entry: str,
    language: Literal["cuda", "triton"],
    arch: str,
    options: tuple[str, ...],
    compiler: str,
    ptx: bytes,
    cubin: bytes,
    log: str,
    *,
    cached: bool,
) -> Build:
    """Check the entry is in the PTX and read its resources from the log."""
    text = ptx.decode("utf-8", errors="replace")
    entries = ptx_entries(text)
    if entry not in entries:
        found = ", ".join(entries) or "none"
        hint = (
            ' (declare it extern "C" so NVRTC does not mangle its name)'
            if language == "cuda"
            else ""
        )
        raise BuildError(
            f"entry '{entry}' is not a kernel in the compiled module{hint}; entries found: {found}",
            log=log,
        )
    return Build(
        entry=entry,
        language=language,
        arch=arch,
        options=options,
        compiler=compiler,
        ptx=ptx,
        cubin=cubin,
        log=log,
        resources=parse_ptxas_report(log, entry),
        cached=cached,
    )


# ------------------------------------------------------------------------ the cache


def kcert_home() -> Path:
    return Path(os.environ.get("KCERT_HOME") or Path.home() / ".kcert")


def cache_dir() -> Path:
    return kcert_home() / "cache" / "builds"


def load_cached(key: Digest) -> tuple[bytes, bytes, str] | None:
    """The stored (ptx, cubin, log) for ``key``, or None if absent or damaged."""
    folder = cache_dir() / key.hex
    try:
        meta = json.loads((folder / "meta.json").read_text("utf-8"))
        ptx = (folder / "kernel.ptx").read_bytes()
        cubin = (folder / "kernel.cubin").read_bytes()
        log = (folder / "compile.log").read_text("utf-8")
    except (OSError, ValueError):
        return None
    # A damaged entry is rebuilt rather than trusted.
    if (
        meta.get("ptx") != Digest.of_bytes(ptx).hex
        or meta.get("cubin") != Digest.of_bytes(cubin).hex
    ):
        return None
    return ptx, cubin, log


def store_cached(key: Digest, ptx: bytes, cubin: bytes, log: str) -> None:
    """Store a build; a cache that cannot be written only costs a recompile later."""
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        (staging / "kernel.ptx").write_bytes(ptx)
        (staging / "kernel.cubin").write_bytes(cubin)
        (staging / "compile.log").write_text(log, "utf-8")
        meta = {"ptx": Digest.of_bytes(ptx).hex, "cubin": Digest.of_bytes(cubin).hex}
        (staging / "meta.json").write_text(json.dumps(meta), "utf-8")
        try:
            # Rename is atomic: a concurrent reader sees the whole entry or none.
            staging.rename(root / key.hex)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError:
        return
