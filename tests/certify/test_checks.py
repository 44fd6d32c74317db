"""Each host-side check fires on hand-made padded arrays, and stays quiet on clean ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kcert.certify.checks import (
    ProbeEvidence,
    ProbeResult,
    compare,
    evaluate,
    guard_elements,
    make_job,
    timed_output_error,
    ulp,
)  # fmt: skip
from kcert.certify.execution import RunJob
from kcert.certify.spec import KernelSpec, parse_spec
from kcert.certify.tolerance import Allowance

N = 100


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> KernelSpec:
    folder = tmp_path_factory.mktemp("checks")
    (folder / "k.py").write_text("def k():\n    pass\n")
    (folder / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": {"n": [N]},
             "args": {"x": "in f32[n]", "y": "out f32[n]", "z": "inout f32[n]"}}
    return parse_spec({"kernel": [table]}, folder / "kcert.toml").kernels[0]


class Launches:
    """Two jobs and what a well-behaved kernel would send back for them."""

    def __init__(self, kernel: KernelSpec) -> None:
        self.kernel = kernel
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal(N).astype(np.float32)
        self.z = rng.standard_normal(N).astype(np.float32)
        launch = kernel.bind({"n": N})
        inputs = {"x": self.x, "z": self.z}
        self.job_a = make_job(kernel, launch, inputs, "A")
        self.job_b = make_job(kernel, launch, inputs, "B")
        self.expected = {"y": self.x * 2, "z": self.z + self.x}
        self.out_a = self.answer(self.job_a)
        self.out_b = self.answer(self.job_b)

    def answer(self, job: RunJob) -> dict[str, np.ndarray[Any, Any]]:
        out = {b.name: b.padded.copy() for b in job.buffers}
        for b in job.buffers:
            if b.name in self.expected:
                out[b.name][b.guard : b.guard + N] = self.expected[b.name]
        return out

    def data(self, run: str, name: str) -> np.ndarray[Any, Any]:
        job, out = (self.job_a, self.out_a) if run == "A" else (self.job_b, self.out_b)
        guard = next(b.guard for b in job.buffers if b.name == name)
        return out[name][guard : guard + N]

    def evaluate(self) -> ProbeResult:
        allowed = {name: Allowance(np.full(N, 1e-6), 1e-6, 0.0, "spec") for name in self.expected}
        return evaluate(ProbeEvidence(self.kernel, self.job_a, self.job_b, self.out_a, self.out_b,
                                      self.expected, allowed))


def test_a_clean_run_has_no_findings(kernel: KernelSpec) -> None:
    result = Launches(kernel).evaluate()
    assert result.findings == {}
    assert result.metrics["y"].bad_count == 0
    assert set(result.outputs) == {"y", "z"}


def fill(job: RunJob, name: str) -> np.ndarray[Any, Any]:
    """What the job put in buffer ``name``'s data region before the launch."""
    return next(b for b in job.buffers if b.name == name).data()


