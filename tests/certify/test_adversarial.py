"""Adversarial kernels fail certification for the reason they were written to show.

Each case names the exact set of checks that must fail: not merely "the
verdict is fail", but which check caught it and that no unrelated check
fired. Every correct counterpart must pass with no failing check at all.

The Triton set runs everywhere through the interpreter; the CUDA C set needs
a GPU (marked ``gpu``). Kernels, specs and references are in tests/assets/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import CertificationReport, Status, Verdict
from kcert.certify.spec import load_spec

ASSETS = Path(__file__).resolve().parents[1] / "assets"
#: Fresh probes come from a seed drawn at certification time; tests fix it so that
#: the fresh-probes case is reproducible (seed 1 draws n = 100 first).
FRESH_SEED = 1


@dataclass(frozen=True)
class Case:
    kernel: str
    #: Exactly the checks that must fail; empty for a correct kernel.
    fails: frozenset[str]
    deadline_s: float = 60.0
    max_probes: int | None = None
    #: A word the failing check's message must contain, where one tells the reason apart.
    says: dict[str, str] = field(default_factory=dict)
    #: For bugs whose symptom depends on the hardware's scheduling (races, stale shared
    #: memory): at least one of these must fail, and nothing outside ``fails | one_of``.
    one_of: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.kernel


def case(kernel: str, *fails: str, **kwargs: object) -> Case:
    return Case(kernel, frozenset(fails), **kwargs)  # type: ignore[arg-type]


CORRECT = ("vector_add", "relu", "neighbor_sum", "row_sum", "softmax", "matmul")
TRITON_CORRECT = [case(k) for k in CORRECT]

TRITON_ADVERSARIAL = [
    case("add_unmasked_tail", "bounds", says={"bounds": "past its end"}),
    case("add_grid_rounded_down", "coverage", says={"coverage": "never written"}),
    case("add_early_exit", "coverage", says={"coverage": "never written"}),
    # never writes at all: would pass if outputs were zero-filled instead of poisoned
    case("relu_sparse_store", "coverage", says={"coverage": "never written"}),
    case("add_writes_input", "input-integrity", says={"input-integrity": "'x'"}),
    # reads x[n], in the guard band: reads cannot damage the guards, so bounds stays
    # clean; the poison it reads differs between the two runs and is NaN in run A
    case("neighbor_sum_oob_read", "determinism", "correctness", "special-values"),
    # run A's buffers are never 256-byte aligned, so its slow path shows in run A alone
    # (correctness), and where run B's are 512-byte aligned, between the runs (determinism)
    case("add_alignment_path", "correctness", "determinism", says={"determinism": "differs"}),
    case("row_sum_f16_acc", "correctness"),
    case("softmax_no_max", "special-values", "correctness", says={"special-values": "NaN"}),
    case("matmul_drops_k_tail", "correctness"),
    case("add_tuned_to_probes", "fresh-probes", says={"fresh-probes": "correctness"}),
    case("add_debug_print", "artifact", says={"artifact": "vprintf"}),
    case("add_bad_block", "build"),
    case("add_wild_store", "launch", max_probes=1, says={"launch": "SIGSEGV"}),
    case("add_spin", "launch", deadline_s=5.0, says={"launch": "timeout"}),
]


def run(spec: Path, c: Case, executor: str) -> CertificationReport:
    kernel = load_spec(spec).kernel(c.kernel)
    options = CertifyOptions(executor=executor, deadline_s=c.deadline_s, max_probes=c.max_probes,
                             fresh_seed=FRESH_SEED, minimize=False)  # fmt: skip
    return certify(kernel, options)


def assert_outcome(report: CertificationReport, c: Case) -> None:
    failed = {check.name for check in report.checks if check.status is Status.FAIL}
    detail = "\n".join(f"{x.name}: {x.status} {x.message[:300]}" for x in report.checks)
    if c.one_of:
        assert failed & c.one_of and failed <= c.fails | c.one_of, (
            f"{c.kernel}: expected one of {sorted(c.one_of)} to fail\n{detail}")
    else:
        assert failed == c.fails, f"{c.kernel}: expected {sorted(c.fails)} to fail\n{detail}"
    assert report.verdict is (Verdict.FAIL if c.fails or c.one_of else Verdict.PASS)
    for name, word in c.says.items():
        message = next(x.message for x in report.checks if x.name == name)
        assert word in message, f"{c.kernel}: '{word}' not in the {name} message: {message}"


@pytest.mark.parametrize("c", TRITON_CORRECT + TRITON_ADVERSARIAL, ids=str)
@pytest.mark.triton
def test_triton_kernels_in_the_interpreter(c: Case) -> None:
    assert_outcome(run(ASSETS / "triton" / "kcert.toml", c, "triton-interpreter"), c)


CUDA_CORRECT = [case(k) for k in (*CORRECT, "neighbor_sum_tiled")]

CUDA_ADVERSARIAL = [
    case("add_unmasked_tail", "bounds", says={"bounds": "past its end"}),
    case("add_grid_rounded_down", "coverage", says={"coverage": "never written"}),
    case("add_early_exit", "coverage", says={"coverage": "never written"}),
    case("relu_sparse_store", "coverage", says={"coverage": "never written"}),
    case("add_writes_input", "input-integrity", says={"input-integrity": "'x'"}),
    case("neighbor_sum_oob_read", "determinism", "correctness", "special-values"),
    case("add_alignment_path", "correctness", "determinism", says={"determinism": "differs"}),
    case("row_sum_f16_acc", "correctness"),
    case("softmax_no_max", "special-values", "correctness", says={"special-values": "NaN"}),
    case("matmul_drops_k_tail", "correctness"),
    case("add_tuned_to_probes", "fresh-probes", says={"fresh-probes": "correctness"}),
    case("add_debug_print", "artifact", says={"artifact": "vprintf"}),
    case("add_broken", "build"),
    # a missing barrier or a stale shared-memory read gives wrong sums on most runs
    # (correctness) and, when the warps' timing differs between the two runs, different
    # bytes (determinism); which of the two shows depends on the hardware's scheduling
    case("row_sum_race", one_of=frozenset({"correctness", "determinism"})),
    case("neighbor_sum_uninit_smem", one_of=frozenset({"correctness", "determinism"})),
    case("add_wild_store", "launch", max_probes=1, says={"launch": "illegal"}),
    case("add_spin", "launch", deadline_s=5.0, says={"launch": "timeout"}),
    # its timed launches return at once: the outputs, poisoned before every timed run,
    # stay poison (a stale right answer from an earlier run cannot pass)
    case("add_after_warmup_skips", "timing", says={"timing": "last timed run is wrong"}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("c", CUDA_CORRECT + CUDA_ADVERSARIAL, ids=str)
def test_cuda_kernels_on_the_gpu(c: Case) -> None:
    assert_outcome(run(ASSETS / "cuda" / "kcert.toml", c, "cuda"), c)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [TRITON_CORRECT[0], *TRITON_ADVERSARIAL], ids=str)
def test_triton_kernels_on_the_gpu(c: Case) -> None:
    if c.kernel == "add_wild_store":
        c = case(c.kernel, "launch", max_probes=1)  # the GPU says "illegal address", not SIGSEGV
    assert_outcome(run(ASSETS / "triton" / "kcert.toml", c, "triton"), c)


@pytest.mark.parametrize(("name", "check", "word"), [("add_broken", "build", "bias"),
                                                      ("add_debug_print", "artifact", "vprintf")])
def test_cuda_build_and_artifact_failures_show_without_a_gpu(name: str, check: str,
                                                            word: str) -> None:  # fmt: skip
    from kcert.certify.lint import lint

    report = lint(load_spec(ASSETS / "cuda" / "kcert.toml").kernel(name), arch="sm_90")
    failed = {c.name: c for c in report.checks if c.status is Status.FAIL}
    assert set(failed) == {check}
    text = failed[check].message + str(failed[check].details)
    assert word in text, text
