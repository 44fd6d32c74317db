"""Triton sources: load the ``@triton.jit`` entry and compile it to PTX without a GPU.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)``) with no
driver present, and ships its own ``ptxas``; running that ``ptxas -v`` over the
PTX gives the same resource report NVRTC gives for CUDA C. A Triton kernel's
``tl.constexpr`` parameters are part of what gets compiled, so one build is
made per distinct assignment of the spec's consts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from kcert.certify.build import (
    Build,
    BuildError,
    CompilerUnavailable,
    check_arch,
    finish_build,
    load_cached,
    store_cached,
)
from kcert.certify.spec import BufferArg, ConstArg, KernelSpec, ScalarArg, SpecError
from kcert.digest import Digest
from kcert.errors import KcertError

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
        import triton
    except Exception as exc:  # not installed, or a broken install
        raise CompilerUnavailable(
            f"Triton cannot be imported ({exc}); install kcert[triton] to work with .py kernels"
        ) from exc
    return triton


def _import_module(kernel: KernelSpec) -> ModuleType:
    name = f"kcert_kernel_{Digest.of_bytes(str(kernel.source).encode()).hex[:16]}"
    spec = importlib.util.spec_from_file_location(name, kernel.source)
    if spec is None or spec.loader is None:
        raise BuildError(f"{kernel.source} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module is arbitrary code; any failure is theirs
        sys.modules.pop(name, None)
        raise BuildError(
            f"{kernel.source.name} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def load_triton_entry(kernel: KernelSpec) -> Any:
    """Import the kernel's module and return its ``@triton.jit`` entry function."""
    triton = _triton()
    module = _import_module(kernel)
    fn = getattr(module, kernel.entry, None)
    if fn is None:
        raise BuildError(f"{kernel.source.name} has no function '{kernel.entry}'")
    jit_types: tuple[type, ...] = (triton.runtime.jit.JITFunction,)
    try:
        from triton.runtime.interpreter import InterpretedFunction

        jit_types = (*jit_types, InterpretedFunction)
    except ImportError:  # older Triton without the interpreter module
        pass
    if not isinstance(fn, jit_types):
        raise BuildError(
            f"'{kernel.entry}' in {kernel.source.name} is not a @triton.jit "
            "function (an @autotune or @heuristics wrapper is not supported)"
        )
    return fn


def _jit_function(fn: Any) -> Any:
    """A compilable JITFunction, also when TRITON_INTERPRET=1 made ``fn`` an interpreted one."""
    triton = _triton()
    if isinstance(fn, triton.runtime.jit.JITFunction):
        return fn
    return triton.runtime.jit.JITFunction(fn.fn)


def check_arguments(kernel: KernelSpec, fn: Any) -> None:
    """The spec must list the function's parameters, by name and in order."""
    params = list(fn.arg_names)
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


def const_sets(kernel: KernelSpec) -> list[dict[str, int]]:
    """Distinct const assignments over the dims' values (at most :data:`MAX_CONST_SETS`).

    The largest dims are visited first, so a cap keeps the assignments most
    likely to stress registers.
    """
    if not any(isinstance(a, ConstArg) for a in kernel.args):
        return [{}]
    names = list(kernel.dims)
    values = [sorted(kernel.dims[n], reverse=True) for n in names]
    found: list[dict[str, int]] = []
    for combo in itertools.islice(itertools.product(*values), _MAX_DIM_COMBINATIONS):
        try:
            consts = dict(kernel.bind(dict(zip(names, combo, strict=True))).consts)
        except SpecError:
            continue  # a combination the launch rejects is not built either
        if consts not in found:
            found.append(consts)
            if len(found) == MAX_CONST_SETS:
                break
    if not found:
        raise kernel.error("dims", "no combination of dims gives a valid launch")
    return found


def _signature(kernel: KernelSpec, consts: Mapping[str, int]) -> dict[str, str]:
    signature: dict[str, str] = {}
    for arg in kernel.args:
        if isinstance(arg, BufferArg):
            signature[arg.name] = "*" + _TRITON_TYPES[arg.dtype]
        elif isinstance(arg, ScalarArg):
            signature[arg.name] = _TRITON_TYPES[arg.dtype]
        else:
            signature[arg.name] = "constexpr"
    return signature


