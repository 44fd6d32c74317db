"""The certify pipeline: from a kernel spec to a :class:`CertificationReport`.

Order of work: pick the executor and read the environment (``--hw`` is
checked against the device before anything runs), build and lint, load the
reference, build the fixed and fresh probes, run each probe twice in the
sandbox (:mod:`kcert.certify.checks` says why twice), check on the host,
minimize what failed, time what passed, and assemble the report. Nothing here
prints: progress goes through a callback the front end supplies.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import kcert
from kcert.certify import jail, spares
from kcert.certify.anchors import anchor
from kcert.certify.checks import ProbeEvidence, evaluate, make_job, timed_output_error
from kcert.certify.conditions import SCHEME, RunConditions, draw_conditions, stale_seed
from kcert.certify.entry import check_entry
from kcert.certify.errors import SpecError
from kcert.certify.execution import RunJob, RunOutcome, RunStatus
from kcert.certify.executors.base import host_dtype
from kcert.certify.interpreter import blame, fail_build_on_bool_ops, static_hazards
from kcert.certify.minimize import Budget, Stop, search
from kcert.certify.probe_checks import (
    PROBE_CHECK_NAMES,
    PROBE_CHECKS,
    Correctness,
    Finding,
    ProbeCheck,
)  # fmt: skip
from kcert.certify.probes import (
    Probe,
    derive_seed,
    draw_seed,
    fixed_probes,
    fresh_probes,
    make_inputs,
    make_probe,
    value_families,
)  # fmt: skip
from kcert.certify.reference import Reference
from kcert.certify.report import (
    CHECK_NAMES,
    BuildRecord,
    CertificationReport,
    CheckResult,
    ErrorMetrics,
    KernelIdentity,
    ProbeRecord,
    Status,
    TimingReport,
)  # fmt: skip
from kcert.certify.scope import domain_note, scope_notes
from kcert.certify.sizes import largest_elements, shape_scope
from kcert.certify.spec import KernelSpec
from kcert.certify.tolerance import Allowance, allowances
from kcert.errors import KcertError

DEFAULT_DEADLINE_S = 60.0
#: Probe runs that minimization may spend, over all failing checks together.
MINIMIZE_RUNS = 40

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CertifyOptions:
    executor: str = "auto"
    hw: str | None = None
    max_probes: int | None = None
    deadline_s: float = DEFAULT_DEADLINE_S
    #: Fixed only in tests; a real certification draws it (and records it).
    fresh_seed: int | None = None
    minimize: bool = True
    timing: bool = True
    #: Run every build and launch inside kcert.certify.jail; False only for trusted code.
    sandbox: bool = True
    #: Let a Triton module run module-level code (inside the sandbox); recorded.
    allow_module_code: bool = False
    #: compute-sanitizer tools to run a probe or two under (``sanitizer`` check); none: skipped.
    sanitize: tuple[str, ...] = ()


@dataclass
class _ProbeOutcome:
    probe: Probe
    record: ProbeRecord | None = None
    findings: dict[str, Finding] = field(default_factory=dict)
    launch: RunOutcome | None = None  # the failed run, when one failed


def certify(kernel: KernelSpec, options: CertifyOptions | None = None,
            progress: Progress | None = None, *,
            pool: spares.WorkerPool | None = None) -> CertificationReport:  # fmt: skip
    """Certify ``kernel``; raise :class:`~kcert.errors.KcertError` for bad input or environment.

    The sandboxes take their workers from ``pool``, which the caller closes; without
    one, a pool of this call's own is closed before it returns, so that no worker
    outlives it.
    """
    say = progress or (lambda _: None)
    if pool is not None:
        return _Certifier(kernel, options or CertifyOptions(), say, pool).run()
    with spares.WorkerPool() as own:
        return _Certifier(kernel, options or CertifyOptions(), say, own).run()


class _Certifier:
    def __init__(self, kernel: KernelSpec, options: CertifyOptions, progress: Progress,
                 pool: spares.WorkerPool) -> None:  # fmt: skip
        self.kernel, self.options, self.say, self.pool = kernel, options, progress, pool

    # ------------------------------------------------------------------ the whole run

    def run(self) -> CertificationReport:
        # lazy: kcert.certify.sandbox imports this module back (a cycle inside the package)
        from kcert.certify.environment import check_hw_class, collect_environment
        from kcert.certify.sandbox import check_executor, default_executor

        kernel, options = self.kernel, self.options
        # a typo in ``entry`` is the spec's mistake (exit 2), never a failed build to sign
        check_entry(kernel)
        executor = default_executor(kernel) if options.executor == "auto" else options.executor
        check_executor(kernel, executor)
        self.confinement = jail.confinement(
            sandbox=options.sandbox, gpu=executor in spares.GPU_KINDS,
            module_code=options.allow_module_code)  # fmt: skip
        self.say(f"executor {executor}; reading the environment")
        env = collect_environment(executor)
        hw_class = check_hw_class(options.hw, env.device) if options.hw else env.hw_class
        # the sandbox's worker imports torch or CuPy (seconds) while we build and probe; only a
        # build that fails (or a reference that does not load) leaves it unused
        self.pool.prefetch(executor, sandbox=options.sandbox)
        self.executor = executor
        build_checks, build, build_record = self._build(executor)
        self.say("loading the reference")
        self.reference = Reference(kernel)
        probe_set = fixed_probes(kernel, max_probes=options.max_probes)
        fresh_seed = options.fresh_seed if options.fresh_seed is not None else draw_seed()
        # every probe's buffer contents and addresses are drawn from it too (conditions.py)
        self.fresh_seed = fresh_seed
        fresh = fresh_probes(kernel, fresh_seed)
        checks: list[CheckResult] = list(build_checks)
        records: list[ProbeRecord] = []
        minimized: dict[str, dict[str, int]] = {}
        self.minimize_stopped: dict[str, str] = {}
        timing_check: CheckResult
        timing_report: TimingReport
        if any(c.status is Status.FAIL for c in build_checks if c.name == "build"):
            reason = "not run: the build failed"
            checks += [CheckResult(n, Status.SKIP, reason) for n in (
                "launch", *PROBE_CHECK_NAMES, "fresh-probes")]
            timing_check, timing_report = _skipped_timing(reason)
            checks.append(_sanitizer_skipped(reason) if options.sanitize else _sanitizer_skipped())
        else:
            # lazy: kcert.certify.sandbox imports this module back (a cycle inside the package)
            from kcert.certify.sandbox import Sandbox

            arch = build.arch if build is not None else None
            with Sandbox(kernel, executor, deadline_s=options.deadline_s, arch=arch,
                         build=build, sandbox=options.sandbox,
                         pool=self.pool) as self.sandbox:  # fmt: skip
                fixed = self._run_all(probe_set.probes, "fixed")
                fresh_outcomes = self._run_all(fresh, "fresh") if _clean(fixed) else []
                records = [o.record for o in (*fixed, *fresh_outcomes) if o.record is not None]
                checks += self._aggregate(fixed, fresh_outcomes, fresh_seed, probe_set.uncovered)
                if options.minimize:
                    minimized = self._minimize(fixed, fresh_outcomes, fresh_seed)
                timing_check, timing_report = self._timing(checks, fixed)
            checks.append(self._sanitize(executor, build, probe_set.probes))
        checks.append(timing_check)
        # a failure that matches a known difference of the interpreter says so
        checks = blame(checks, static_hazards(kernel), executor)
        order = {name: i for i, name in enumerate(CHECK_NAMES)}
        checks.sort(key=lambda c: order.get(c.name, len(order)))
        identity = KernelIdentity(
            name=kernel.name, entry=kernel.entry, language=kernel.language,
            source_name=kernel.code.main.name, source_digest=str(kernel.code.digest),
            spec_digest=str(kernel.digest), reference_digest=str(self.reference.digest),
            build=build_record,
        )  # fmt: skip
        return CertificationReport(
            kernel=identity, executor=executor, hw_class=hw_class, environment=dict(env.fields),
            fingerprint=str(env.fingerprint()), fresh_seed=fresh_seed, probes=tuple(records),
            checks=tuple(checks), timing=timing_report, minimized=minimized,
            minimize_stopped=self.minimize_stopped,
            scope_notes=scope_notes(kernel, executor) + domain_note(kernel),
            certifier_version=kcert.__version__,
            issued_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            confinement=self.confinement.to_json(), value_families=value_families(kernel),
            shape_scope=shape_scope(kernel, [r.dims for r in records]), conditions=SCHEME,
            largest_elements=largest_elements(kernel, [r.dims for r in records]),
        )  # fmt: skip

    # ------------------------------------------------------------------ build

    def _build(self, executor: str) -> tuple[list[CheckResult], Any, BuildRecord | None]:
        """``build`` and ``artifact`` checks from lint; the CUDA build the sandbox runs."""
        # lazy: kcert.certify.lint imports this module back (a cycle inside the package)
        from kcert.certify.build import DEFAULT_HW, arch_for_hw
        from kcert.certify.errors import BuildError, CompilerUnavailable
        from kcert.certify.lint import lint

        if executor == "cuda" or executor == "triton":
            # lazy: kcert.certify.sandbox imports this module back (a cycle inside the package)
            from kcert.certify.sandbox import device_arch

            arch = device_arch()
        else:
            arch = arch_for_hw(DEFAULT_HW)
        self.say(f"building for {arch} and checking the artifact")
        try:
            report = lint(self.kernel, arch=arch, sandbox=self.options.sandbox,
                          allow_module_code=self.options.allow_module_code)  # fmt: skip
        except (CompilerUnavailable, BuildError) as exc:
            if executor == "cuda":
                raise
            reason = f"not checked: {exc.diagnostics()}"
            skipped = [CheckResult("build", Status.SKIP, reason, required=False),
                       CheckResult("artifact", Status.SKIP, reason, required=False)]
            return fail_build_on_bool_ops(skipped, static_hazards(self.kernel),
                                          executor), None, None  # fmt: skip
        checks = list(report.checks)
        if self.kernel.language == "triton" and self.options.allow_module_code:
            # Triton's compiler ran in the process the module's code ran in: the PTX and
            # its figures are what that code let through
            checks = [_note(c, " (self-reported: the module's own code ran in the compiler's "
                            "process, --allow-module-code)") for c in checks]  # fmt: skip
        if executor == "triton-interpreter":
            # the interpreter runs the Python source; the GPU build is linted, not certified
            checks = [_note(c, f" (linted for {arch}; the interpreter ran the source)")
                      for c in checks]  # fmt: skip
            return fail_build_on_bool_ops(checks, static_hazards(self.kernel),
                                          executor), None, None  # fmt: skip
        build = report.builds[0] if report.builds else None
        record = build.record() if build is not None and len(report.builds) == 1 else None
        return checks, (build if executor == "cuda" else None), record

    # ------------------------------------------------------------------ probes

    def _run_all(self, probes: tuple[Probe, ...], kind: str) -> list[_ProbeOutcome]:
        outcomes: list[_ProbeOutcome] = []
        for i, probe in enumerate(probes, 1):
            self.say(f"{kind} probe {i}/{len(probes)}: {probe.id}")
            outcome = self._run_probe(probe)
            outcomes.append(outcome)
            if outcome.launch is not None and outcome.launch.status is RunStatus.TIMEOUT:
                # each further hang costs a whole deadline; the verdict is already fail
                self.say("stopping after a timeout")
                break
        return outcomes

    def _expected(
        self, probe: Probe, inputs: Mapping[str, np.ndarray[Any, Any]],
    ) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, Allowance]]:  # fmt: skip
        """The reference's outputs rounded to each output's dtype, and their tolerances."""
        launch = probe.launch
        expected = self.reference(inputs, launch, probe=probe.id)

        def call(values: Mapping[str, np.ndarray[Any, Any]]) -> Mapping[str, np.ndarray[Any, Any]]:
            return self.reference(values, launch, probe=probe.id)

        def call_float32(
            values: Mapping[str, np.ndarray[Any, Any]],
        ) -> tuple[Mapping[str, np.ndarray[Any, Any]], bool]:  # fmt: skip
            return self.reference.call_float32(values, launch, probe=probe.id)

        bounds = allowances(self.kernel, call, inputs, expected, probe.dims,
                            float32=call_float32)  # fmt: skip
        rounded = {o.name: _round(expected[o.name], o.dtype) for o in self.kernel.outputs}
        return rounded, dict(bounds)

    def _stale(self, probe: Probe, cond: RunConditions) -> dict[str, np.ndarray[Any, Any]]:
        """What an earlier call left in the outputs: the answers for another draw of inputs."""
        earlier = dataclasses.replace(probe, seed=stale_seed(cond))
        answers = self.reference(make_inputs(self.kernel, earlier), probe.launch,
                                 probe=f"{probe.id} (stale fill)")  # fmt: skip
        return {o.name: _round(answers[o.name], o.dtype) for o in self.kernel.outputs}

    def _run_probe(self, probe: Probe) -> _ProbeOutcome:
        kernel, launch = self.kernel, probe.launch
        inputs = make_inputs(kernel, probe)
        rounded, bounds = self._expected(probe, inputs)
        runs = draw_conditions(self.fresh_seed, probe.id)
        stale = self._stale(probe, runs["B"])
        job_a = make_job(kernel, launch, inputs, "A", runs=runs, stale=stale, answer=rounded)
        run_a = self.sandbox.run(job_a)
        if not run_a.ok:
            return _ProbeOutcome(probe, launch=run_a)
        job_b = make_job(kernel, launch, inputs, "B", runs=runs, stale=stale, answer=rounded)
        run_b = self.sandbox.run(job_b)
        if not run_b.ok:
            return _ProbeOutcome(probe, launch=run_b)
        result = evaluate(ProbeEvidence(kernel, job_a, job_b, run_a.buffers, run_b.buffers,
                                        rounded, bounds))  # fmt: skip
        record = ProbeRecord(
            id=probe.id, kind=probe.kind, seed=probe.seed, dims=dict(probe.dims),
            inputs={k: str(anchor(v)) for k, v in inputs.items()},
            reference={k: str(anchor(v)) for k, v in rounded.items()},
            outputs={k: str(anchor(v)) for k, v in result.outputs.items()},
            metrics=result.metrics,
            conditions={run: c.to_json([b.name for b in kernel.buffers])
                        for run, c in runs.items()},  # fmt: skip
        )  # fmt: skip
        return _ProbeOutcome(probe, record, result.findings)

    # ------------------------------------------------------------------ verdicts

    def _aggregate(self, fixed: list[_ProbeOutcome], fresh: list[_ProbeOutcome], fresh_seed: int,
                   uncovered: Mapping[str, tuple[int, ...]]) -> list[CheckResult]:  # fmt: skip
        checks = [_launch_check(fixed + fresh)]
        ran = [o for o in fixed if o.record is not None]
        for check in PROBE_CHECKS:
            checks.append(_probe_check(check, ran, len(fixed), uncovered))
        checks.append(_fresh_check(fresh, fresh_seed, clean=_clean(fixed)))
        return checks

    # ------------------------------------------------------------------ minimization

    def _minimize(self, fixed: list[_ProbeOutcome], fresh: list[_ProbeOutcome],
                  fresh_seed: int) -> dict[str, dict[str, int]]:  # fmt: skip
        """The smallest failing dims of each failing check, within one shared budget."""
        budget = Budget(MINIMIZE_RUNS)
        smallest: dict[str, dict[str, int]] = {}

        def shrink(name: str, start: Probe, fails: Callable[[_ProbeOutcome], bool],
                   kind: str = "fixed") -> None:  # fmt: skip
            self.say(f"minimizing the {name} failure of {start.id}")

            def predicate(dims: Mapping[str, int]) -> bool:
                try:
                    probe = make_probe(self.kernel, dims)
                    if kind == "fresh":  # fresh inputs again, derived from the recorded seed
                        probe = make_probe(self.kernel, dims, kind="fresh", prefix="fresh:",
                                           seed=derive_seed(fresh_seed, probe.id))  # fmt: skip
                except SpecError:
                    return False  # the spec cannot launch at these dims: not a smaller failure
                if probe.elements > self.kernel.probes.max_elements:
                    return False
                try:
                    return fails(self._run_probe(probe))
                except KcertError as exc:
                    # the reference (or a tolerance it feeds) cannot answer here: what was
                    # already found stands, and the report says why the search ended
                    raise Stop(f"stopped at {probe.id}: {exc.diagnostics()}") from exc

            found = search(start.dims, self.kernel.dims, predicate, budget=budget)
            smallest[name] = found.dims
            if found.stopped is not None:
                self.minimize_stopped[name] = found.stopped

        for check in PROBE_CHECKS:
            failing = next((o for o in fixed if check.name in o.findings), None)
            if failing is not None:
                shrink(check.name, failing.probe, _fails_check(check.name))
        crashed = next((o for o in fixed if o.launch is not None), None)
        if crashed is not None and crashed.launch is not None:
            # a hang costs a whole deadline per try: only crashes and errors are shrunk
            if crashed.launch.status is not RunStatus.TIMEOUT:
                shrink("launch", crashed.probe, lambda o: o.launch is not None)
        bad_fresh = next((o for o in fresh if o.launch is not None or o.findings), None)
        if bad_fresh is not None:
            shrink("fresh-probes", bad_fresh.probe,
                   lambda o: o.launch is not None or bool(o.findings), kind="fresh")
        return smallest

    # ------------------------------------------------------------------ compute-sanitizer

    def _sanitize(self, executor: str, build: Any, probes: tuple[Probe, ...]) -> CheckResult:
        """The ``sanitizer`` check: a probe or two again under each compute-sanitizer tool."""
        # lazy: kcert.certify.sandbox imports this module back (a cycle inside the package)
        from kcert.certify import sanitizer
        from kcert.certify.sandbox import Sandbox

        tools = self.options.sanitize
        if not tools:
            return sanitizer.not_asked()
        path, reason = sanitizer.availability(executor)
        if path is None:
            return sanitizer.skipped(reason or "compute-sanitizer cannot run here")
        chosen = [probes[i] for i in sanitizer.pick_probes([p.elements for p in probes])]
        jobs = [make_job(self.kernel, p.launch, make_inputs(self.kernel, p), "A",
                         runs=draw_conditions(self.fresh_seed, p.id)) for p in chosen]  # fmt: skip
        deadline_s = self.options.deadline_s * sanitizer.SLOWDOWN

        def run_probes(wrapper: tuple[str, ...], share: Path) -> list[str]:
            failures: list[str] = []
            with Sandbox(self.kernel, executor, deadline_s=deadline_s, build=build,
                         wrapper=wrapper, share=share, sandbox=self.options.sandbox,
                         pool=self.pool) as box:  # fmt: skip
                for probe, job in zip(chosen, jobs, strict=True):
                    outcome = box.run(job)
                    if not outcome.ok:
                        failures.append(f"{probe.id}: {outcome.status}: {outcome.message[:500]}")
                        if outcome.status is RunStatus.TIMEOUT:
                            break
            return failures

        self.say(f"running {len(chosen)} probe(s) under compute-sanitizer ({', '.join(tools)})")
        return sanitizer.sanitizer_check(tools, path, run_probes, [p.id for p in chosen])

    # ------------------------------------------------------------------ timing

    def _timing(self, checks: list[CheckResult],
                fixed: list[_ProbeOutcome]) -> tuple[CheckResult, TimingReport]:  # fmt: skip
        if self.executor == "triton-interpreter":
            return _skipped_timing("the Triton interpreter runs on the CPU: its times say "
                                   "nothing about the kernel on a GPU")  # fmt: skip
        if not self.options.timing:
            return _skipped_timing("timing was not asked for")
        failed = [c.name for c in checks if c.status is Status.FAIL and c.required]
        if failed:
            return _skipped_timing(f"not timed: the kernel failed {', '.join(failed)}")
        # lazy: timing and the sanitizer load only when a run gets that far
        from kcert.certify import timing

        ran = [o for o in fixed if o.record is not None]
        if not ran:
            return _skipped_timing("not timed: no probe ran")
        largest = max(ran, key=lambda o: o.probe.elements).probe
        self.say(f"timing on {largest.id}")
        inputs = make_inputs(self.kernel, largest)
        job = make_job(self.kernel, largest.launch, inputs, "A",
                       runs=draw_conditions(self.fresh_seed, largest.id))  # fmt: skip
        if self.kernel.baseline is not None:
            # the baseline's worker imports while the kernel is timed
            self.pool.prefetch(self.executor, sandbox=self.options.sandbox)
        try:
            kernel_time = self.sandbox.time(job, "kernel",
                                            check=self._timed_output_check(largest, inputs, job))
        except timing.TimedOutputError as exc:
            wrong = exc.__cause__ if exc.__cause__ is not None else exc
            check = CheckResult("timing", Status.FAIL, f"the output of the last timed run is "
                                f"wrong: {wrong}; the timed work was not the kernel's real work",
                                largest.id)  # fmt: skip
            return check, TimingReport(timing.METHOD, None, None, None, None,
                                       skipped_reason=check.message)  # fmt: skip
        if isinstance(kernel_time, RunOutcome):
            check = CheckResult("timing", Status.FAIL, f"timing the kernel failed: "
                                f"{kernel_time.status}: {kernel_time.message}", largest.id)
            return check, TimingReport(timing.METHOD, None, None, None, None,
                                       skipped_reason=check.message)  # fmt: skip
        # the kernel's sandbox ends before the baseline runs: nothing it started (a process
        # spinning on the CPU or the GPU) is left to slow the baseline down
        self.sandbox.close()
        baseline = None
        if self.kernel.baseline is not None:
            # lazy: kcert.certify.sandbox imports this module back (a cycle inside the package)
            from kcert.certify.sandbox import Sandbox

            # a worker of its own, which never loads the kernel
            with Sandbox(self.kernel, self.executor, deadline_s=self.options.deadline_s,
                         sandbox=self.options.sandbox, mode="baseline",
                         pool=self.pool) as other:  # fmt: skip
                result = other.time(job, "baseline")
            baseline = None if isinstance(result, RunOutcome) else result
        # A device that cannot tell its peak bandwidth gets no bound (the check says so); any
        # other failure here must not switch the physically-impossible-speed check off quietly.
        try:
            lower_bound, moved = timing.launch_lower_bound(self.kernel, largest.launch)
        except (timing.TimingError, RuntimeError, ValueError, ArithmeticError,
                LookupError) as exc:  # fmt: skip
            check = CheckResult("timing", Status.FAIL, f"the memory-traffic lower bound could "
                                f"not be computed, so the time cannot be judged: {exc!r}",
                                largest.id)  # fmt: skip
            return check, TimingReport(timing.METHOD, kernel_time, baseline, None, None,
                                       skipped_reason=check.message)  # fmt: skip
        check, report = timing.timing_outcome(kernel_time, baseline, lower_bound_ms=lower_bound,
                                              bytes_moved=moved)  # fmt: skip
        return _with_probe(check, largest.id), report

    def _timed_output_check(
        self, probe: Probe, inputs: Mapping[str, np.ndarray[Any, Any]], job: RunJob,
    ) -> Callable[[Mapping[str, np.ndarray[Any, Any]]], None]:  # fmt: skip
        """Raises when the last timed run's output is not the reference's answer."""
        rounded, bounds = self._expected(probe, inputs)

        def check(got: Mapping[str, np.ndarray[Any, Any]]) -> None:
            error = timed_output_error(self.kernel, job, got, rounded, bounds)
            if error is not None:
                raise _TimedOutputWrong(error)

        return check


class _TimedOutputWrong(Exception):
    """The last timed run's output, checked in the parent, is not the reference's answer."""


# ---------------------------------------------------------------------------- helpers


def _round(values: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """The reference answer in the output's dtype (what a perfect kernel would store)."""
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(host_dtype(dtype))


