"""Lint: build a kernel and hold the artifact to its spec's ``[kernel.artifact]`` limits.

Two named checks come out, as in a certificate: ``build`` (it compiles, the
entry exists, and for CUDA C the entry's parameters match the spec's args)
and ``artifact`` (registers, spills, local and shared memory, required and
forbidden PTX substrings). Nothing here needs a GPU.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

from kcert.certify.build import Build, build_cuda, ptx_param_sizes
from kcert.certify.entry import check_entry
from kcert.certify.errors import BuildError, SpecError
from kcert.certify.feedback import compiler_error
from kcert.certify.interpreter import static_hazards
from kcert.certify.module_check import check_module
from kcert.certify.report import CheckResult, Resources, Status
from kcert.certify.spec import BufferArg, KernelSpec, NoneArg, ScalarArg
from kcert.certify.triton_build import build_triton_sets, const_sets

_DTYPE_BYTES = {
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "u8": 1,
    "u16": 2,
    "u32": 4,
    "u64": 8,
    "bool": 1,
}
_POINTER_BYTES = 8
_MAX_DIM_COMBINATIONS = 4096


@dataclass(frozen=True, slots=True)
class LintReport:
    kernel: str
    language: str
    arch: str
    #: One build for CUDA C; one per distinct const assignment for Triton.
    builds: tuple[Build, ...]
    checks: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return not any(c.required and c.status is Status.FAIL for c in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    @property
    def resources(self) -> Resources | None:
        """The worst figure of each kind over all builds (one build for CUDA C)."""
        found = [b.resources for b in self.builds if b.resources is not None]
        if not found:
            return None
        return Resources(
            **{f.name: max(getattr(r, f.name) for r in found) for f in fields(Resources)}
        )

    def to_json(self) -> dict[str, Any]:
        resources = self.resources
        return {
            "kernel": self.kernel,
            "language": self.language,
            "arch": self.arch,
            "verdict": "pass" if self.ok else "fail",
            "resources": resources.to_json() if resources else None,
            "builds": [b.record().to_json() for b in self.builds],
            "checks": [c.to_json() for c in self.checks],
        }


def lint(
    kernel: KernelSpec, *, arch: str, sandbox: bool = True, allow_module_code: bool = False
) -> LintReport:  # fmt: skip
    """Build ``kernel`` for ``arch`` and check the artifact against the spec's limits.

    The compiles run in sandboxed children (``sandbox=False`` only for trusted code).
    A Triton module must be kernels and literal constants only
    (:func:`~kcert.certify.module_check.check_module`, before anything imports it)
    unless ``allow_module_code``; it raises
    :class:`~kcert.certify.errors.ModuleCodeError` otherwise.
    """
    check_entry(kernel)  # a spec error (exit 2), not a failed build
    if kernel.language == "triton" and not allow_module_code:
        check_module(kernel.code.main.data, kernel.code.main.name)
    try:
        builds = _builds(kernel, arch, sandbox)
    except BuildError as exc:
        failed = _failed_build(kernel, exc)
        skipped = CheckResult("artifact", Status.SKIP, "not checked: the build failed")
        return LintReport(kernel.name, kernel.language, arch, (), (failed, skipped))
    return LintReport(
        kernel.name,
        kernel.language,
        arch,
        builds,
        (_build_check(kernel, builds), _artifact_check(kernel, builds)),
    )


def _failed_build(kernel: KernelSpec, exc: BuildError) -> CheckResult:
    """The failed ``build`` check, with the compiler's own error at its source line."""
    details: dict[str, Any] = {"log": exc.log}
    message = exc.message
    located = compiler_error(exc.log, kernel.code.main.data, kernel.code.main.name)
    if located is not None:
        details["compiler_error"] = located.to_json()
        where = f" at {located.file}:{located.line}" if located.line is not None else ""
        message += f": {located.error}{where}"
    return CheckResult("build", Status.FAIL, message, details=details)


def _builds(kernel: KernelSpec, arch: str, sandbox: bool) -> tuple[Build, ...]:
    if kernel.language == "cuda":
        return (build_cuda(kernel, arch=arch, sandbox=sandbox),)
    return build_triton_sets(kernel, arch=arch, const_sets=const_sets(kernel), sandbox=sandbox)


def _build_check(kernel: KernelSpec, builds: tuple[Build, ...]) -> CheckResult:
    details = {
        "compiler": builds[0].compiler,
        "log": builds[0].log.strip(),
        "cached": all(b.cached for b in builds),
    }
    if kernel.language == "cuda":
        problem = _parameter_mismatch(kernel, builds[0])
        if problem:
            return CheckResult("build", Status.FAIL, problem, details=details)
    what = f"{len(builds)} const assignment(s)" if kernel.language == "triton" else "the source"
    message = (f"{builds[0].compiler} compiled {what} for {builds[0].arch}; "
               f"entry '{kernel.entry}' found")  # fmt: skip
    hazards = static_hazards(kernel)
    if hazards:
        # the compiled kernel is fine; its run under the interpreter may not be
        details["interpreter_hazards"] = [h.to_json() for h in hazards]
        message += "; differs under the Triton interpreter: " + "; ".join(
            f"{h.message}{f' (line {h.line})' if h.line else ''}" for h in hazards)
    return CheckResult("build", Status.PASS, message, details=details)


