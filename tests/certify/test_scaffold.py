"""``kcert init``'s library half: guessing a [[kernel]] from a signature."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from kcert.certify.errors import ScaffoldError, SpecError
from kcert.certify.scaffold import scaffold
from kcert.certify.spec import PLACEHOLDER, load_spec

SAXPY = """
// A comment that mentions __global__ void decoy(int* p) must not count.
extern "C" __global__ void saxpy(const float* __restrict__ x, float* __restrict__ y,
                                 float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def kernel_table(folder: Path, name: str) -> dict[str, Any]:
    data = tomllib.loads((folder / "kcert.toml").read_text())
    return next(t for t in data["kernel"] if t["name"] == name)


def test_cuda_scaffold_guesses_intents_and_dtypes(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    result = scaffold(tmp_path / "saxpy.cu")
    assert result.created_spec and result.reference_written
    table = kernel_table(tmp_path, "saxpy")
    assert table["source"] == "saxpy.cu" and table["entry"] == "saxpy"
    assert table["args"] == {"x": "in f32[n]", "y": "inout f32[n]", "a": "f32 = 1.5",
                             "n": "i32 = n"}  # fmt: skip
    assert table["grid"] == ["cdiv(n, 256)"] and table["block"] == [256]
    assert table["dims"] == {"n": PLACEHOLDER}
    assert (tmp_path / "reference.py").read_text().count("def saxpy(*, x, y, a, n)") == 1


def test_placeholder_dims_are_refused_until_filled_in(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    scaffold(tmp_path / "saxpy.cu")
    with pytest.raises(SpecError, match="fill in the sizes") as info:
        load_spec(tmp_path / "kcert.toml")
    assert "key 'dims.n'" in info.value.diagnostics()
    spec = tmp_path / "kcert.toml"
    spec.write_text(spec.read_text().replace(f'n = "{PLACEHOLDER}"', "n = [1, 33, 1000]"))
    kernel = load_spec(spec).kernels[0]
    assert kernel.bind({"n": 33}).grid == (1,)


@pytest.mark.parametrize(
    ("body", "intent"),
    [
        ("y[i] = 1.0f;", "out"),
        ("y[i] += 1.0f;", "inout"),
        ("y[i] = y[i] * 2.0f;", "inout"),
        ("if (y[i] == 0.0f) y[i] = 1.0f;", "inout"),
        ("y[idx[i]] = 1.0f;", "out"),
        ("float* row = y + i; row[0] = 1.0f;", "inout"),
    ],
)
def test_non_const_pointer_intent(tmp_path: Path, body: str, intent: str) -> None:
    source = ('extern "C" __global__ void k(const int* idx, float* y, int n) '
              f"{{ int i = threadIdx.x; {body} }}")  # fmt: skip
    (tmp_path / "k.cu").write_text(source)
    scaffold(tmp_path / "k.cu")
    assert kernel_table(tmp_path, "k")["args"]["y"] == f"{intent} f32[n]"


@pytest.mark.parametrize(
    ("ctype", "dtype"),
    [("double", "f64"), ("unsigned int", "u32"), ("long long", "i64"), ("size_t", "u64"),
     ("const int", "i32"), ("uint8_t", "u8"), ("bool", "bool"), ("__half", "f16"),
     ("__nv_bfloat16", "bf16"), ("short", "i16")],
)  # fmt: skip
def test_scalar_types(tmp_path: Path, ctype: str, dtype: str) -> None:
    source = f'extern "C" __global__ void k(float* out, {ctype} v) {{ out[0] = v; }}'
    (tmp_path / "k.cu").write_text(source)
    scaffold(tmp_path / "k.cu")
    args = kernel_table(tmp_path, "k")["args"]
    assert args["v"].startswith(f"{dtype} = ")
    assert args["out"].startswith("out f32[")


@pytest.mark.parametrize("decl", ["float4* p", "MyStruct s", "float** pp", "int (*fn)(int)",
                                  "float arr[4]", "const Foo& f"])  # fmt: skip
def test_unknown_types_are_refused_with_a_message(tmp_path: Path, decl: str) -> None:
    (tmp_path / "k.cu").write_text(f'extern "C" __global__ void k(float* out, {decl}) {{}}')
    with pytest.raises(ScaffoldError) as info:
        scaffold(tmp_path / "k.cu")
    assert "'k'" in info.value.diagnostics()
    assert not (tmp_path / "kcert.toml").exists()


def test_several_sizes_leave_shapes_and_grid_to_the_user(tmp_path: Path) -> None:
    source = ('extern "C" __global__ void mm(const float* a, const float* b, float* c, '
              "int m, int n, int k) { c[0] = a[0] * b[0]; }")  # fmt: skip
    (tmp_path / "mm.cu").write_text(source)
    result = scaffold(tmp_path / "mm.cu")
    table = kernel_table(tmp_path, "mm")
    assert table["dims"] == {"m": PLACEHOLDER, "n": PLACEHOLDER, "k": PLACEHOLDER}
    assert table["args"]["c"] == f"out f32[{PLACEHOLDER}]"
    assert table["grid"] == [PLACEHOLDER]
    assert any("shape" in note for note in result.notes)
    spec = tmp_path / "kcert.toml"
    spec.write_text(spec.read_text().replace(f'"{PLACEHOLDER}"', "[1, 7]"))
    with pytest.raises(SpecError, match="placeholder") as info:
        load_spec(spec)
    assert "kcert init" in info.value.diagnostics()


def test_several_kernels_need_entry(tmp_path: Path) -> None:
    source = SAXPY + '\nextern "C" __global__ void other(float* o) { o[0] = 1; }\n'
    (tmp_path / "k.cu").write_text(source)
    with pytest.raises(ScaffoldError, match="--entry"):
        scaffold(tmp_path / "k.cu")
    assert scaffold(tmp_path / "k.cu", entry="other").name == "other"
    with pytest.raises(ScaffoldError, match="found: saxpy, other"):
        scaffold(tmp_path / "k.cu", entry="nope")


def test_missing_extern_c_is_noted(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(SAXPY.replace('extern "C" ', ""))
    result = scaffold(tmp_path / "k.cu")
    assert any('extern "C"' in note for note in result.notes)


def test_appends_and_refuses_duplicates(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    (tmp_path / "copy.cu").write_text(SAXPY.replace("saxpy", "saxpy2"))
    (tmp_path / "reference.py").write_text("def mine():\n    return 1\n")
    first = scaffold(tmp_path / "saxpy.cu")
    assert first.created_spec and not first.reference_written
    assert (tmp_path / "reference.py").read_text() == "def mine():\n    return 1\n"
    assert any("reference.py" in note for note in first.notes)
    second = scaffold(tmp_path / "copy.cu")
    assert not second.created_spec
    data = tomllib.loads((tmp_path / "kcert.toml").read_text())
    assert [t["name"] for t in data["kernel"]] == ["saxpy", "saxpy2"]
    before = (tmp_path / "kcert.toml").read_text()
    with pytest.raises(ScaffoldError, match="already has a"):
        scaffold(tmp_path / "saxpy.cu")
    assert (tmp_path / "kcert.toml").read_text() == before


def test_unreadable_existing_spec_is_not_touched(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    (tmp_path / "kcert.toml").write_text("[[kernel]\n")
    with pytest.raises(ScaffoldError, match="cannot be read as TOML"):
        scaffold(tmp_path / "saxpy.cu")
    assert (tmp_path / "kcert.toml").read_text() == "[[kernel]\n"


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [("k.cu", "int main() {}", "no '__global__"), ("k.py", "def f(:", "not valid Python"),
     ("k.py", "def f(x):\n    pass\n", "no @triton.jit"), ("k.c", "", "must be CUDA C"),
     ("k.cu", 'extern "C" __global__ void k() {}', "takes no parameters")],
)  # fmt: skip
def test_bad_sources(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ScaffoldError, match=fragment):
        scaffold(tmp_path / name)


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="not a file"):
        scaffold(tmp_path / "nope.cu")


TRITON = """
import triton
import triton.language as tl


@triton.jit
def fused(x_ptr, w_ptr, acc_ptr, out_ptr, eps, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    base = x_ptr + offs
    x = tl.load(base, mask=mask)
    w = tl.load(w_ptr + offs * 1, mask=mask)
    a = tl.load(acc_ptr + offs, mask=mask)
    tl.store(acc_ptr + offs, a + x * w, mask=mask)
    tl.store(out_ptr + offs * n // n, x / (w + eps), mask=mask)
"""


def test_triton_scaffold(tmp_path: Path) -> None:
    (tmp_path / "fused.py").write_text(TRITON)
    result = scaffold(tmp_path / "fused.py")
    table = kernel_table(tmp_path, "fused")
    assert table["args"] == {
        "x_ptr": "in f32[n]", "w_ptr": "in f32[n]", "acc_ptr": "inout f32[n]",
        "out_ptr": "out f32[n]", "eps": "f32 = 1.5", "n": "i32 = n", "BLOCK": "const = 128",
    }  # fmt: skip
    assert table["grid"] == ["cdiv(n, BLOCK)"]
    assert "block" not in table
    assert any("f32" in note for note in result.notes)
