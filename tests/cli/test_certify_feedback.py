"""``kcert certify`` for the person or model fixing a kernel: feedback, whole messages,
the compiler's own error, and spec mistakes (an ``entry`` typo, a reshaped reference) that
stop with exit 2 instead of blaming the kernel."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from kcert.cli.app import app

pytest.importorskip("triton")

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.0, mask=mask)


@triton.jit
def broken(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * yy, mask=mask)


@triton.jit
def slightly_off(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.001, mask=mask)
'''

SPEC = '''
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{entry}"
reference = "reference.py:{reference}"
grid = ["cdiv(n, BLOCK)"]
dims = {{ r = [1, 3], c = [1, 4, 33] }}
probes = {{ fresh = 1 }}

[kernel.args]
x = "in f32[r, c]"
out = "out f32[r, c]"
n = "i32 = r * c"
BLOCK = "const = 64"
'''

REFERENCE = '''
def scale(*, x, out, n, BLOCK):
    return 3.0 * x


def transposed(*, x, out, n, BLOCK):
    return (3.0 * x).T
'''


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certify_feedback")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text(REFERENCE)
    kernels = [("broken", "broken", "scale"), ("slightly_off", "slightly_off", "scale"),
               ("typo", "scal", "scale"), ("transposed", "scale", "transposed")]  # fmt: skip
    (folder / "kcert.toml").write_text("".join(
        SPEC.format(name=n, entry=e, reference=r) for n, e, r in kernels))  # fmt: skip
    return folder / "kcert.toml"


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def certify(spec: Path, kernel: str, *extra: str) -> Result:
    return run("certify", str(spec), "--kernel", kernel, "--executor", "triton-interpreter",
               *extra)  # fmt: skip


def one_json(result: Result) -> dict[str, Any]:
    value = json.loads(result.stdout)
    assert isinstance(value, dict)
    return value


def squash(text: str) -> str:
    """Text without whitespace or table rules: what survives any wrapping."""
    return re.sub(r"[\s│┃]", "", text)


def test_a_failed_build_shows_the_compilers_error_at_its_source_line(spec: Path) -> None:
    result = certify(spec, "broken")
    assert result.exit_code == 1, result.output
    out = result.stdout
    line = "    tl.store(out + offs, tl.load(x + offs, mask=mask) * yy, mask=mask)"
    number = textwrap.dedent(KERNELS).splitlines().index(line) + 1
    assert f"NameError('yy is not defined') at kernels.py:{number}" in out  # in the table too
    assert f"compiler error at kernels.py:{number}:{line.index('yy') + 1}: NameError" in out
    lines = out.splitlines()
    shown = next(i for i, s in enumerate(lines) if s.endswith(line.strip()) and "│" not in s)
    assert lines[shown + 1].rstrip().endswith("^")
    assert lines[shown + 1].index("^") == lines[shown].index("yy")  # the caret is on the name
    assert "not run because of the failures above: launch, correctness" in out


def test_feedback_gives_the_smallest_shape_and_the_first_bad_element(spec: Path) -> None:
    result = certify(spec, "slightly_off", "--json")
    assert result.exit_code == 1, result.output
    summary = one_json(result)
    feedback = summary["feedback"]
    assert feedback.startswith("kernel 'slightly_off' (entry 'slightly_off' in kernels.py")
    dims = summary["minimized"]["correctness"]  # JSON sorts keys; the spec lists r, c
    smallest = f"r={dims['r']}, c={dims['c']}"
    assert f"FAILED correctness (first failing probe r=1,c=1; smallest failing shape " \
           f"{smallest})" in feedback
    for part in ("got ", "expected ", "allowed error ", "max abs error ", "max rel ", " ulp"):
        assert part in feedback, part
    # one expected value for the first bad element: never the reference's arrays
    assert feedback.count("expected ") == 1 and len(feedback) < 2000


def test_the_human_table_shows_whole_messages(spec: Path) -> None:
    result = certify(spec, "slightly_off")
    assert result.exit_code == 1, result.output
    table = result.stdout.split("kernel 'slightly_off' (entry")[0]
    row = squash(table).split("correctness")[1].split("coverage")[0]
    assert "..." not in row
    for part in ("expected", "allowederror", "maxabserror", "maxrel", "ulp"):
        assert part in row, part


def test_an_entry_typo_is_a_spec_error_and_nothing_is_signed(spec: Path, tmp_path: Path) -> None:
    key, cert = tmp_path / "k.key", tmp_path / "typo.cert.json"
    assert run("keys", "generate", "--out", str(key)).exit_code == 0
    result = certify(spec, "typo", "--key", str(key), "--out", str(cert), "--json")
    assert result.exit_code == 2, result.output
    error = one_json(result)["error"]
    assert error["type"] == "bad-spec"
    assert "key 'entry': 'scal' is not defined in kernels.py" in error["detail"]
    assert "did you mean 'scale'?" in error["detail"]
    assert not cert.exists()
    assert run("lint", str(spec), "--kernel", "typo").exit_code == 2


def test_a_reference_of_another_shape_is_a_spec_error_not_reshaped(spec: Path) -> None:
    result = certify(spec, "transposed", "--json")
    assert result.exit_code == 2, result.output
    error = one_json(result)["error"]
    assert error["type"] == "bad-spec" and "key 'reference'" in error["detail"]
    assert re.search(r"returned with shape \((\d+), (\d+)\), but the spec declares "
                     r"\(\2, \1\) \(out f32\[r, c\]\)", error["detail"]), error["detail"]