def _fails_check(name: str) -> Callable[[_ProbeOutcome], bool]:
    return lambda outcome: name in outcome.findings


def _clean(outcomes: list[_ProbeOutcome]) -> bool:
    return all(o.launch is None and not o.findings for o in outcomes)


def _launch_check(outcomes: list[_ProbeOutcome]) -> CheckResult:
    failed = [o for o in outcomes if o.launch is not None]
    if not failed:
        return CheckResult("launch", Status.PASS, f"{len(outcomes)} probe(s) launched twice each, "
                           "all completed")  # fmt: skip
    first = failed[0]
    assert first.launch is not None
    statuses = sorted({str(o.launch.status) for o in failed if o.launch is not None})
    return CheckResult(
        "launch", Status.FAIL,
        f"{first.launch.status} on probe {first.probe.id}: {first.launch.message.strip()}",
        first.probe.id,
        details={"failed_probes": [o.probe.id for o in failed], "statuses": statuses},
    )  # fmt: skip


def _probe_check(check: ProbeCheck, ran: list[_ProbeOutcome], total: int,
                 uncovered: Mapping[str, tuple[int, ...]]) -> CheckResult:  # fmt: skip
    name = check.name
    if not ran:
        return CheckResult(name, Status.SKIP, "not evaluated: no probe ran to completion")
    failing = [o for o in ran if name in o.findings]
    details: dict[str, Any] = {"probes": len(ran)}
    if uncovered:
        details["uncovered_dim_values"] = {k: list(v) for k, v in uncovered.items()}
    if isinstance(check, Correctness):
        details["worst"] = _worst_metrics(ran)
    if failing:
        first = failing[0]
        finding = first.findings[name]
        details.update(finding.details)
        details["failed_probes"] = [o.probe.id for o in failing]
        return CheckResult(name, Status.FAIL, f"{len(failing)} of {len(ran)} probe(s) fail; "
                           f"{finding.message}", first.probe.id, details=details)  # fmt: skip
    note = "" if len(ran) == total else f" ({total - len(ran)} probe(s) did not run)"
    return CheckResult(name, Status.PASS, f"{check.passes} on {len(ran)} probe(s){note}",
                       details=details)  # fmt: skip


