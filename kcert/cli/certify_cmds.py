"""``kcert certify``: run the whole check catalogue and, with ``--key``, sign the result.

One kernel is shown here; a spec with several goes to :mod:`kcert.cli.certify_many`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from kcert.certify.ci import KernelOutcome, check_targets, write_outputs
from kcert.certify.deadline import WALL_CEILING_FACTOR
from kcert.certify.execution import EXECUTORS
from kcert.certify.pipeline import DEFAULT_DEADLINE_S, CertifyOptions, certify
from kcert.certify.report import CertificationReport, Status, Verdict
from kcert.certify.sanitizer import parse_tools
from kcert.certify.spares import WorkerPool
from kcert.certify.spec import resolve_kernels
from kcert.cli.app import EXIT_FAIL, EXIT_OK
from kcert.cli.ci_options import JUnitOption, SarifOption
from kcert.cli.output import emit_json, err_console, out_console, progress
from kcert.errors import UsageError

_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow"}


def certify_command(
    path: Annotated[Path, typer.Argument(
        help="A kcert.toml (or its folder), or a kernel source beside one.")],
    kernel: Annotated[str | None, typer.Option(
        "--kernel", help="Which [[kernel]] (default: every one the spec or source has).")] = None,
    executor: Annotated[str, typer.Option(
        "--executor", help="auto, cuda, triton or triton-interpreter (the CPU).")] = "auto",
    hw: Annotated[str | None, typer.Option(
        "--hw", help="Hardware class to certify for; must match the device (cpu: interpreter).",
    )] = None,
    key: Annotated[Path | None, typer.Option(
        "--key", help="Ed25519 private key: sign the report into a certificate. Without "
        "it the checks run and are shown, and nothing is written.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Where to write the certificate (needs --key; default: "
        "KERNEL.cert.json); with several kernels, a folder for each passing one's "
        "KERNEL.cert.json.")] = None,
    max_probes: Annotated[int | None, typer.Option(
        "--max-probes", min=1, help="Cap the fixed probe set (default: the spec's).")] = None,
    deadline: Annotated[float, typer.Option(
        "--deadline", min=0.1, help="CPU seconds one launch may use before it counts as a hang "
        f"(machine load does not use them up); one that waits without computing is stopped "
        f"at {WALL_CEILING_FACTOR:g} times this in wall time.",
    )] = DEFAULT_DEADLINE_S,
    sanitize: Annotated[str | None, typer.Option(
        "--sanitize", metavar="TOOLS",
        help="Also run a probe or two under compute-sanitizer tools (CUDA C on a GPU), e.g. "
             "memcheck,racecheck,initcheck; their findings go into the certificate.",
    )] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object (a list of them for several kernels).")] = False,
    junit: JUnitOption = None,
    sarif: SarifOption = None,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="Run kernel code without the sandbox: trusted code only "
        "(recorded; a registry refuses such certificates by default).")] = False,
    allow_module_code: Annotated[bool, typer.Option(
        "--allow-module-code", help="Let a Triton module run module-level code, inside the "
        "sandbox (recorded in the certificate).")] = False,
) -> None:  # fmt: skip
    """Certify a kernel: probes, sandboxed runs, every check; sign with --key."""
    if executor != "auto" and executor not in EXECUTORS:
        raise UsageError(f"unknown executor '{executor}'; pick one of auto, {', '.join(EXECUTORS)}")
    if out is not None and key is None:
        raise UsageError("--out writes a signed certificate: give the signing key with --key")
    kernels = resolve_kernels(path, kernel)
    if key is not None and not key.is_file():
        raise UsageError(f"--key {key}: no such file")
    outputs = {"junit": junit, "sarif": sarif}
    check_targets(outputs)
    tools = parse_tools(sanitize) if sanitize is not None else ()
    options = CertifyOptions(executor=executor, hw=hw, max_probes=max_probes, deadline_s=deadline,
                             sandbox=not no_sandbox, allow_module_code=allow_module_code,
                             sanitize=tools)  # fmt: skip
    if len(kernels) > 1:
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.cli.certify_many import certify_many

        certify_many(kernels, options, key=key, out=out, as_json=as_json, outputs=outputs)
    spec = kernels[0]
    started = time.monotonic()
    # the key is read last, once the pool is closed: no process that ran kernel code is alive
    with WorkerPool() as pool, progress(f"certifying {spec.name}") as step:
        report = certify(spec, options, progress=step, pool=pool)
    write_outputs(outputs, [KernelOutcome.certified(spec, report, time.monotonic() - started)],
                  command="certify")  # fmt: skip
    signing_key = _load_key(key) if key is not None else None
    certificate: str | None = None
    certificate_id: str | None = None
    if signing_key is not None:
        target = out or Path(f"{spec.name}.cert.json")
        certificate, certificate_id = _sign(report, signing_key, target)
    if as_json:
        emit_json(_summary(report, certificate, certificate_id))
    else:
        _show(report, certificate, certificate_id)
    if signing_key is None:
        # An unsigned report vouches for nothing, so none is written; say so, or a user
        # looks for KERNEL.cert.json that --out's help names.
        err_console.print("no certificate written: no --key given (sign with --key KEY; "
                          f"it goes to --out, default {spec.name}.cert.json)", markup=False,
                          soft_wrap=True)  # fmt: skip
    raise typer.Exit(EXIT_OK if report.verdict is Verdict.PASS else EXIT_FAIL)


def _load_key(path: Path) -> Any:
    try:
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.attest.keys import load_private_key
    except ImportError as exc:  # pragma: no cover - the attest package ships with kcert
        raise UsageError(f"signing is not available: {exc}") from exc
    return load_private_key(path)


def _sign(report: CertificationReport, key: Any, path: Path) -> tuple[str, str]:
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.attest.certificate import certificate_id, sign_report, write_certificate

    envelope = sign_report(report, key)
    write_certificate(path, envelope)
    return str(path), str(certificate_id(envelope))


def _summary(report: CertificationReport, certificate: str | None,
             certificate_id: str | None) -> dict[str, Any]:  # fmt: skip
    return {
        "kernel": report.kernel.name,
        "verdict": str(report.verdict),
        "executor": report.executor,
        "hw_class": report.hw_class,
        "fingerprint": report.fingerprint,
        "fresh_seed": report.fresh_seed,
        "probes": len(report.probes),
        "checks": [{"name": c.name, "status": str(c.status), "probe": c.probe,
                    "message": c.message, "required": c.required} for c in report.checks],
        "minimized": {name: dict(dims) for name, dims in report.minimized.items()},
        "minimize_stopped": dict(report.minimize_stopped),
        "scope_notes": [n.to_json() for n in report.scope_notes],
        "shape_scope": {k: dict(v) for k, v in (report.shape_scope or {}).items()},
        "largest_elements": report.largest_elements,
        "certificate": certificate,
        "certificate_id": certificate_id,
        # what a refine loop feeds back to the model: failures, smallest shapes, compiler errors
        "feedback": report.feedback(),
    }  # fmt: skip


def _show(report: CertificationReport, certificate: str | None, certificate_id: str | None) -> None:
    title = (f"kcert certify {report.kernel.name} ({report.executor}, hw {report.hw_class}, "
             f"{len(report.probes)} probes, fresh seed {report.fresh_seed})")  # fmt: skip
    table = Table(title=title, title_justify="left")
    for column in ("check", "status", "probe", "message"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        style = _STYLE[check.status]
        # the whole message, wrapped: a cut one loses the expected value and the error
        table.add_row(check.name, f"[{style}]{check.status}[/]", escape(check.probe or "-"),
                      escape(check.message))  # fmt: skip
    out_console.print(table)
    for name, dims in report.minimized.items():
        shape = ", ".join(f"{k}={v}" for k, v in dims.items())
        out_console.print(f"smallest failing shape for {name}: {shape}", markup=False)
        if name in report.minimize_stopped:
            out_console.print(f"  (minimization stopped early: {report.minimize_stopped[name]})",
                              markup=False)  # fmt: skip
    for note in report.scope_notes:
        out_console.print(f"not covered ({note.kind}): {note.message}", markup=False)
    for name, scope in (report.shape_scope or {}).items():
        if scope["min"] is not None:
            out_console.print(f"sizes probed for {name}: {scope['min']} to {scope['max']} "
                              f"({len(scope['listed'])} listed, {len(scope['drawn'])} drawn)",
                              markup=False)  # fmt: skip
    if report.largest_elements is not None:
        out_console.print(f"largest buffer probed: {report.largest_elements} elements",
                          markup=False)  # fmt: skip
    verdict = report.verdict
    if verdict is Verdict.FAIL:
        out_console.print("")
        out_console.print(report.feedback(), markup=False, highlight=False, soft_wrap=True)
        out_console.print("")
    style = "green" if verdict is Verdict.PASS else "bold red"
    out_console.print(f"verdict: [{style}]{verdict}[/]")
    if certificate is not None:
        out_console.print(f"certificate: {escape(certificate)} ({certificate_id})")


def register(app: typer.Typer) -> None:
    """Add ``certify`` to app."""
    app.command("certify")(certify_command)
