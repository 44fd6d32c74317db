"""Probe sets and inputs are deterministic, cover every dim value, and respect the domains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kcert.certify.errors import SpecError
from kcert.certify.probes import (
    SEED_BITS,
    derive_seed,
    fixed_probes,
    fresh_probes,
    make_inputs,
    make_probe,
)  # fmt: skip
from kcert.certify.spec import KernelSpec, parse_spec


def make_kernel(tmp_path: Path, args: dict[str, str], dims: dict[str, list[int]],
                **extra: Any) -> KernelSpec:
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": dims, "args": args, **extra}
    return parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]


@pytest.fixture
def matmul(tmp_path: Path) -> KernelSpec:
    return make_kernel(tmp_path, {"a": "in f32[m, k]", "b": "in f32[k, n]", "c": "out f32[m, n]"},
                       {"m": [1, 17, 100], "n": [64, 1, 31, 128], "k": [16, 1]})


def test_every_value_of_every_dim_is_covered_and_corners_are_there(matmul: KernelSpec) -> None:
    probes = fixed_probes(matmul).probes
    for name, values in matmul.dims.items():
        assert {p.dims[name] for p in probes} == set(values)
    ids = [p.id for p in probes]
    assert ids[0] == "m=1,n=1,k=1"
    assert ids[1] == "m=100,n=128,k=16"
    assert len(set(ids)) == len(ids)
    corners = {(m, n, k) for m in (1, 100) for n in (1, 128) for k in (1, 16)}
    assert corners <= {(p.dims["m"], p.dims["n"], p.dims["k"]) for p in probes}


def test_the_set_is_deterministic(matmul: KernelSpec) -> None:
    first, second = fixed_probes(matmul).probes, fixed_probes(matmul).probes
    assert [(p.id, p.seed) for p in first] == [(p.id, p.seed) for p in second]
    assert first[0].seed == derive_seed(matmul.digest.hex, first[0].id)
    a, b = make_inputs(matmul, first[3]), make_inputs(matmul, second[3])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert set(a) == {"a", "b"}  # out buffers get no inputs


def test_the_cap_is_respected_and_uncovered_values_are_reported(matmul: KernelSpec) -> None:
    capped = fixed_probes(matmul, max_probes=2)
    assert len(capped.probes) == 2
    assert capped.uncovered == {"m": (17,), "n": (31, 64)}


def test_probes_over_max_elements_are_dropped_but_their_values_kept(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[m, n]", "y": "out f32[m, n]"},
                         {"m": [1, 1000], "n": [1, 1000]}, probes={"max_elements": 50_000})
    result = fixed_probes(kernel)
    assert all(p.elements <= 50_000 for p in result.probes)
    assert {p.dims["m"] for p in result.probes} == {1, 1000}
    assert {p.dims["n"] for p in result.probes} == {1, 1000}
    assert not result.uncovered


def test_auto_float_inputs_mix_families(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[n]", "y": "out f32[n]"}, {"n": [20_000]})
    x = make_inputs(kernel, fixed_probes(kernel).probes[0])["x"]
    magnitude = np.abs(x[x != 0])
    assert magnitude.max() >= 2.0**8  # large
    assert magnitude.min() <= 2.0**-16  # tiny
    zeros = x[x == 0]
    assert np.signbit(zeros).any() and (~np.signbit(zeros)).any()  # signed zeros
    assert np.isfinite(x).all()
    assert x.dtype == np.float32


def test_inputs_stay_inside_the_declared_domains(tmp_path: Path) -> None:
    kernel = make_kernel(
        tmp_path,
        {"u": "in f32[n]", "g": "in f16[n]", "w": "in bf16[n]", "i": "in i32[n]",
         "b": "in bool[n]", "o": "out f32[n]"},
        {"n": [5000]},
        values={"u": "uniform(0.5, 1.5)", "g": "normal(0, 2)", "w": "uniform(-1, 1)",
                "i": "uniform(0, 10)"},
    )
    inputs = make_inputs(kernel, fixed_probes(kernel).probes[0])
    u = inputs["u"]
    assert u.min() >= 0.5 and u.max() <= 1.5 and len(np.unique(u)) > 1000
    g = inputs["g"].astype(np.float64)
    assert np.abs(g).max() <= 2 * 5.01 and (g == 0).any() and np.isfinite(g).all()
    w = inputs["w"].astype(np.float64)
    assert w.min() >= -1 and w.max() <= 1 and (np.abs(w[w != 0]) < 1e-3).any()
    i = inputs["i"]
    assert i.dtype == np.int32 and i.min() >= 0 and i.max() <= 9 and len(np.unique(i)) == 10
    assert inputs["b"].dtype == bool and inputs["b"].any() and not inputs["b"].all()


def test_auto_integers_are_integer_ranges(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"i": "in i8[n]", "j": "in u16[n]", "o": "out i32[n]"},
                         {"n": [4000]})
    inputs = make_inputs(kernel, fixed_probes(kernel).probes[0])
    assert inputs["i"].dtype == np.int8 and (inputs["i"] < 0).any() and (inputs["i"] == 0).any()
    assert inputs["j"].dtype == np.uint16 and inputs["j"].max() > 1000


def test_fresh_probes_come_from_their_seed(matmul: KernelSpec) -> None:
    one = fresh_probes(matmul, 12345)
    again = fresh_probes(matmul, 12345)
    other = fresh_probes(matmul, 54321)
    # and one with every drawn dim large at once, and two on tile boundaries
    assert len(one) == matmul.probes.fresh + 3
    assert [(p.id, p.seed) for p in one] == [(p.id, p.seed) for p in again]
    assert [p.seed for p in one] != [p.seed for p in other]
    assert all(p.kind == "fresh" and p.id.startswith(f"fresh{i}:") for i, p in enumerate(one))
    for probe in one:
        # drawn sizes (kcert.certify.sizes): from the smallest listed up to twice the largest
        assert all(min(matmul.dims[d]) <= probe.dims[d] <= 2 * max(matmul.dims[d])
                   for d in matmul.dims)  # fmt: skip
        fixed = make_probe(matmul, probe.dims)
        assert not np.array_equal(make_inputs(matmul, probe)["a"], make_inputs(matmul, fixed)["a"])
    assert all(0 <= p.seed < 2**SEED_BITS for p in (*one, *fixed_probes(matmul).probes))


def test_a_probe_set_that_would_be_empty_is_a_spec_error(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[n]", "y": "out f32[n]"}, {"n": [100, 200]},
                         probes={"max_elements": 10})
    with pytest.raises(SpecError, match="max_elements"):
        fixed_probes(kernel)
