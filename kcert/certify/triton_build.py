"""Triton sources: load the ``@triton.jit`` entry and compile it to PTX without a GPU.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)``) with no
driver present, and ships its own ``ptxas``; running that ``ptxas -v`` over the
PTX gives the same resource report NVRTC gives for CUDA C. A Triton kernel's
``tl.constexpr`` parameters are part of what gets compiled, so one build is
made per distinct assignment of the spec's consts.

Importing the module and compiling happen only in a sandboxed child
(:func:`compile_triton`, called by :mod:`kcert.certify.worker`'s build mode);
this process computes cache keys from the source's bytes, checks what the
child reports and caches it (:func:`build_triton_sets`).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import subprocess
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kcert.certify.build import Build, check_arch, finish_build, load_cached, store_cached
from kcert.certify.build_child import RawBuild, build_in_child
from kcert.certify.errors import BuildError, CompilerUnavailable, SpecError
from kcert.certify.executors.base import Fault, import_code
from kcert.certify.spec import BufferArg, ConstArg, ConstValue, KernelSpec, NoneArg, ScalarArg
from kcert.digest import Digest

_TRITON_TYPES = {
    "f16": "fp16",
    "bf16": "bf16",
    "f32": "fp32",
    "f64": "fp64",
    "i8": "i8",
    "i16": "i16",
    "i32": "i32",
    "i64": "i64",
    "u8": "u8",
    "u16": "u16",
    "u32": "u32",
    "u64": "u64",
    "bool": "i1",
}
_DEFAULT_NUM_WARPS = 4
_SHARED_NOTE = "kcert info    : Triton dynamic shared memory at launch:"
#: Enough distinct const assignments to cover real specs without compiling forever.
MAX_CONST_SETS = 8
_MAX_DIM_COMBINATIONS = 4096


def _triton() -> Any:
    try:
        # lazy: Triton is optional (kcert[triton]) and slow to import
        import triton
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:  # missing or broken
        raise CompilerUnavailable(
            f"Triton cannot be imported ({exc}); install kcert[triton] to work with .py kernels"
        ) from exc
    return triton


def load_entry(kernel: KernelSpec) -> Any:
    """Import the module from the spec's bytes and return its ``@triton.jit`` entry (child only)."""
    triton = _triton()
    try:
        module = import_code(kernel.code.main, f"kcert_kernel_{kernel.name}")
    except Fault as exc:
        raise BuildError(f"{kernel.code.main.name} does not import: {exc.message}") from exc
    fn = getattr(module, kernel.entry, None)
    if fn is None:
        raise BuildError(f"{kernel.code.main.name} has no function '{kernel.entry}'")
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise BuildError(
            f"'{kernel.entry}' in {kernel.code.main.name} is not a @triton.jit "
            "function (an @autotune or @heuristics wrapper is not supported)"
        )
    return fn


def check_arguments(kernel: KernelSpec, params: Sequence[str]) -> None:
    """The spec must list the function's parameters, by name and in order."""
    params = list(params)
    listed = [a.name for a in kernel.args]
    if params == listed:
        return
    missing = [p for p in params if p not in listed]
    extra = [a for a in listed if a not in params]
    detail = []
    if missing:
        detail.append(f"missing {', '.join(missing)}")
    if extra:
        detail.append(f"not parameters of {kernel.entry}: {', '.join(extra)}")
    if not detail:
        detail.append(f"order differs; {kernel.entry} takes ({', '.join(params)})")
    raise kernel.error(
        "args", f"must list the parameters of {kernel.entry} in order: {'; '.join(detail)}"
    )


def const_sets(kernel: KernelSpec) -> list[dict[str, ConstValue]]:
    """Distinct const assignments over the dims' values (at most :data:`MAX_CONST_SETS`).

    The largest dims are visited first, so a cap keeps the assignments most
    likely to stress registers.
    """
    if not any(isinstance(a, ConstArg) for a in kernel.args):
        return [{}]
    names = list(kernel.dims)
    values = [sorted(kernel.dims[n], reverse=True) for n in names]
    found: list[dict[str, ConstValue]] = []
    first: SpecError | None = None  # why the first rejected combination was, for the error
    for combo in itertools.islice(itertools.product(*values), _MAX_DIM_COMBINATIONS):
        try:
            consts = dict(kernel.bind(dict(zip(names, combo, strict=True))).consts)
        except SpecError as exc:
            first = first or exc
            continue  # a combination the launch rejects is not built either
        if consts not in found:
            found.append(consts)
            if len(found) == MAX_CONST_SETS:
                break
    if not found:
        cause = f"; the first fails {first.message}" if first is not None else ""
        key = first.key if first is not None and first.key is not None else "dims"
        raise kernel.error(key, f"no combination of dims gives a valid launch{cause}")
    return found


def _signature(kernel: KernelSpec, consts: Mapping[str, ConstValue]) -> dict[str, str]:
    signature: dict[str, str] = {}
    for arg in kernel.args:
        if isinstance(arg, BufferArg):
            signature[arg.name] = "*" + _TRITON_TYPES[arg.dtype]
        elif isinstance(arg, ScalarArg):
            signature[arg.name] = _TRITON_TYPES[arg.dtype]
        else:
            signature[arg.name] = "constexpr"
    return signature


