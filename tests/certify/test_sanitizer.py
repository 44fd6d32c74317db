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


def test_a_racecheck_report_of_the_missing_barrier_gives_its_races() -> None:
    report = _report("racecheck", "racecheck_row_sum_race.log")
    assert {f.kind for f in report.findings} == {"race"}
    assert [f.severity for f in report.findings].count("error") == 5
    assert [f.severity for f in report.findings].count("warning") == 1
    first = report.errors[0]
    assert first.headline == "Error: Race reported between Write access at row_sum_race+0x950"
    assert first.detail[0] == "and Read access at row_sum_race+0x910 [512 hazards]"
    assert first.count == 512 + 256 + 128 + 64 + 16 + 8 + 32
    assert report.summary == "RACECHECK SUMMARY: 6 hazards displayed (5 errors, 1 warning)"


@pytest.mark.parametrize(("tool", "name", "summary"), [
    ("racecheck", "racecheck_row_sum.log",
     "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"),
    ("memcheck", "memcheck_row_sum.log", "ERROR SUMMARY: 0 errors"),
    ("initcheck", "initcheck_neighbor_sum_uninit_smem.log", "ERROR SUMMARY: 0 errors"),
])  # fmt: skip
def test_a_clean_report_has_no_findings(tool: str, name: str, summary: str) -> None:
    report = _report(tool, name)
    assert report.findings == () and report.summary == summary


def test_memcheck_and_initcheck_findings_are_told_apart() -> None:
    # hand-written in the layout of the reports above (no adversarial kernel here makes
    # memcheck or initcheck report): headline, indented details, a host backtrace
    text = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at add_wild_store+0x90
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f0000000000 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f3a1] in libcuda.so.1
=========
========= Uninitialized __global__ memory read of size 4 bytes
=========     at k+0xa0
=========     by thread (255,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 2 errors
"""
    report = sanitizer.parse_report("memcheck", text)
    assert [f.kind for f in report.findings] == ["invalid-access", "uninitialized-read"]
    assert report.findings[0].detail[-1] == "Address 0x7f0000000000 is out of bounds"
    assert not any("Host Frame" in line for f in report.findings for line in f.detail)
    assert report.summary == "ERROR SUMMARY: 2 errors"


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
            sanitizer._ToolRun("memcheck", _report("memcheck", "memcheck_row_sum.log"))]
    check = sanitizer.judge(runs, ["m=1,n=1", "m=3,n=2048"], "2025.3.1")
    assert check.status is Status.FAIL and check.required
    assert check.message.startswith("racecheck: 5 error(s) over 4572 hazards; first: Error: "
                                    "Race reported between Write access at row_sum_race+0x950")
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


@pytest.mark.triton
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


@pytest.mark.triton
def test_a_wrapper_inside_the_sandbox_reports_into_the_shared_folder(tmp_path: Path) -> None:
    """compute-sanitizer's --log-file must land where the certifier reads it, and only there."""
    from kcert.certify.checks import make_job
    from kcert.certify.sandbox import Sandbox
    from kcert.certify.spec import load_spec

    spec = load_spec(ASSETS / "triton" / "kcert.toml").kernel("vector_add")
    x = np.arange(8, dtype=np.float32)
    job = make_job(spec, spec.bind({"n": 8}), {"x": x, "y": x}, "A")
    report = tmp_path / "memcheck.log"
    shell = ("/bin/sh", "-c", 'echo "a report" > "$0"; "$@"; exit $?', str(report))
    with Sandbox(spec, "triton-interpreter", wrapper=shell, share=tmp_path) as box:
        assert box.run(job).ok
    assert report.read_text() == "a report\n"


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
def test_an_uninitialised_shared_read_is_beyond_the_tools() -> None:
    """initcheck tracks global memory only, and the read is ordered by a barrier, so no
    tool reports it (compute-sanitizer 2025.3.1); correctness catches it instead. If a
    later release reports it, this test says so: then the check should fail here."""
    check = _certify("neighbor_sum_uninit_smem", ("memcheck", "racecheck", "initcheck"))
    assert check.status is Status.PASS and check.details["findings"] == [], check.details


@pytest.mark.gpu
def test_a_correct_kernel_is_clean_under_every_tool() -> None:
    check = _certify("row_sum", ("memcheck", "racecheck", "initcheck"))
    assert check.status is Status.PASS, (check.message, check.details)
