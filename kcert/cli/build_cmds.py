"""``kcert init`` and ``kcert lint``: scaffold a spec, then build and check the artifact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kcert.certify.build import DEFAULT_HW, arch_for_hw, check_arch
from kcert.certify.ci import KernelOutcome, check_targets, write_outputs
from kcert.certify.lint import LintReport, lint
from kcert.certify.report import Status
from kcert.certify.scaffold import scaffold
from kcert.certify.spec import resolve_kernels
from kcert.cli.app import EXIT_FAIL, EXIT_OK
from kcert.cli.ci_options import JUnitOption, SarifOption
from kcert.cli.output import emit_json, err_console, out_console

_LOG_LINES = 30


def _figure(report: LintReport, attribute: str) -> str:
    resources = report.resources
    return "-" if resources is None else str(getattr(resources, attribute))


def _show(reports: list[LintReport]) -> None:
    table = Table(title=f"kcert lint ({reports[0].arch})", title_justify="left")
    # Sizes are bytes; spills are ptxas' spill stores/loads, local is stack frame/local memory.
    for column in ("kernel", "registers", "spills st/ld", "stack/local", "shared", "verdict"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for report in reports:
        r = report.resources
        spills = "-" if r is None else f"{r.spill_stores}/{r.spill_loads}"
        local = "-" if r is None else f"{r.stack_bytes}/{r.local_bytes}"
        verdict = "[green]pass[/]" if report.ok else "[bold red]fail[/]"
        table.add_row(
            report.kernel,
            _figure(report, "registers"),
            spills,
            local,
            _figure(report, "shared_bytes"),
            verdict,
        )
    out_console.print(table)
    for report in reports:
        for check in report.checks:
            if check.status is Status.FAIL:
                out_console.print(
                    f"[bold red]{report.kernel}: {check.name} failed:[/] {escape(check.message)}",
                    markup=True,
                    soft_wrap=True,
                )
                log = str(check.details.get("log", "")).strip() if check.name == "build" else ""
                if log:
                    lines = log.splitlines()
                    shown = "\n".join(lines[:_LOG_LINES])
                    more = (
                        f"\n... {len(lines) - _LOG_LINES} more lines (see --json)"
                        if len(lines) > _LOG_LINES
                        else ""
                    )
                    out_console.print(shown + more, markup=False, highlight=False)
            elif check.status is Status.SKIP:
                err_console.print(
                    f"{report.kernel}: {check.name} skipped: {check.message}", markup=False
                )


def lint_command(
    path: Annotated[
        Path, typer.Argument(help="A kcert.toml (or its folder), or a kernel source beside one.")
    ],
    kernel: Annotated[str | None, typer.Option("--kernel", help="Lint only this kernel.")] = None,
    arch: Annotated[str | None, typer.Option("--arch", help="Target, e.g. sm_90.")] = None,
    hw: Annotated[str, typer.Option("--hw", help="Hardware class; picks the arch.")] = DEFAULT_HW,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    junit: JUnitOption = None,
    sarif: SarifOption = None,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="Compile without the sandbox: trusted code only.")] = False,
    allow_module_code: Annotated[bool, typer.Option(
        "--allow-module-code", help="Let a Triton module run module-level code, inside the "
        "sandbox.")] = False,
) -> None:
    """Build the kernel(s) and check registers, spills, memory and PTX patterns (no GPU)."""
    target = check_arch(arch) if arch else arch_for_hw(hw)
    kernels = resolve_kernels(path, kernel)
    outputs = {"junit": junit, "sarif": sarif}
    check_targets(outputs)
    reports, outcomes = [], []
    for spec in kernels:
        if not as_json:
            err_console.print(f"building {spec.name} for {target} ...", markup=False)
        started = time.monotonic()
        reports.append(lint(spec, arch=target, sandbox=not no_sandbox,
                            allow_module_code=allow_module_code))
        outcomes.append(KernelOutcome.linted(spec, reports[-1], time.monotonic() - started))
    write_outputs(outputs, outcomes, command="lint")
    ok = all(r.ok for r in reports)
    if as_json:
        emit_json(
            {
                "arch": target,
                "verdict": "pass" if ok else "fail",
                "kernels": [r.to_json() for r in reports],
            }
        )
    else:
        _show(reports)
    raise typer.Exit(EXIT_OK if ok else EXIT_FAIL)


def init_command(
    source: Annotated[Path, typer.Argument(help="The kernel source: .cu or .py (Triton).")],
    entry: Annotated[
        str | None, typer.Option("--entry", help="The kernel function, when there are several.")
    ] = None,
) -> None:
    """Add a kernel table, guessed from its signature, to the kcert.toml beside SOURCE."""
    result = scaffold(source, entry=entry)
    verb = "created" if result.created_spec else "appended to"
    err_console.print(f"{verb} {result.spec_path}: [[kernel]] '{result.name}'", markup=False)
    if result.reference_written:
        err_console.print(f"wrote a reference template: {result.reference_path}", markup=False)
    for note in result.notes:
        err_console.print(f"check: {note}", markup=False)
    err_console.print(
        f"next: fill in dims (and the reference), then run 'kcert lint {result.spec_path}'",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``init`` and ``lint`` to app."""
    app.command("init")(init_command)
    app.command("lint")(lint_command)
