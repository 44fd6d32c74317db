"""The ``sanitizer`` check: compute-sanitizer's reports parsed, judged, and run on a GPU.

The parser tests read reports that compute-sanitizer wrote for the CUDA C
adversarial kernels (tests/assets/sanitizer/); they run everywhere. The
wrapper seam is tested on the CPU with a shell that runs the worker as its
child, as compute-sanitizer does. The GPU tests run the real tools.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kcert.certify import sanitizer
from kcert.certify.report import CheckResult, Status
from kcert.errors import UsageError

ASSETS = Path(__file__).resolve().parents[1] / "assets"
REPORTS = ASSETS / "sanitizer"


def _report(tool: str, name: str) -> sanitizer.Report:
    return sanitizer.parse_report(tool, (REPORTS / name).read_text())


def test_a_racecheck_report_gives_one_race_error_with_its_hazard_count() -> None:
    report = _report("racecheck", "racecheck_row_sum_race.log")
    assert [f.kind for f in report.findings] == ["race"] * len(report.findings)
    assert report.errors, report
    first = report.errors[0]
    assert first.tool == "racecheck" and "row_sum_race" in " ".join((first.headline, *first.detail))
    assert first.count > 1
    assert report.summary is not None and "RACECHECK SUMMARY" in report.summary


def test_an_initcheck_report_names_the_uninitialised_read() -> None:
    report = _report("initcheck", "initcheck_uninit.log")
    assert report.errors and report.errors[0].kind == "uninitialized-read"
    assert not any("Host Frame" in line for f in report.findings for line in f.detail)


def test_a_clean_report_has_no_findings() -> None:
    report = _report("memcheck", "memcheck_clean.log")
    assert report.findings == () and report.summary == "ERROR SUMMARY: 0 errors"


def test_lines_that_are_not_the_tools_are_ignored() -> None:
    text = ("hello from the kernel's printf\n========= COMPUTE-SANITIZER\n"
            "========= ERROR SUMMARY: 0 errors\n")
    assert sanitizer.parse_report("memcheck", text).findings == ()


def test_warnings_are_recorded_and_do_not_fail() -> None:
    text = ("========= Warning: Race reported between Read access at k+0x10\n"
            "=========     and Write access at k+0x20 [3 hazards]\n"
            "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n")
    run = sanitizer._ToolRun("racecheck", sanitizer.parse_report("racecheck", text))
    check = sanitizer.judge([run], ["n=1"], "test")
    assert check.status is Status.PASS and "1 warning" in check.message
    assert check.details["findings"][0]["count"] == 3


def test_errors_fail_the_check_and_land_in_its_details() -> None:
    runs = [sanitizer._ToolRun("racecheck", _report("racecheck", "racecheck_row_sum_race.log")),
            sanitizer._ToolRun("memcheck", _report("memcheck", "memcheck_clean.log"))]
    check = sanitizer.judge(runs, ["m=1,n=1", "m=3,n=2048"], "2025.3.0")
    assert check.status is Status.FAIL and check.required
    assert check.message.startswith("racecheck: ")
    assert {f["tool"] for f in check.details["findings"]} == {"racecheck"}
    assert check.details["tools"] == ["racecheck", "memcheck"]


def test_a_run_that_wrote_no_report_fails() -> None:
    check = sanitizer.judge([sanitizer._ToolRun("memcheck", None, ["n=1: crash: boom"])],
                            ["n=1"], "")  # fmt: skip
    assert check.status is Status.FAIL and "did not complete" in check.message


def test_tools_are_parsed_and_checked() -> None:
    assert sanitizer.parse_tools("memcheck, racecheck,memcheck") == ("memcheck", "racecheck")
    with pytest.raises(UsageError, match="valgrind"):
        sanitizer.parse_tools("memcheck,valgrind")


def test_the_smallest_probe_and_the_largest_that_fits_are_picked() -> None:
    assert sanitizer.pick_probes([1000, 1, 10**7, 33]) == [1, 0]
    assert sanitizer.pick_probes([5]) == [0]
    assert sanitizer.pick_probes([10**8, 10**9]) == [0]


def test_skip_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    path, reason = sanitizer.availability("triton")
    assert path is None and reason is not None and "cuda executor" in reason
    monkeypatch.setenv("KCERT_COMPUTE_SANITIZER", "/nonexistent/compute-sanitizer")
    path, reason = sanitizer.availability("cuda")
    assert path is None and reason is not None and "not found" in reason
    assert sanitizer.not_asked().status is Status.SKIP and not sanitizer.not_asked().required


def test_a_worker_runs_under_a_wrapper_that_is_its_parent() -> None:
    """The seam compute-sanitizer uses: a prefix that runs the worker as its child."""
    from kcert.certify.checks import make_job
    from kcert.certify.sandbox import Sandbox
    from kcert.certify.spec import load_spec

    spec = load_spec(ASSETS / "triton" / "kcert.toml").kernel("vector_add")
    x = np.arange(40, dtype=np.float32)
    job = make_job(spec, spec.bind({"n": 40}), {"x": x, "y": x}, "A")
    shell = ("/bin/sh", "-c", '"$@"; exit $?', "sh")  # not exec: the shell stays the parent
    with Sandbox(spec, "triton-interpreter", wrapper=shell) as box:
        outcome = box.run(job)
    assert outcome.ok, outcome.message
    guard = job.buffers[2].guard
    assert (outcome.buffers["out"][guard : guard + 40] == 2 * x).all()


# ---------------------------------------------------------------------------- on a GPU


def _certify(name: str, tools: tuple[str, ...]) -> CheckResult:
    from kcert.certify.pipeline import CertifyOptions, certify
    from kcert.certify.spec import load_spec

    kernel = load_spec(ASSETS / "cuda" / "kcert.toml").kernel(name)
    options = CertifyOptions(executor="cuda", fresh_seed=1, minimize=False, timing=False,
                             sanitize=tools)  # fmt: skip
    report = certify(kernel, options)
    return next(c for c in report.checks if c.name == "sanitizer")


@pytest.mark.gpu
def test_racecheck_names_the_shared_memory_race() -> None:
    check = _certify("row_sum_race", ("racecheck",))
    assert check.status is Status.FAIL, check.message
    kinds = {f["kind"] for f in check.details["findings"]}
    assert "race" in kinds


@pytest.mark.gpu
def test_the_uninitialised_shared_read_is_caught() -> None:
    check = _certify("neighbor_sum_uninit_smem", ("memcheck", "racecheck", "initcheck"))
    assert check.status is Status.FAIL, check.message


@pytest.mark.gpu
def test_a_correct_kernel_is_clean_under_every_tool() -> None:
    check = _certify("row_sum", ("memcheck", "racecheck", "initcheck"))
    assert check.status is Status.PASS, (check.message, check.details)
