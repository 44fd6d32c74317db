"""``bench/log.py`` runs end to end (on a small log), so the benchmark cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "log.py"


def test_the_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("kcert_bench_log", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--entries", "3000", "--batch", "500", "--proofs", "40", "--singles", "10"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    for figure in ("appends, batched", "baseline, no tree", "ratio log / baseline",
                   "inclusion proof", "consistency proof"):  # fmt: skip
        assert figure in out