def _cache_key(kernel: KernelSpec, arch: str,
               consts: Mapping[str, ConstValue]) -> tuple[Digest, str, tuple[str, ...]]:
    triton = _triton()
    num_warps = kernel.num_warps or _DEFAULT_NUM_WARPS
    options = (f"num_warps={num_warps}", *(f"{k}={v}" for k, v in sorted(consts.items())))
    compiler = f"triton {triton.__version__}"
    key = Digest.of_json({
        "format": 2, "language": "triton", "compiler": compiler, "arch": arch,
        "options": list(options), "signature": _signature(kernel, consts),
        "entry": kernel.entry, "source": kernel.code.digest.hex,
    })  # fmt: skip
    return key, compiler, options


def build_triton_sets(
    kernel: KernelSpec, *, arch: str, const_sets: Sequence[Mapping[str, ConstValue]],
    use_cache: bool = True, sandbox: bool = True,
) -> tuple[Build, ...]:  # fmt: skip
    """Compile a Triton kernel for ``arch`` once per const assignment, in one sandboxed child."""
    if kernel.language != "triton":
        raise BuildError(f"kernel '{kernel.name}' is {kernel.language}, not Triton")
    check_arch(arch)
    keys = [_cache_key(kernel, arch, consts) for consts in const_sets]
    stored = [load_cached(key) if use_cache else None for key, _, _ in keys]
    missing = [consts for consts, hit in zip(const_sets, stored, strict=True) if hit is None]
    fresh: list[RawBuild] = []
    if missing:
        try:
            child = build_in_child(kernel, arch=arch, const_sets=missing, sandbox=sandbox)
        except BuildError as exc:
            if exc.arg_names is not None:
                check_arguments(kernel, exc.arg_names)  # a wrong spec says so, not "no compile"
            raise
        check_arguments(kernel, child.arg_names or ())
        if len(child.builds) != len(missing):
            raise BuildError("the build process answered for the wrong number of builds")
        fresh = list(child.builds)
    builds: list[Build] = []
    for (key, compiler, options), hit in zip(keys, stored, strict=True):
        if hit is None:
            raw = fresh.pop(0)
            ptx, cubin, log = raw.ptx, raw.cubin, raw.log
            if use_cache:
                store_cached(key, ptx, cubin, log)
        else:
            ptx, cubin, log = hit
        builds.append(_with_dynamic_shared(finish_build(
            kernel.entry, "triton", arch, options, compiler, ptx, cubin, log,
            cached=hit is not None)))  # fmt: skip
    return tuple(builds)


def compile_triton(
    kernel: KernelSpec, fn: Any, arch: str, const_sets: Sequence[Mapping[str, ConstValue]]
) -> list[RawBuild]:
    """Compile the entry ``fn`` (from :func:`load_entry`) for each const set (build child only)."""
    triton = _triton()
    cc = int(re.sub(r"\D", "", check_arch(arch)))
    # lazy: Triton is optional (kcert[triton]) and slow to import
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    builds = []
    for consts in const_sets:
        _, compiler, options = _cache_key(kernel, arch, consts)
        num_warps = kernel.num_warps or _DEFAULT_NUM_WARPS
        # an unused pointer (``none``) is compiled as Triton compiles a None argument: a constexpr
        constexprs: dict[str, Any] = {**consts, **{a.name: None for a in kernel.args
                                                   if isinstance(a, NoneArg)}}  # fmt: skip
        source = ASTSource(fn=fn, signature=_signature(kernel, consts), constexprs=constexprs)
        try:
            with warnings.catch_warnings():
                # Triton 3.9 warns about a default it is about to change; not the user's concern.
                warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION")
                compiled = triton.compile(source, target=GPUTarget("cuda", cc, 32),
                                          options={"num_warps": num_warps})  # fmt: skip
        except Exception as exc:  # Triton raises many types for a kernel it cannot compile
            raise BuildError(
                f"{kernel.code.main.name}: Triton cannot compile '{kernel.entry}' for "
                f"{arch} with {', '.join(options)}",
                log=str(exc),
            ) from exc
        ptx = compiled.asm["ptx"]
        ptx_bytes = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
        log = _ptxas_report(ptx_bytes, cc)
        # Triton allocates its shared memory dynamically at launch, so ptxas never sees it;
        # the log records it (and the cache keeps it) as a line of its own.
        log += f"\n{_SHARED_NOTE} {int(compiled.metadata.shared)} bytes\n"
        builds.append(RawBuild(options, compiler, ptx_bytes, bytes(compiled.asm["cubin"]), log))
    return builds


def _with_dynamic_shared(build: Build) -> Build:
    match = re.search(re.escape(_SHARED_NOTE) + r" (\d+) bytes", build.log)
    if match is None or build.resources is None:
        return build
    shared = build.resources.shared_bytes + int(match.group(1))
    return dataclasses.replace(
        build, resources=dataclasses.replace(build.resources, shared_bytes=shared)
    )


def _ptxas_report(ptx: bytes, cc: int) -> str:
    """Run the ``ptxas`` Triton itself used, with ``-v``, over the PTX for the resource report."""
    try:
        # lazy: Triton is optional (kcert[triton]) and slow to import
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(cc).path
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:  # no bundled ptxas
        raise CompilerUnavailable(f"Triton's ptxas is not available: {exc}") from exc
    target = re.search(rb"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    if target is None:
        raise BuildError("Triton produced PTX without a .target line")
    with tempfile.TemporaryDirectory(prefix="kcert-ptxas-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_bytes(ptx)
        try:
            done = subprocess.run(
                [
                    ptxas,
                    "-v",
                    f"--gpu-name={target.group(1).decode()}",
                    str(src),
                    "-o",
                    str(Path(tmp) / "kernel.cubin"),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompilerUnavailable(f"cannot run {ptxas}: {exc}") from exc
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise BuildError("ptxas rejected the PTX Triton produced", log=log)
    return log