def test_layout_is_filled_with_the_drawn_conditions(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    a, b = fill(runs.job_a, "y"), fill(runs.job_b, "y")
    assert np.isnan(a).all() and np.isfinite(b).all()  # A: NaN markers; B: plausible values
    assert len(set(a.view(np.uint32).tolist())) > N // 2  # drawn payloads, not one NaN
    assert not (a.view(np.uint32) == b.view(np.uint32)).any()
    guards = []
    for job in (runs.job_a, runs.job_b):
        y = next(b for b in job.buffers if b.name == "y")
        assert y.guard == guard_elements((N,)) >= 16384 and y.guard % 256 == 0
        bits = y.padded[: y.guard].view(np.uint32)
        finite = np.isfinite(y.padded[: y.guard])
        assert (bits[1:] != bits[:-1])[finite[1:]].all()  # no two neighbours alike
        guards.append(y.padded[: y.guard])
    # every element holds a different kind of value in the two runs
    small = [np.abs(g) < 2.0**-12 for g in guards]
    nonfinite = [~np.isfinite(g) for g in guards]
    assert not (small[0] & small[1]).any() and not (nonfinite[0] & nonfinite[1]).any()
    assert all(0.2 < m.mean() < 0.47 for m in (*small, *nonfinite))
    assert runs.job_a.address_shift % 256 != 0 and runs.job_b.address_shift % 256 == 0
    assert guard_elements((10, 512)) >= 256 * 512  # a whole row of tiles fits


def test_unwritten_outputs_fail_coverage_only(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    for run, job in (("A", runs.job_a), ("B", runs.job_b)):
        runs.data(run, "y")[40:] = fill(job, "y")[40:]
    result = runs.evaluate()
    assert set(result.findings) == {"coverage"}
    assert result.findings["coverage"].details["y"] == {"unwritten": 60, "first_index": [40]}


def test_a_value_equal_to_one_fill_is_not_unwritten(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    # the kernel legitimately stores run B's fill value: run A shows it, run B too
    value = fill(runs.job_b, "y")[7]
    runs.expected["y"][7] = value
    runs.data("A", "y")[7] = value
    runs.data("B", "y")[7] = value
    assert runs.evaluate().findings == {}


def test_keeping_the_stale_values_of_run_b_fails_coverage(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    runs.data("B", "y")[5:9] = fill(runs.job_b, "y")[5:9]
    result = runs.evaluate()
    assert set(result.findings) == {"coverage"}
    assert "kept 4 of 100 stale element(s)" in result.findings["coverage"].message
    assert result.findings["coverage"].details["y"]["first_stale_index"] == [5]


def test_writes_into_the_guards_fail_bounds_with_the_distance(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    guard = runs.job_a.buffers[1].guard
    runs.out_a["y"][guard + N + 27] = 1.0  # 28 elements past the end
    runs.out_b["x"][guard - 3] = 1.0  # 3 before the start of an input
    result = runs.evaluate()
    assert set(result.findings) == {"bounds"}
    details = result.findings["bounds"].details
    assert details["y"]["after"] == {"written": 1, "farthest": 28}
    assert details["x"]["before"] == {"written": 1, "farthest": 3}
    assert "28 element(s) past its end" in result.findings["bounds"].message


def test_changed_inputs_fail_input_integrity(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    runs.data("A", "x")[5] = 0.5
    result = runs.evaluate()
    assert set(result.findings) == {"input-integrity"}
    assert result.findings["input-integrity"].details["x"] == {"changed": 1, "first_index": [5]}


def test_different_bytes_between_launches_fail_determinism(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    runs.data("B", "z")[9] = np.nextafter(runs.expected["z"][9], np.float32(10))
    result = runs.evaluate()
    assert set(result.findings) == {"determinism"}
    assert result.findings["determinism"].details["z"]["first_index"] == [9]


def test_nan_where_the_reference_is_finite_fails_special_values(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    for run in ("A", "B"):
        runs.data(run, "y")[3] = np.inf
    result = runs.evaluate()
    assert {"special-values", "correctness"} == set(result.findings)
    assert result.findings["special-values"].details["y"]["first_index"] == [3]


def test_correctness_reports_metrics_and_the_first_bad_index(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    for run in ("A", "B"):
        runs.data(run, "y")[[11, 50]] += np.float32(0.25)
    result = runs.evaluate()
    assert set(result.findings) == {"correctness"}
    metrics = result.metrics["y"]
    assert metrics.bad_count == 2 and metrics.first_bad_index == (11,)
    assert metrics.max_abs == pytest.approx(0.25, rel=1e-5)


def test_ulp_and_overflow_rounding() -> None:
    assert ulp("f32", np.array([1.0]))[0] == 2.0**-23
    assert ulp("f16", np.array([1024.0]))[0] == 1.0
    assert ulp("f32", np.array([0.0]))[0] == 2.0**-149
    big = np.array([65519.0])  # rounds to 65504 in f16; a correct kernel may store inf
    allowance = Allowance(np.array([20.0]), 0.0, 0.0, "spec")
    got = np.array([np.inf], dtype=np.float16)
    assert compare("f16", got, big.astype(np.float16), allowance).bad_count == 0
    far = Allowance(np.array([1.0]), 0.0, 0.0, "spec")
    assert compare("f16", got, np.array([1000.0], dtype=np.float16), far).bad_count == 1


def _timed(runs: Launches, out: dict[str, np.ndarray[Any, Any]]) -> str | None:
    allowed = {name: Allowance(np.full(N, 1e-6), 1e-6, 0.0, "spec") for name in runs.expected}
    return timed_output_error(runs.kernel, runs.job_a, out, runs.expected, allowed)


def test_the_last_timed_run_passes_when_it_did_the_work(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    assert _timed(runs, runs.out_a) is None


def test_a_timed_run_that_skipped_its_work_is_caught(kernel: KernelSpec) -> None:
    # what a kernel that returns at once leaves: the fill the outputs got before the run,
    # and the inout buffer as it was refreshed
    runs = Launches(kernel)
    skipped = {b.name: b.padded.copy() for b in runs.job_a.buffers}
    error = _timed(runs, skipped)
    assert error is not None
    assert f"'y' has {N} of {N} element(s) never written" in error
    assert "'z' has" in error and "outside tolerance" in error


def test_a_timed_run_with_a_wrong_answer_is_caught(kernel: KernelSpec) -> None:
    runs = Launches(kernel)
    wrong = {k: v.copy() for k, v in runs.out_a.items()}
    guard = next(b.guard for b in runs.job_a.buffers if b.name == "y")
    wrong["y"][guard + 7] += 1.0
    error = _timed(runs, wrong)
    assert error is not None and "'y' has 1 element(s) outside tolerance, first at (7,)" in error
