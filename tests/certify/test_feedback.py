"""Locating a compiler's error in the kernel source, and refusing an ``entry`` that the
source does not define (read from the source, never run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcert.certify.entry import check_entry
from kcert.certify.errors import SpecError
from kcert.certify.feedback import compiler_error
from kcert.certify.spec import load_spec

TRITON = b'''import triton
import triton.language as tl


@triton.jit
def helper(x):
    return x * yy


@triton.jit
def kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, helper(tl.load(x + offs)))
'''


def test_a_triton_error_in_a_helper_is_placed_at_the_helpers_line() -> None:
    log = ("at 2:15:\ndef helper(x):\n    return x * yy\n               ^\n"
           "NameError('yy is not defined')")  # fmt: skip
    found = compiler_error(log, TRITON, "k.py")
    assert found is not None
    assert (found.file, found.line, found.column) == ("k.py", 7, 16)
    assert found.error == "NameError('yy is not defined')"
    assert found.source_line == "    return x * yy"
    assert found.text().splitlines() == [
        "compiler error at k.py:7:16: NameError('yy is not defined')",
        "        return x * yy", "                   ^"]  # fmt: skip


def test_an_excerpt_that_matches_no_function_line_gets_no_line_number() -> None:
    log = "at 3:4:\n    something_else()\n    ^\nNameError('x')"
    found = compiler_error(log, TRITON, "k.py")
    assert found is not None and found.line is None and found.error == "NameError('x')"


def test_an_nvrtc_error_is_placed_at_its_line() -> None:
    source = b'extern "C" __global__ void k(float* x) {\n    x[0] = yy;\n}\n'
    # NVRTC's own words, as it wrote them for this source
    log = ('k.cu(2): error: identifier "yy" is undefined\n      x[0] = yy;\n             ^\n\n'
           '1 error detected in the compilation of "k.cu".\n')  # fmt: skip
    found = compiler_error(log, source, "k.cu")
    assert found is not None
    assert (found.line, found.column, found.source_line) == (2, 12, "    x[0] = yy;")
    assert found.error == 'identifier "yy" is undefined'
    assert found.text().splitlines()[2] == "    " + " " * 11 + "^"
    bare = compiler_error('k.cu(2): error: identifier "yy" is undefined\n', source, "k.cu")
    assert bare is not None and (bare.line, bare.column) == (2, None)


def test_a_log_without_a_place_gives_none() -> None:
    assert compiler_error("ptxas fatal: out of memory", TRITON, "k.py") is None


def spec_for(tmp_path: Path, source: str, text: bytes, entry: str) -> Path:
    (tmp_path / source).write_bytes(text)
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    args = ('x = "in f32[n]"\nout = "out f32[n]"\nn = "i32 = n"\n'
            + ('BLOCK = "const = 16"\n' if source.endswith(".py") else ""))  # fmt: skip
    launch = 'block = [32]\n' if source.endswith(".cu") else ""
    (tmp_path / "kcert.toml").write_text(
        f'[[kernel]]\nname = "k"\nsource = "{source}"\nentry = "{entry}"\n'
        f'reference = "ref.py:ref"\ngrid = ["1"]\n{launch}dims = {{ n = [1] }}\n'
        f"[kernel.args]\n{args}")  # fmt: skip
    return tmp_path / "kcert.toml"


def test_a_triton_entry_that_is_not_defined_is_a_spec_error(tmp_path: Path) -> None:
    kernel = load_spec(spec_for(tmp_path, "k.py", TRITON, "kernal")).kernels[0]
    with pytest.raises(SpecError) as caught:
        check_entry(kernel)
    text = caught.value.diagnostics()
    assert "kernel 'k': key 'entry': 'kernal' is not defined in k.py" in text
    assert "(@triton.jit functions there: helper, kernel); did you mean 'kernel'?" in text
    check_entry(load_spec(spec_for(tmp_path, "k.py", TRITON, "kernel")).kernels[0])


@pytest.mark.parametrize("module", [
    b"from kernels import *\n",  # names the parse cannot list
    b"import triton\nglobals()['kernal'] = 1\n",  # bound by string: only running it tells
    b"def broken(:\n",  # the build says what is wrong with the source
    b"import triton\ntry:\n    from a import kernal\nexcept ImportError:\n    kernal = None\n",
])  # fmt: skip
def test_what_the_parse_cannot_rule_out_is_left_to_the_build(tmp_path: Path,
                                                            module: bytes) -> None:  # fmt: skip
    check_entry(load_spec(spec_for(tmp_path, "k.py", module, "kernal")).kernels[0])


def test_a_cuda_entry_must_appear_in_the_source(tmp_path: Path) -> None:
    source = b'extern "C" __global__ void scale(float* x, float* out, int n) {}\n'
    kernel = load_spec(spec_for(tmp_path, "k.cu", source, "scal")).kernels[0]
    with pytest.raises(SpecError, match=r"'scal' is not defined in k.cu \(__global__ "
                                        r"functions there: scale\); did you mean 'scale'\?"):
        check_entry(kernel)
    check_entry(load_spec(spec_for(tmp_path, "k.cu", source, "scale")).kernels[0])


def test_lint_carries_nvrtcs_error_at_its_line(tmp_path: Path) -> None:
    from kcert.certify.errors import CompilerUnavailable
    from kcert.certify.lint import lint

    source = b'extern "C" __global__ void k(float* x, float* out, int n) {\n    out[0] = yy;\n}\n'
    kernel = load_spec(spec_for(tmp_path, "k.cu", source, "k")).kernels[0]
    try:
        report = lint(kernel, arch="sm_90")
    except CompilerUnavailable as exc:
        pytest.skip(f"NVRTC is not available here: {exc}")
    build = report.check("build")
    assert build.status == "fail"
    assert build.message.endswith(': identifier "yy" is undefined at k.cu:2')
    assert build.details["compiler_error"] == {
        "file": "k.cu", "line": 2, "column": 14, "source_line": "    out[0] = yy;",
        "error": 'identifier "yy" is undefined'}  # fmt: skip
