"""The CI slice of the catch-rate corpus: a few ported kernels and mutants, each for its reason.

``bench/catch_rate.py`` certifies all of ``bench/corpus`` (twelve ported
kernels and their mutants) against a one-shape ``allclose`` oracle; that
takes many minutes on the interpreter. This slice keeps the corpus from
rotting in CI: every mutant is checked to be exactly one edit and every port
to name its source, and a few originals and mutants are certified (about a
minute): the originals must pass, each mutant must fail the check its bug
shows up in. Marked ``corpus`` (``pytest -m corpus`` runs just this).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "catch_rate.py"
#: The fresh probes' seed, fixed so that a failure here can be reproduced.
FRESH_SEED = 1

pytestmark = [pytest.mark.corpus, pytest.mark.triton]  # Triton kernels, on the interpreter


def _bench() -> ModuleType:
    name = "kcert_bench_catch_rate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_port_names_its_source_and_every_mutant_is_one_edit() -> None:
    bench = _bench()
    corpus = bench.load_corpus()
    assert len(corpus) >= 12
    for kernel in corpus:
        header = (kernel.folder / kernel.source).read_text()[:2000]
        for word in ("Ported from", "commit", "licence"):
            assert word in header, f"{kernel.name}: the header does not say '{word}'"
        assert 3 <= len(kernel.mutants) <= 6, kernel.name
        for mutant in kernel.mutants:
            original = (kernel.folder / mutant.file).read_text()
            with bench.materialized(kernel, mutant) as spec:
                changed = (spec.parent / mutant.file).read_text()
            assert changed != original, f"{kernel.name}/{mutant.name} changes nothing"
            assert changed == original.replace(mutant.search, mutant.replace), mutant.name


def test_a_search_text_that_is_not_unique_is_refused(tmp_path: Path) -> None:
    bench = _bench()
    folder = tmp_path / "softmax"
    source = bench.CORPUS / "softmax"
    folder.mkdir()
    for name in ("kernel.py", "kcert.toml", "reference.py"):
        (folder / name).write_text((source / name).read_text())
    (folder / "mutants.toml").write_text(
        '[[mutant]]\nname = "x"\nclass = "c"\ndescription = "d"\n'
        'search = "mask"\nreplace = "mask2"\n'
    )
    with pytest.raises(bench.CorpusError, match="occurs 5 times in kernel.py, not once"):
        bench.load_kernel(folder)


# (kernel, mutant or None for the original, the checks that must fail). log_softmax
# names a local ``input`` (a local, not the builtin, for the module check); mish takes a
# string constexpr; rms_norm multiplies bfloat16 tensors, which the interpreter alone
# computes on their raw bits (the worker computes them as compiled), and its mutant's
# fill of 1 only shows in the values.
SLICE = [
    ("softmax", None, frozenset()),
    ("log_softmax", None, frozenset()),
    ("mish", None, frozenset()),
    ("softmax", "fill_zero", frozenset({"correctness"})),
    ("softmax", "row_step_plus_one", frozenset({"coverage"})),
    ("swiglu", None, frozenset()),
    ("swiglu", "mask_off_by_one", frozenset({"bounds"})),
    ("cross_entropy", "no_max_subtraction", frozenset({"correctness", "special-values"})),
    ("rms_norm", None, frozenset()),
    ("rms_norm", "fill_one", frozenset({"correctness"})),
]


@pytest.mark.parametrize(("kernel_name", "mutant_name", "fails"), SLICE,
                         ids=[f"{k}-{m or 'original'}" for k, m, _ in SLICE])  # fmt: skip
def test_the_slice_is_certified_for_its_reason(kernel_name: str, mutant_name: str | None,
                                               fails: frozenset[str]) -> None:  # fmt: skip
    bench = _bench()
    kernel = bench.load_kernel(bench.CORPUS / kernel_name)
    mutant = next(m for m in kernel.mutants if m.name == mutant_name) if mutant_name else None
    with bench.materialized(kernel, mutant) as spec:
        outcome = bench.run_kcert(spec, "triton-interpreter", fresh_seed=FRESH_SEED)
    if not fails:
        assert outcome.verdict == "pass", outcome.message
        return
    assert outcome.verdict == "fail", f"{kernel_name}/{mutant_name} slipped through"
    assert fails <= set(outcome.failed), (outcome.failed, outcome.message)


def test_lse_argmax_probes_draw_ignored_rows_and_labels_up_to_n() -> None:
    """Its labels' domain names ignore_index and n, so the ignore path (an inout loss
    left alone, predicted token -1) runs; certifying it is left to the bench (20 s)."""
    from kcert.certify.probes import fixed_probes, make_inputs
    from kcert.certify.spec import load_spec

    kernel = load_spec(_bench().CORPUS / "lse_argmax" / "kcert.toml").kernels[0]
    ignored = 0
    for probe in fixed_probes(kernel).probes:
        labels = make_inputs(kernel, probe)["Y_ptr"]
        assert labels.min() >= -1 and labels.max() < probe.dims["n"]
        ignored += int((labels == -1).sum())
    assert ignored > 0, "no probe draws an ignored row"