def build_triton(
    kernel: KernelSpec, *, arch: str, consts: Mapping[str, int], use_cache: bool = True
) -> Build:
    """Compile a Triton kernel for ``arch`` with one assignment of its consts."""
    if kernel.language != "triton":
        raise BuildError(f"kernel '{kernel.name}' is {kernel.language}, not Triton")
    triton = _triton()
    cc = int(re.sub(r"\D", "", check_arch(arch)))
    loaded = load_triton_entry(kernel)
    check_arguments(kernel, loaded)
    if _interpreter_loaded(triton):
        return _build_in_child(kernel, arch=arch, consts=consts, use_cache=use_cache)
    fn = _jit_function(loaded)
    num_warps = kernel.num_warps or _DEFAULT_NUM_WARPS
    signature = _signature(kernel, consts)
    options = (f"num_warps={num_warps}", *(f"{k}={v}" for k, v in sorted(consts.items())))
    compiler = f"triton {triton.__version__}"
    key = Digest.of_json(
        {
            "format": 1,
            "language": "triton",
            "compiler": compiler,
            "arch": arch,
            "options": list(options),
            "signature": signature,
            "function": fn.cache_key,
            "source": Digest.of_file(kernel.source).hex,
        }
    )
    stored = load_cached(key) if use_cache else None
    if stored is not None:
        ptx, cubin, log = stored
        return _with_dynamic_shared(
            finish_build(
                kernel.entry, "triton", arch, options, compiler, ptx, cubin, log, cached=True
            )
        )
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature=signature, constexprs=dict(consts))
    try:
        with warnings.catch_warnings(), _compiling(triton):
            # Triton 3.9 warns about a default it is about to change; not the user's concern.
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION")
            compiled = triton.compile(
                source, target=GPUTarget("cuda", cc, 32), options={"num_warps": num_warps}
            )
    except Exception as exc:  # Triton raises many types for a kernel it cannot compile
        raise BuildError(
            f"{kernel.source.name}: Triton cannot compile '{kernel.entry}' for "
            f"{arch} with {', '.join(options)}",
            log=str(exc),
        ) from exc
    ptx = compiled.asm["ptx"]
    ptx_bytes = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    cubin = bytes(compiled.asm["cubin"])
    log = _ptxas_report(ptx_bytes, cc)
    # Triton allocates its shared memory dynamically at launch, so ptxas never sees it;
    # the log records it (and the cache keeps it) as a line of its own.
    log += f"\n{_SHARED_NOTE} {int(compiled.metadata.shared)} bytes\n"
    if use_cache:
        store_cached(key, ptx_bytes, cubin, log)
    return _with_dynamic_shared(
        finish_build(
            kernel.entry, "triton", arch, options, compiler, ptx_bytes, cubin, log, cached=False
        )
    )


def _interpreter_loaded(triton: Any) -> bool:
    """Whether ``triton.language`` was imported with TRITON_INTERPRET=1.

    Its own helpers (``tl.max``, ...) are then interpreter functions, which
    cannot be compiled; only a fresh process without the variable can.
    """
    return type(getattr(triton.language.standard, "max", None)).__name__ == "InterpretedFunction"


def _build_in_child(
    kernel: KernelSpec, *, arch: str, consts: Mapping[str, int], use_cache: bool
) -> Build:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    request = {"spec": str(kernel.spec_path), "kernel": kernel.name, "arch": arch,
               "consts": dict(consts), "use_cache": use_cache}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kcert-triton-build-") as tmp:
        out = Path(tmp)
        code = "import sys; from kcert.certify.triton_build import _child; _child(sys.argv[1:])"
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, json.dumps(request), str(out)],
                env=env, capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompilerUnavailable(f"cannot run a Triton build process: {exc}") from exc
        result_path = out / "result.json"
        if done.returncode != 0 or not result_path.is_file():
            raise BuildError("the Triton build process failed", log=done.stderr[-4000:])
        result = json.loads(result_path.read_text("utf-8"))
        if "error" in result:
            raise BuildError(result["error"], log=result.get("log", ""))
        return _with_dynamic_shared(finish_build(
            kernel.entry, "triton", arch, tuple(result["options"]), result["compiler"],
            (out / "kernel.ptx").read_bytes(), (out / "kernel.cubin").read_bytes(),
            (out / "compile.log").read_text("utf-8"), cached=bool(result["cached"]),
        ))  # fmt: skip


def _child(argv: list[str]) -> None:
    """Entry point of :func:`_build_in_child`'s process: build, write the results to a folder."""
    from kcert.certify.spec import load_spec

    request, out = json.loads(argv[0]), Path(argv[1])
    try:
        kernel = load_spec(Path(request["spec"])).kernel(request["kernel"])
        build = build_triton(kernel, arch=request["arch"], consts=request["consts"],
                             use_cache=request["use_cache"])  # fmt: skip
    except KcertError as exc:
        log = exc.log if isinstance(exc, BuildError) else ""
        message = exc.message if isinstance(exc, BuildError) else exc.diagnostics()
        (out / "result.json").write_text(json.dumps({"error": message, "log": log}), "utf-8")
        return
    (out / "kernel.ptx").write_bytes(build.ptx)
    (out / "kernel.cubin").write_bytes(build.cubin)
    (out / "compile.log").write_text(build.log, "utf-8")
    result = {"options": list(build.options), "compiler": build.compiler, "cached": build.cached}
    (out / "result.json").write_text(json.dumps(result), "utf-8")


@contextlib.contextmanager
def _compiling(triton: Any) -> Iterator[None]:
    """Compile as for a GPU even where TRITON_INTERPRET=1 is set for running on the CPU.

    In interpreter mode Triton's constexpr helpers return plain Python values,
    which the code generator cannot use; lint compiles with the mode off.
    """
    runtime = triton.knobs.runtime
    with runtime.scope():
        runtime.interpret = False
        yield


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
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(cc).path
    except Exception as exc:  # a Triton without a bundled ptxas
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
