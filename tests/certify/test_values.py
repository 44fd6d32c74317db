"""Value families across the domain: kernels wrong only on values the probes once never
drew fail for that reason, and their correct twins pass.

The families (kcert.certify.probes): every binade between the domain's ends, integer
values, the domain's edges, rows of one sign, and NaN/Inf where a spec opts in.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kcert.certify.errors import SpecError
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.probes import domain_ends, fixed_probes, make_inputs, value_families
from kcert.certify.report import Status, Verdict
from kcert.certify.spec import KernelSpec, ValueDomain, load_spec, parse_spec

SPEC = Path(__file__).resolve().parents[1] / "assets" / "values" / "kcert.toml"

#: kernel -> {failing check: a phrase its message must hold}; empty: must pass.
CASES: dict[str, dict[str, str]] = {
    "double": {},
    "double_nonfinite": {},
    "masked_softmax": {},
    "row_max": {},
    "double_mid_range": {"correctness": "outside tolerance"},
    "double_integers": {"correctness": "outside tolerance"},
    "double_nonfinite_to_zero": {
        "special-values": "where the reference is NaN/Inf and the kernel is not",
        "correctness": "outside tolerance"},
    "row_max_zero_fill": {"correctness": "outside tolerance"},
    "row_sum_nonfinite": {},
    # non-finite inputs in a minority of rows: long rows' finite sums are compared too
    "row_sum_half_finite_tail_nonfinite": {"correctness": "outside tolerance"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.triton
def test_value_family_kernels(name: str) -> None:
    kernel = load_spec(SPEC).kernel(name)
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=1,
                                            minimize=False, timing=False))  # fmt: skip
    failed = {c.name: c.message for c in report.checks if c.status is Status.FAIL}
    detail = "\n".join(f"{c.name}: {c.status} {c.message[:300]}" for c in report.checks)
    assert set(failed) == set(CASES[name]), detail
    for check, phrase in CASES[name].items():
        assert phrase in failed[check], detail
    assert report.verdict is (Verdict.FAIL if CASES[name] else Verdict.PASS)
    families = report.predicate()["probes"]["value_families"]
    assert {"binades", "integers", "edges"} <= set(families["x"])
    assert ("nan" in families["x"]) is ("nonfinite" in name)


def spec_of(tmp_path: Path, **extra: object) -> KernelSpec:
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": {"m": [64], "n": [4096]},
             "args": {"x": "in f32[m, n]", "i": "in i32[n]", "y": "out f32[m, n]"}, **extra}
    return parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]


def test_every_binade_between_the_domain_ends_is_drawn(tmp_path: Path) -> None:
    kernel = spec_of(tmp_path)
    x = make_inputs(kernel, fixed_probes(kernel).probes[0])["x"].astype(np.float64)
    _, tiny, large, _ = domain_ends("f32", ValueDomain("auto"))
    exponents = set(np.frexp(np.abs(x[x != 0]))[1] - 1)
    assert set(range(int(np.log2(tiny)), int(np.log2(large)))) <= exponents
    assert ((np.abs(x) > 8) & (np.abs(x) < 200)).sum() > 1000
    assert ((x == np.rint(x)) & (np.abs(x) >= 2)).sum() > 1000  # integer values
    assert (np.abs(x) == large).any() and (np.abs(x) == tiny).any()  # the edges


def test_rows_of_one_sign_are_drawn(tmp_path: Path) -> None:
    kernel = spec_of(tmp_path)
    x = make_inputs(kernel, fixed_probes(kernel).probes[0])["x"]
    negative = (x < 0).all(axis=1)
    positive = (x > 0).all(axis=1)
    assert negative.sum() >= 8 and positive.sum() >= 2 and (~negative & ~positive).sum() >= 16


def test_uniform_domains_keep_their_bounds_and_edges(tmp_path: Path) -> None:
    kernel = spec_of(tmp_path, values={"x": "uniform(-3, 5)"})
    x = make_inputs(kernel, fixed_probes(kernel).probes[0])["x"]
    assert x.min() == -3 and x.max() == 5
    assert (x < 0).all(axis=1).any()  # a negative row, mapped inside [-3, 0)


def test_most_rows_stay_finite_where_nonfinite_values_are_drawn(tmp_path: Path) -> None:
    kernel = spec_of(tmp_path, nonfinite={"x": ["nan", "inf", "-inf"]})
    for probe in fixed_probes(kernel).probes:
        x = make_inputs(kernel, probe)["x"]
        finite_rows = np.isfinite(x).all(axis=1).mean()  # a row sum's finite answers
        assert 0.6 < finite_rows < 0.9 and 0.02 < (~np.isfinite(x)).mean() < 0.08


def test_nonfinite_values_only_where_the_spec_opts_in(tmp_path: Path) -> None:
    plain = spec_of(tmp_path)
    assert np.isfinite(make_inputs(plain, fixed_probes(plain).probes[0])["x"]).all()
    kernel = spec_of(tmp_path, nonfinite={"x": ["nan", "-inf"]})
    x = make_inputs(kernel, fixed_probes(kernel).probes[0])["x"]
    assert np.isnan(x).any() and np.isneginf(x).any() and not np.isposinf(x).any()
    assert value_families(kernel)["x"][-2:] == ["nan", "-inf"]
    assert "nonfinite" in kernel.normalized() and "nonfinite" not in plain.normalized()


@pytest.mark.parametrize(("table", "says"), [
    ({"i": True}, "only floats hold NaN/Inf"),
    ({"y": True}, "names no input buffer"),
    ({"x": ["nan", "NaN"]}, 'a list of "nan", "inf", "-inf"'),
    ({"x": []}, 'a list of "nan", "inf", "-inf"'),
])  # fmt: skip
def test_bad_nonfinite_tables_are_spec_errors(tmp_path: Path, table: dict[str, object],
                                              says: str) -> None:  # fmt: skip
    with pytest.raises(SpecError, match="nonfinite") as error:
        spec_of(tmp_path, nonfinite=table)
    assert says in str(error.value)


@pytest.mark.triton
def test_the_certificate_states_the_magnitudes_it_vouches_for() -> None:
    # wrong only outside 2**-21 .. 2**13: it passes, and the scope note says the ends probed
    kernel = load_spec(SPEC).kernel("reciprocal_wrong_outside")
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=1,
                                            minimize=False, timing=False))  # fmt: skip
    assert report.verdict is Verdict.PASS
    notes = [n.message for n in report.scope_notes if n.kind == "values"]
    assert len(notes) == 1, notes
    assert "x (auto): ±[2^-20 (9.537e-07), 2^12 (4096)] and 0" in notes[0]
    assert "was not probed" in notes[0]
