"""``kcert perf ingest|compare`` and ``kcert target policy``: what a target sees after promotion."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import ValidationError

from kcert.cli.output import emit_json, err_console, out_console
from kcert.cli.registry_cmds import (
    JsonOption,
    KernelOption,
    RegistryOption,
    TargetOption,
    _dump,
    _kernel,
    _registry,
    target_app,
)
from kcert.errors import UsageError
from kcert.registry.observation_models import PerfIngest, TargetPolicyUpdate
from kcert.registry.traces import DEFAULT_CATEGORIES, chrome_trace_samples, jsonl_samples

perf_app = typer.Typer(name="perf", help="Kernel latency on a target: ingest traces, compare.",
                       no_args_is_help=True)  # fmt: skip

#: Trace files read at most (a trace of a few hundred thousand events).
MAX_TRACE_BYTES = 512 * 1024 * 1024


def ingest_command(
    file: Annotated[Path, typer.Argument(help="A torch.profiler Chrome trace (JSON) or JSONL of "
                                         "{name, start_us, dur_us}.")],
    target: TargetOption,
    kernel: KernelOption,
    fmt: Annotated[
        Literal["auto", "chrome", "jsonl"],
        typer.Option("--format", help="auto: .jsonl is JSONL, anything else a Chrome trace."),
    ] = "auto",
    category: Annotated[
        list[str] | None,
        typer.Option("--category", help="Chrome trace event categories that count "
                     f"(repeatable; default {', '.join(DEFAULT_CATEGORIES)}; a CPU-only torch "
                     "records cpu_op)."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Only events whose name matches this regex.")
    ] = None,
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """Store a trace's kernel durations as latency samples of KERNEL on TARGET."""
    try:
        if file.stat().st_size > MAX_TRACE_BYTES:
            raise UsageError(f"{file} is over {MAX_TRACE_BYTES} bytes")
        data = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from exc
    jsonl = fmt == "jsonl" or (fmt == "auto" and file.suffix == ".jsonl")
    if jsonl and category:
        raise UsageError("--category applies to Chrome traces, not JSONL")
    samples = (
        jsonl_samples(data, name=name)
        if jsonl
        else chrome_trace_samples(data, categories=category or DEFAULT_CATEGORIES, name=name)
    )
    try:
        ingest = PerfIngest(kernel=str(_kernel(kernel)), target=target, samples=samples)
    except ValidationError as exc:
        raise UsageError(f"cannot ingest: {exc.errors()[0]['msg']}") from None
    with _registry(registry) as reg:
        stored = reg.ingest_perf(ingest)
    if as_json:
        emit_json(_dump(stored))
        return
    state = "already ingested" if stored.duplicate else f"stored {stored.stored} sample(s)"
    out_console.print(f"{state} of {stored.kernel} on {stored.target}", markup=False)


def compare_command(
    target: TargetOption,
    before: Annotated[str, typer.Option("--before", help="The kernel before the change.")],
    after: Annotated[str, typer.Option("--after", help="The kernel after the change.")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="Bootstrap seed.")] = 0,
    resamples: Annotated[
        int, typer.Option("--resamples", min=10, max=10_000, help="Bootstrap rounds.")
    ] = 1000,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Also write a self-contained page: both latency CDFs on a "
                     "log axis with p50/p95/p99 and their intervals."),
    ] = None,
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """p50/p95/p99 of two kernels on TARGET with 95% bootstrap intervals, and the change."""
    with _registry(registry) as reg:
        result = reg.compare_perf(target=target, before=_kernel(before), after=_kernel(after),
                                  seed=seed, resamples=resamples)  # fmt: skip
    if html is not None:
        from kcert.registry.perf_html import render_perf_html  # lazy: only --html draws

        try:
            html.write_text(render_perf_html(result), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {html}: {exc.strerror or exc}") from exc
        err_console.print(f"wrote {html}", markup=False)
    if as_json:
        emit_json(_dump(result))
        return
    pct = int(round(result.confidence * 100))
    out_console.print(
        f"target {result.target}: before {result.before.kernel} ({result.before.samples} "
        f"samples), after {result.after.kernel} ({result.after.samples} samples)",
        markup=False, soft_wrap=True,
    )  # fmt: skip
    out_console.print(f"{'':5} {'before (us)':>30} {'after (us)':>30} {'change':>26}",
                      markup=False)  # fmt: skip
    for b, a, c in zip(result.before.percentiles, result.after.percentiles, result.changes,
                       strict=True):  # fmt: skip
        out_console.print(
            f"p{b.q:<4g} {_ci(b.value_us, b.low_us, b.high_us):>30} "
            f"{_ci(a.value_us, a.low_us, a.high_us):>30} "
            f"{_ci(c.change_pct, c.low_pct, c.high_pct, pct=True):>26}",
            markup=False,
        )
    err_console.print(f"intervals: {pct}% bootstrap, {result.resamples} rounds, seed "
                      f"{result.seed}")  # fmt: skip


def _ci(value: float, low: float, high: float, *, pct: bool = False) -> str:
    if pct:
        return f"{value:+.1f}% [{low:+.1f}, {high:+.1f}]"
    return f"{_us(value)} [{_us(low)}, {_us(high)}]"


def _us(value: float) -> str:
    return f"{value:.1f}" if abs(value) < 1e6 else f"{value:.3g}"


def policy_command(
    name: Annotated[str, typer.Argument(help="Target name.")],
    on_mismatch: Annotated[
        Literal["record", "suspend"],
        typer.Option("--on-mismatch", help="What a confirmed runtime mismatch does: record it, "
                     "or also suspend the kernel's promotion on this target."),
    ] = "record",
    max_p99: Annotated[
        float | None,
        typer.Option("--max-p99-regression-pct", min=0, help="Deny a promotion "
                     "whose canary p99 is this much slower than the kernel it replaces."),
    ] = None,
    min_samples: Annotated[
        int, typer.Option("--min-samples", min=1, help="Samples each kernel needs for that.")
    ] = 30,
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """Set a target's runtime policy (logged)."""
    update = TargetPolicyUpdate(on_mismatch=on_mismatch, max_p99_regression_pct=max_p99,
                                min_samples=min_samples)  # fmt: skip
    with _registry(registry) as reg:
        policy = reg.set_target_policy(name, update)
    if as_json:
        emit_json(_dump(policy))
        return
    limit = (f"p99 regression at most {policy.max_p99_regression_pct:g}% with "
             f"{policy.min_samples} samples" if policy.max_p99_regression_pct is not None
             else "no latency limit")  # fmt: skip
    out_console.print(f"target {policy.target}: on mismatch {policy.on_mismatch}; {limit} "
                      f"(log entry {policy.log_index})", markup=False)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add ``perf`` to app and ``policy`` to ``target``."""
    perf_app.command("ingest")(ingest_command)
    perf_app.command("compare")(compare_command)
    target_app.command("policy")(policy_command)
    app.add_typer(perf_app)
