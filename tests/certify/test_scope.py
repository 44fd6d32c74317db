"""Scope notes: what a spec's value domains or the executor leave unexercised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kcert.certify.scope import scope_notes
from kcert.certify.spec import KernelSpec, parse_spec

SOFTMAX = '''
import triton
import triton.language as tl


@triton.jit
def k(x, out, n, BLOCK: tl.constexpr):
    """exp and sqrt named here, in a docstring, do not count."""
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)  # neither does sqrt( in a comment
    tl.store(out + offs, tl.exp(v) / tl.sum(tl.exp(v), axis=0), mask=offs < n)
'''

NORM = '''
import triton
import triton.language as tl


@triton.jit
def k(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    var = tl.sum(v * v, axis=0) / n - (tl.sum(v, axis=0) / n) * (tl.sum(v, axis=0) / n)
    tl.store(out + offs, v / tl.sqrt(var + 1e-5), mask=offs < n)
'''

MATMUL = '''
import triton
import triton.language as tl


@triton.jit
def k(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs[:, None] * BLOCK + offs[None, :])
    tl.store(out + offs[:, None] * BLOCK + offs[None, :], tl.dot(v, v))
'''


def kernel(tmp_path: Path, source: str, values: dict[str, str] | None = None,
           *, language: str = "triton") -> KernelSpec:  # fmt: skip
    suffix = ".py" if language == "triton" else ".cu"
    (tmp_path / f"k{suffix}").write_text(source)
    (tmp_path / "ref.py").write_text("def k(**kw):\n    return kw['x']\n")
    table: dict[str, Any] = {
        "name": "k", "source": f"k{suffix}", "entry": "k", "reference": "ref.py:k",
        "grid": ["1"], "dims": {"n": [1, 64]},
        "args": {"x": "in f32[n]", "out": "out f32[n]", "n": "i32 = n"},
        "values": values or {},
    }  # fmt: skip
    if language == "triton":
        table["args"]["BLOCK"] = "const = 64"
    else:
        table["block"] = [64]
    return parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]


def kinds(notes: Any) -> list[str]:
    return [n.kind for n in notes]


def test_exp_on_inputs_that_never_approach_overflow_is_noted(tmp_path: Path) -> None:
    notes = scope_notes(kernel(tmp_path, SOFTMAX, {"x": "normal(0, 4)"}), "triton")
    assert kinds(notes) == ["values"]
    assert "overflow at 88.72" in notes[0].message and "x reaches |x| <= 20" in notes[0].message


@pytest.mark.parametrize("domain", ["auto", "normal(0, 30)", "uniform(-100, 100)"])
def test_exp_on_inputs_that_reach_overflow_is_not_noted(tmp_path: Path, domain: str) -> None:
    assert scope_notes(kernel(tmp_path, SOFTMAX, {"x": domain}), "triton") == ()


def test_a_domain_over_the_dims_is_judged_at_the_largest_dims(tmp_path: Path) -> None:
    reaches = kernel(tmp_path, SOFTMAX, {"x": "uniform(-n * 2, n * 2)"})  # 128 at n = 64
    assert scope_notes(reaches, "triton") == ()
    short = kernel(tmp_path, SOFTMAX, {"x": "uniform(-n, n)"})  # 64 at n = 64
    assert kinds(scope_notes(short, "triton")) == ["values"]


def test_a_normalization_whose_inputs_never_have_a_large_mean_is_noted(tmp_path: Path) -> None:
    notes = scope_notes(kernel(tmp_path, NORM, {"x": "normal(0, 1)"}), "triton")
    assert kinds(notes) == ["values"] and "E[x²] − E[x]²" in notes[0].message
    assert scope_notes(kernel(tmp_path, NORM, {"x": "normal(1000, 1)"}), "triton") == ()
    assert scope_notes(kernel(tmp_path, NORM, {"x": "uniform(500, 501)"}), "triton") == ()


def test_names_in_comments_and_docstrings_do_not_count(tmp_path: Path) -> None:
    plain = SOFTMAX.replace("tl.exp(v) / tl.sum(tl.exp(v), axis=0)", "v")
    assert scope_notes(kernel(tmp_path, plain, {"x": "normal(0, 1)"}), "triton") == ()


def test_cuda_sources_are_read_too(tmp_path: Path) -> None:
    source = ('extern "C" __global__ void k(const float* x, float* out, int n) {\n'
              '    // expf( in a comment\n    int i = threadIdx.x;\n'
              '    if (i < n) out[i] = expf(x[i]);\n}\n')  # fmt: skip
    notes = scope_notes(kernel(tmp_path, source, {"x": "uniform(-1, 1)"}, language="cuda"),
                        "cuda")  # fmt: skip
    assert kinds(notes) == ["values"]


def test_the_interpreter_says_what_it_cannot_show(tmp_path: Path) -> None:
    plain = kernel(tmp_path, SOFTMAX)
    assert scope_notes(plain, "triton") == ()
    notes = scope_notes(plain, "triton-interpreter")
    assert kinds(notes) == ["executor"] and "races" in notes[0].message
    notes = scope_notes(kernel(tmp_path, MATMUL), "triton-interpreter")
    assert kinds(notes) == ["executor", "executor"] and "TF32" in notes[1].message