def _fresh_check(fresh: list[_ProbeOutcome], seed: int, *, clean: bool) -> CheckResult:
    details: dict[str, Any] = {"seed": seed, "probes": [o.probe.id for o in fresh]}
    if not clean:
        return CheckResult("fresh-probes", Status.SKIP,
                           "not run: the fixed probes already fail", details=details)  # fmt: skip
    if not fresh:
        return CheckResult("fresh-probes", Status.SKIP, "no fresh probes asked for "
                           "(probes.fresh = 0)", required=False, details=details)  # fmt: skip
    for outcome in fresh:
        if outcome.launch is not None:
            return CheckResult("fresh-probes", Status.FAIL, f"{outcome.launch.status}: "
                               f"{outcome.launch.message.strip()}", outcome.probe.id,
                               details=details)  # fmt: skip
        if outcome.findings:
            name, finding = next(iter(outcome.findings.items()))
            details["failed_check"] = name
            return CheckResult("fresh-probes", Status.FAIL, f"{name}: {finding.message}",
                               outcome.probe.id, details=details | dict(finding.details))
    return CheckResult("fresh-probes", Status.PASS, f"{len(fresh)} fresh probe(s) from seed "
                       f"{seed} pass every check", details=details)  # fmt: skip


def _worst_metrics(ran: list[_ProbeOutcome]) -> dict[str, Any]:
    worst: dict[str, ErrorMetrics] = {}
    where: dict[str, str] = {}
    for outcome in ran:
        assert outcome.record is not None
        for name, metrics in outcome.record.metrics.items():
            if name not in worst or _score(metrics) > _score(worst[name]):
                worst[name], where[name] = metrics, outcome.probe.id
    # the profile is in the probe's own metrics already: a second copy would only cost bytes
    return {name: {"probe": where[name], **dataclasses.replace(m, profile=None).to_json()}
            for name, m in worst.items()}  # fmt: skip


def _score(metrics: ErrorMetrics) -> float:
    value = metrics.max_ulp
    return value if math.isfinite(value) else math.inf


def _sanitizer_skipped(reason: str | None = None) -> CheckResult:
    # lazy: timing and the sanitizer load only when a run gets that far
    from kcert.certify import sanitizer

    return sanitizer.not_asked() if reason is None else sanitizer.skipped(reason)


def _skipped_timing(reason: str) -> tuple[CheckResult, TimingReport]:
    # lazy: timing and the sanitizer load only when a run gets that far
    from kcert.certify.timing import skipped_timing

    return skipped_timing(reason)


def _note(check: CheckResult, text: str) -> CheckResult:
    return CheckResult(check.name, check.status, check.message + text, check.probe,
                       check.required, check.details)  # fmt: skip


def _with_probe(check: CheckResult, probe: str) -> CheckResult:
    return CheckResult(check.name, check.status, check.message, probe, check.required,
                       check.details)  # fmt: skip

