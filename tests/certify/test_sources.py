"""Inputs are read once, when the spec is loaded; CUDA includes are local headers only."""

from __future__ import annotations

from pathlib import Path

from kcert.certify.lint import lint
from kcert.certify.spec import load_spec

SPEC = """
[[kernel]]
name = "k"
source = "k.cu"
entry = "k"
reference = "reference.py:ref"
grid = ["1"]
block = [32]
dims = { n = [1] }

[kernel.args]
x = "out f32[n]"
n = "i32 = n"
"""
REFERENCE = (
    "SECRET_REFERENCE_LINE = 'the reference must never reach a build log'\n"
    "def ref(x, n):\n    return x\n"
)


def _spec(folder: Path, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kcert.toml").write_text(SPEC)
    (folder / "reference.py").write_text(REFERENCE)
    (folder / "k.cu").write_text(source)
    return folder / "kcert.toml"


def test_a_local_header_is_read_once_and_builds(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        '#include "sub/value.cuh"\n'
        'extern "C" __global__ void k(float* x, int n) { if (n) x[0] = VALUE; }\n',
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "value.cuh").write_text("#define VALUE 2.0f\n")
    kernel = load_spec(spec).kernels[0]
    assert [f.name for f in kernel.code.includes] == ["sub/value.cuh"]
    # changed on disk after loading: the build still sees the bytes read at load time
    (tmp_path / "sub" / "value.cuh").write_text("#error changed after loading\n")
    (tmp_path / "k.cu").write_text("#error changed after loading\n")
    report = lint(kernel, arch="sm_90")
    assert report.ok, report.checks[0].message


def test_the_reference_and_files_outside_are_never_read_as_includes(tmp_path: Path) -> None:
    secret = tmp_path / "secret.h"
    secret.write_text("SECRET_OUTSIDE_THE_SPEC_FOLDER\n")
    spec = _spec(
        tmp_path / "spec",
        '#include "reference.py"\n#include "../secret.h"\n'
        f'#include "{secret}"\n'
        'extern "C" __global__ void k(float* x, int n) { x[0] = 1.0f; }\n',
    )
    kernel = load_spec(spec).kernels[0]
    assert kernel.code.includes == ()
    report = lint(kernel, arch="sm_90")
    assert not report.ok
    log = str(report.checks[0].details.get("log", "")) + report.checks[0].message
    assert "cannot open source file" in log  # NVRTC, in the sandbox, cannot see them either
    assert "SECRET" not in log


def test_a_header_that_links_to_the_reference_or_outside_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside.cuh"
    outside.write_text("#define SECRET_OUTSIDE 1\n")
    spec = _spec(
        tmp_path / "spec",
        '#include "ref.cuh"\n#include "out.cuh"\n'
        'extern "C" __global__ void k(float* x, int n) { x[0] = 1.0f; }\n',
    )
    (tmp_path / "spec" / "ref.cuh").symlink_to(tmp_path / "spec" / "reference.py")
    (tmp_path / "spec" / "out.cuh").symlink_to(outside)
    kernel = load_spec(spec).kernels[0]
    assert kernel.code.includes == ()