def _parameter_mismatch(kernel: KernelSpec, build: Build) -> str | None:
    """A spec whose args disagree with the entry's parameters would launch garbage."""
    sizes = ptx_param_sizes(build.ptx_text, kernel.entry)
    if sizes is None:
        return None
    if len(sizes) != len(kernel.args):
        return (
            f"'{kernel.entry}' takes {len(sizes)} parameter(s) but [kernel.args] lists "
            f"{len(kernel.args)}: list every parameter, in order"
        )
    for arg, size in zip(kernel.args, sizes, strict=True):
        if isinstance(arg, BufferArg | NoneArg):
            expected, what = _POINTER_BYTES, "a pointer"
        elif isinstance(arg, ScalarArg):
            expected, what = _DTYPE_BYTES[arg.dtype], f"a {arg.dtype} scalar"
        else:
            return f"args.{arg.name}: 'const' is for Triton kernels; CUDA C has no constexpr args"
        if size != expected:
            return (
                f"args.{arg.name} is {what} ({expected} bytes) but parameter "
                f"{kernel.args.index(arg)} of '{kernel.entry}' is {size} bytes"
            )
    return None


def _artifact_check(kernel: KernelSpec, builds: tuple[Build, ...]) -> CheckResult:
    limits = kernel.artifact
    dynamic_shared = _max_dynamic_shared(kernel) if kernel.language == "cuda" else 0
    problems: list[str] = []
    per_build: list[dict[str, Any]] = []
    for build in builds:
        where = f" [{', '.join(build.options[1:])}]" if kernel.language == "triton" else ""
        found = _violations(build, limits_of=kernel, dynamic_shared=dynamic_shared)
        problems.extend(p + where for p in found)
        per_build.append(
            {
                "options": list(build.options),
                "resources": build.resources.to_json() if build.resources else None,
            }
        )
    details = {
        "limits": {
            "max_registers": limits.max_registers,
            "max_spills": limits.max_spills,
            "max_local_bytes": limits.max_local_bytes,
            "max_shared_bytes": limits.max_shared_bytes,
            "required": list(limits.required),
            "forbidden": list(limits.forbidden),
        },
        "dynamic_shared_bytes": dynamic_shared,
        "builds": per_build,
        "violations": problems,
    }
    if problems:
        return CheckResult(
            "artifact", Status.FAIL, "; ".join(dict.fromkeys(problems)), details=details
        )
    return CheckResult("artifact", Status.PASS, _summary(builds), details=details)


def _violations(build: Build, *, limits_of: KernelSpec, dynamic_shared: int) -> list[str]:
    limits = limits_of.artifact
    problems: list[str] = []
    r = build.resources
    if r is None:
        if any(
            v is not None
            for v in (
                limits.max_registers,
                limits.max_spills,
                limits.max_local_bytes,
                limits.max_shared_bytes,
            )
        ):
            problems.append(
                "ptxas reported no resources for the entry, so the limits cannot be checked"
            )
    else:
        figures = (
            ("registers", r.registers, limits.max_registers, "max_registers"),
            ("spills", r.spill_stores + r.spill_loads, limits.max_spills, "max_spills"),
            ("local memory", r.local_bytes, limits.max_local_bytes, "max_local_bytes"),
            (
                "shared memory",
                r.shared_bytes + dynamic_shared,
                limits.max_shared_bytes,
                "max_shared_bytes",
            ),
        )
        for what, figure, limit, key in figures:
            if limit is not None and figure > limit:
                unit = "" if what == "registers" else " bytes"
                problems.append(f"{what} {figure}{unit} > {key} = {limit}")
    ptx = build.ptx_text
    problems.extend(f"PTX lacks required '{s}'" for s in limits.required if s not in ptx)
    problems.extend(f"PTX contains forbidden '{s}'" for s in limits.forbidden if s in ptx)
    return problems


def _summary(builds: tuple[Build, ...]) -> str:
    parts = []
    for build in builds:
        r = build.resources
        if r is None:
            parts.append("no resource report")
            continue
        parts.append(
            f"{r.registers} registers, {r.spill_stores + r.spill_loads} bytes spilled, "
            f"{r.local_bytes} bytes local, {r.shared_bytes} bytes shared"
        )
    return "within limits: " + "; ".join(dict.fromkeys(parts))


def _max_dynamic_shared(kernel: KernelSpec) -> int:
    """The most dynamic shared memory any combination of dims launches with."""
    if not kernel.shared_mem.names():
        return kernel.shared_mem.evaluate_int({})
    names = list(kernel.dims)
    best = 0
    combos = itertools.product(*(kernel.dims[n] for n in names))
    for combo in itertools.islice(combos, _MAX_DIM_COMBINATIONS):
        try:
            best = max(best, kernel.bind(dict(zip(names, combo, strict=True))).shared_mem)
        except SpecError:
            continue
    return best
