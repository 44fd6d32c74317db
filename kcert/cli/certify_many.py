"""``kcert certify`` of a spec with several kernels: each one, a summary, one exit code.

Every kernel is certified in turn; one that cannot be (no GPU for CUDA C, a
sandbox missing, a module with code) is recorded as an error and the rest go
on. Only then, once no process that ran kernel code is alive, is the key read
and each passing kernel's report signed into ``OUT/KERNEL.cert.json`` (``OUT``
is ``--out``, default the working folder); a failing kernel is not signed.
The exit code is 2 if any kernel had an error, else 1 if any failed, else 0.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from kcert.certify.ci import KernelOutcome, write_outputs
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.spares import WorkerPool
from kcert.certify.spec import KernelSpec
from kcert.cli.app import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from kcert.cli.certify_cmds import _load_key, _sign, _summary
from kcert.cli.output import emit_json, err_console, out_console, progress
from kcert.errors import KcertError, UsageError

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold red"}


def certify_many(kernels: Sequence[KernelSpec], options: CertifyOptions, *, key: Path | None,
                 out: Path | None, as_json: bool,
                 outputs: Mapping[str, Path | None]) -> NoReturn:  # fmt: skip
    """Certify every kernel, write the CI outputs and certificates, and exit."""
    folder = out or Path.cwd()
    if out is not None and not out.is_dir():
        if out.exists():
            raise UsageError(f"--out {out}: with several kernels, name a folder")
        out.mkdir(parents=True)
    # one warm worker ahead while another kernel follows; the key is read only once the
    # pool is closed and every worker that ran kernel code is gone
    with WorkerPool(spares=1) as pool:
        outcomes = [_one(kernel, options, i, len(kernels), pool)
                    for i, kernel in enumerate(kernels, 1)]  # fmt: skip
    write_outputs(outputs, outcomes, command="certify")
    signed: dict[str, tuple[str, str]] = {}
    passing = [o for o in outcomes if o.verdict == "pass" and o.report is not None]
    if key is not None and passing:
        signing_key = _load_key(key)
        for outcome in passing:
            assert outcome.report is not None
            target = folder / f"{outcome.kernel.name}.cert.json"
            signed[outcome.kernel.name] = _sign(outcome.report, signing_key, target)
    if as_json:
        emit_json([_entry(o, signed.get(o.kernel.name)) for o in outcomes])
    else:
        _show(outcomes, signed, signing=key is not None)
    verdicts = {o.verdict for o in outcomes}
    code = EXIT_USAGE if "error" in verdicts else EXIT_FAIL if "fail" in verdicts else EXIT_OK
    raise typer.Exit(code)


def _one(kernel: KernelSpec, options: CertifyOptions, index: int, total: int,
         pool: WorkerPool) -> KernelOutcome:  # fmt: skip
    label = f"[{index}/{total}] {kernel.name}"
    started = time.monotonic()
    if index == total:
        pool.spares = 0  # nothing follows the last kernel: no worker ahead
    try:
        with progress(f"certifying {label}") as step:
            report = certify(kernel, options, progress=step, pool=pool)
    except KcertError as exc:
        err_console.print(f"{label}: error: {exc.diagnostics()}", markup=False, soft_wrap=True)
        return KernelOutcome.failed(kernel, exc, time.monotonic() - started)
    outcome = KernelOutcome.certified(kernel, report, time.monotonic() - started)
    err_console.print(f"{label}: {outcome.verdict} ({outcome.duration_s:.1f} s)", markup=False)
    return outcome


def _entry(outcome: KernelOutcome, signed: tuple[str, str] | None) -> dict[str, Any]:
    certificate, certificate_id = signed if signed is not None else (None, None)
    if outcome.report is None:
        return {"kernel": outcome.kernel.name, "verdict": "error",
                "error": {"type": outcome.error_kind, "detail": outcome.error},
                "certificate": None, "certificate_id": None,
                "time_s": round(outcome.duration_s, 3)}  # fmt: skip
    return _summary(outcome.report, certificate, certificate_id) | {
        "time_s": round(outcome.duration_s, 3)}


def _show(outcomes: Sequence[KernelOutcome], signed: Mapping[str, tuple[str, str]], *,
          signing: bool) -> None:  # fmt: skip
    table = Table(title=f"kcert certify: {len(outcomes)} kernels", title_justify="left")
    for column in ("kernel", "verdict", "failing checks", "time"):
        table.add_column(column, overflow="fold", justify="right" if column == "time" else "left")
    for o in outcomes:
        failing = ", ".join(c.name for c in o.failing()) or ("-" if o.error is None else "")
        if o.error is not None:
            failing = f"(error: {o.error_kind})"
        table.add_row(escape(o.kernel.name), f"[{_STYLE[o.verdict]}]{o.verdict}[/]",
                      escape(failing), f"{o.duration_s:.1f} s")  # fmt: skip
    out_console.print(table)
    for o in outcomes:
        if o.verdict != "pass":
            out_console.print(f"{o.kernel.name}:", markup=False)
            for line in o.failure_text().splitlines():
                out_console.print(f"  {line}", markup=False, soft_wrap=True)
    for name, (path, certificate_id) in signed.items():
        out_console.print(f"certificate for {name}: {path} ({certificate_id})", markup=False)
    if signing and len(signed) < len(outcomes):
        out_console.print("kernels that did not pass were not signed", markup=False)
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("pass", "fail", "error")}
    out_console.print(", ".join(f"{n} {v}" for v, n in counts.items() if n), markup=False)
