"""The probe-check registry: one class per check, read by the report, the pipeline and SARIF.

The last test certifies a passing kernel and five adversarial ones on the
Triton interpreter and compares every check's name, status, probe and message
(and digests of the details and probe records) with what kcert printed before
the checks became classes: the registry changed how the code reads, never what a
certificate says.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kcert.certify import checks
from kcert.certify.checks import ProbeEvidence, ProbeResult, evaluate, make_job
from kcert.certify.ci import sarif
from kcert.certify.execution import RunJob
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.probe_checks import (
    PROBE_CHECK_NAMES,
    PROBE_CHECKS,
    Evidence,
    Finding,
    ProbeCheck,
)  # fmt: skip
from kcert.certify.report import CHECK_NAMES, CertificationReport
from kcert.certify.spec import KernelSpec, load_spec, parse_spec
from kcert.certify.tolerance import Allowance
from kcert.digest import canonical_json

ASSETS = Path(__file__).resolve().parents[1] / "assets"
N = 64


def test_the_certificate_lists_the_registered_checks_in_its_order() -> None:
    assert CHECK_NAMES == (
        "build", "artifact", "launch", "correctness", "coverage", "bounds", "input-integrity",
        "determinism", "special-values", "fresh-probes", "timing", "sanitizer")  # fmt: skip
    assert PROBE_CHECK_NAMES == tuple(c.name for c in PROBE_CHECKS)
    assert len({c.rank for c in PROBE_CHECKS}) == len(PROBE_CHECKS)
    for check in PROBE_CHECKS:
        assert check.passes and check.summary.endswith(".")
        assert sarif.RULES[check.name] == check.summary


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> KernelSpec:
    folder = tmp_path_factory.mktemp("probe_checks")
    (folder / "k.py").write_text("def k():\n    pass\n")
    (folder / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": {"n": [N]},
             "args": {"x": "in f32[n]", "y": "out f32[n]"}}
    return parse_spec({"kernel": [table]}, folder / "kcert.toml").kernels[0]


def launches(kernel: KernelSpec) -> tuple[ProbeEvidence, dict[str, np.ndarray[Any, Any]]]:
    """Runs A and B of a kernel that computes y = 2x right, and their padded outputs."""
    x = np.linspace(-1, 1, N, dtype=np.float32)
    launch = kernel.bind({"n": N})
    jobs = [make_job(kernel, launch, {"x": x}, run) for run in ("A", "B")]
    outs = [answer(job, {"y": 2 * x}) for job in jobs]
    allowed = {"y": Allowance(np.full(N, 1e-6), 1e-6, 0.0, "spec")}
    ev = ProbeEvidence(kernel, jobs[0], jobs[1], outs[0], outs[1], {"y": 2 * x}, allowed)
    return ev, {"A": outs[0]["y"], "B": outs[1]["y"]}


def answer(job: RunJob, expected: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    out = {b.name: b.padded.copy() for b in job.buffers}
    for b in job.buffers:
        if b.name in expected:
            out[b.name][b.guard : b.guard + N] = expected[b.name]
    return out


def test_findings_come_basic_cause_first_and_point_at_their_element(kernel: KernelSpec) -> None:
    ev, y = launches(kernel)
    guard = ev.job_a.buffers[1].guard
    for run in ("A", "B"):
        y[run][guard + 11] += np.float32(0.5)  # a wrong value...
        y[run][guard + N + 2] = 0.0  # ...and a write past the end
    result = evaluate(ev)
    # fresh-probes names the first finding: the overrun explains the value, not the reverse
    assert list(result.findings) == ["bounds", "correctness"]
    wrong = result.findings["correctness"]
    assert (wrong.buffer, wrong.first_index) == ("y", (11,))
    assert wrong.details["y"]["first_bad_index"] == [11]
    overrun = result.findings["bounds"]
    assert (overrun.buffer, overrun.first_index) == (None, None)
    assert overrun.details["y"]["after"] == {"written": 1, "farthest": 3}


class _Negative:
    """A check made up for the test: any negative output element."""

    name = "negative"
    passes = "no negative output"
    summary = "No output element is negative."
    rank = 9

    def find(self, ev: Evidence) -> Finding | None:
        for out in ev.outputs:
            bad = out.runs.data("A") < 0
            if bad.any():
                return Finding(f"'{out.name}' has {int(bad.sum())} negative element(s)", out.name,
                               None, {out.name: {"count": int(bad.sum())}})  # fmt: skip
        return None


def test_a_check_added_to_the_registry_runs_on_every_probe(
    kernel: KernelSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    added: ProbeCheck = _Negative()
    monkeypatch.setattr(checks, "PROBE_CHECKS", (*PROBE_CHECKS, added))
    ev, _ = launches(kernel)
    result: ProbeResult = evaluate(ev)
    assert list(result.findings) == ["negative"]  # y = 2x on [-1, 1]: half is negative
    assert result.findings["negative"].message == "'y' has 32 negative element(s)"
    assert result.metrics["y"].bad_count == 0  # the other checks still ran, and pass


# ---------------------------------------------------------------------------- same certificates

#: What kcert reported for these kernels before the probe checks became classes
#: (main at fe0d14f), re-recorded once when the drawn conditions became scheme v3
#: and fresh probes gained the two tile-boundary sizes (more probes; the
#: out-of-bounds read now meets a plausible or small guard in these probes):
#: (check, status, probe, message). ``build`` and ``artifact``
#: messages name the Triton version and its compiler's figures, so only their
#: status is compared.
RECORDED: dict[str, tuple[tuple[str, str, str | None, str | None], ...]] = {
    "vector_add": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "10 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 4 probe(s)"),
        ("coverage", "pass", None, "every output element written on 4 probe(s)"),
        ("bounds", "pass", None, "no write outside any buffer on 4 probe(s)"),
        ("input-integrity", "pass", None, "inputs unchanged on 4 probe(s)"),
        ("determinism", "pass", None,
         "identical output bytes across fills, guards and addresses on 4 probe(s)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 4 probe(s)"),
        ("fresh-probes", "pass", None, "6 fresh probe(s) from seed 1 pass every check"),
    ),
    "add_unmasked_tail": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "3 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 3 probe(s)"),
        ("coverage", "pass", None, "every output element written on 3 probe(s)"),
        ("bounds", "fail", "n=1",
         "3 of 3 probe(s) fail; 'out' written up to 127 element(s) past its end (127 written) "
         "(run A); 'out' written up to 127 element(s) past its end (127 written) (run B)"),
        ("input-integrity", "pass", None, "inputs unchanged on 3 probe(s)"),
        ("determinism", "pass", None,
         "identical output bytes across fills, guards and addresses on 3 probe(s)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 3 probe(s)"),
        ("fresh-probes", "skip", None, "not run: the fixed probes already fail"),
    ),
    "add_writes_input": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "3 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 3 probe(s)"),
        ("coverage", "pass", None, "every output element written on 3 probe(s)"),
        ("bounds", "pass", None, "no write outside any buffer on 3 probe(s)"),
        ("input-integrity", "fail", "n=1",
         "3 of 3 probe(s) fail; 'x' has 1 element(s) changed, first at (0,) (run A); 'x' has 1 "
         "element(s) changed, first at (0,) (run B)"),
        ("determinism", "pass", None,
         "identical output bytes across fills, guards and addresses on 3 probe(s)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 3 probe(s)"),
        ("fresh-probes", "skip", None, "not run: the fixed probes already fail"),
    ),
    "neighbor_sum_oob_read": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "3 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 3 probe(s)"),
        ("coverage", "pass", None, "every output element written on 3 probe(s)"),
        ("bounds", "pass", None, "no write outside any buffer on 3 probe(s)"),
        ("input-integrity", "pass", None, "inputs unchanged on 3 probe(s)"),
        ("determinism", "fail", "n=1",
         "3 of 3 probe(s) fail; 'out' differs between two launches in 1 element(s), first at "
         "(0,)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 3 probe(s)"),
        ("fresh-probes", "skip", None, "not run: the fixed probes already fail"),
    ),
    "add_tuned_to_probes": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "8 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 2 probe(s)"),
        ("coverage", "pass", None, "every output element written on 2 probe(s)"),
        ("bounds", "pass", None, "no write outside any buffer on 2 probe(s)"),
        ("input-integrity", "pass", None, "inputs unchanged on 2 probe(s)"),
        ("determinism", "pass", None,
         "identical output bytes across fills, guards and addresses on 2 probe(s)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 2 probe(s)"),
        ("fresh-probes", "fail", "fresh0:n=5706",
         "correctness: 'out': 5505 element(s) outside tolerance, first at (0,) (got "
         "2729.527587890625, expected 2757.0986328125, allowed error 0.00159); max abs error "
         "81.9, max rel 0.01, max 1.68e+05 ulp"),
    ),
    "add_keeps_found": (
        ("build", "pass", None, None),
        ("artifact", "pass", None, None),
        ("launch", "pass", None, "6 probe(s) launched twice each, all completed"),
        ("correctness", "pass", None, "every element within tolerance on 6 probe(s)"),
        ("coverage", "fail", "n=1",
         "6 of 6 probe(s) fail; 'out' kept 1 of 1 stale element(s) that its buffer held before "
         "the launch, first at (0,) (run B prefilled it with plausible values, as a reused "
         "allocation holds an earlier call's output)"),
        ("bounds", "pass", None, "no write outside any buffer on 6 probe(s)"),
        ("input-integrity", "pass", None, "inputs unchanged on 6 probe(s)"),
        ("determinism", "pass", None,
         "identical output bytes across fills, guards and addresses on 6 probe(s)"),
        ("special-values", "pass", None,
         "NaN and Inf exactly where the reference has them on 6 probe(s)"),
        ("fresh-probes", "skip", None, "not run: the fixed probes already fail"),
    ),
}  # fmt: skip
#: The same certifications' details of ``launch`` to ``fresh-probes`` and their probe
#: records (anchors, metrics, error profiles), as :func:`_digest` of each.
RECORDED_DIGESTS: dict[str, tuple[str, str]] = {
    "vector_add": ("a1253df5f73dfd83", "836ee3eba51f944c"),
    "add_unmasked_tail": ("13f9eb61884ed7bd", "2cdc01c1ef4d7d0a"),
    "add_writes_input": ("b67a93d8ea4b6faf", "0aa8a0dbd5549bad"),
    "neighbor_sum_oob_read": ("7667f75d327201a1", "0a2ddda9124c970d"),
    "add_tuned_to_probes": ("757f93e54b8d8e85", "c606fe667e1fc22b"),
    "add_keeps_found": ("87f0fda806d5b14a", "9026891351687d83"),
}
#: The kernels' specs, and the fresh seeds their adversarial tests fix.
SPECS = {"add_keeps_found": ("conditions", 7)}
INTERPRETER = ("the Triton interpreter runs on the CPU: its times say nothing about the "
               "kernel on a GPU")  # fmt: skip
NOT_ASKED = "not asked for (kcert certify --sanitize memcheck,racecheck,initcheck)"
_COMPARED = frozenset({"launch", *PROBE_CHECK_NAMES, "fresh-probes"})


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(json.loads(json.dumps(value)))).hexdigest()[:16]


def observed(report: CertificationReport) -> tuple[list[tuple[Any, ...]], tuple[str, str]]:
    """Each check as (name, status, probe, message), and the digests of details and probes."""
    rows = [(c.name, str(c.status), c.probe, None if c.name in ("build", "artifact") else
             c.message) for c in report.checks]  # fmt: skip
    details = {c.name: dict(c.details) for c in report.checks if c.name in _COMPARED}
    return rows, (_digest(details), _digest([p.to_json() for p in report.probes]))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECORDED))
def test_certificates_say_what_they_said_before_the_registry(name: str) -> None:
    folder, seed = SPECS.get(name, ("triton", 1))
    kernel = load_spec(ASSETS / folder / "kcert.toml").kernel(name)
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=seed,
                                            minimize=False))  # fmt: skip
    rows, digests = observed(report)
    expected = [*RECORDED[name], ("timing", "skip", None, INTERPRETER),
                ("sanitizer", "skip", None, NOT_ASKED)]  # fmt: skip
    assert rows == expected
    assert digests == RECORDED_DIGESTS[name]
