"""NVRTC and Triton builds, for real: compile, read the ptxas report, cache by content."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcert.certify.build import (
    Build,
    BuildError,
    arch_for_hw,
    build_cuda,
    cache_dir,
    check_arch,
    nvrtc_version,
    parse_ptxas_report,
    ptx_entries,
    ptx_param_sizes,
)
from kcert.certify.errors import ArchError, SpecError
from kcert.certify.report import Resources
from kcert.certify.spec import KernelSpec, load_spec
from kcert.digest import Digest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SAXPY = """
extern "C" __global__ void saxpy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

HEAVY = """
extern "C" __global__ void heavy(const float* __restrict__ x, float* __restrict__ y, int n) {
    float acc[48];
#pragma unroll
    for (int j = 0; j < 48; ++j) acc[j] = x[threadIdx.x + j * n];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 48; ++j) acc[j] = acc[j] * acc[(j + r) % 48] + 1.0f;
    float s = 0;
#pragma unroll
    for (int j = 0; j < 48; ++j) s += acc[j];
    y[threadIdx.x] = s;
}
"""

LOCAL = """
__device__ __noinline__ float pick(const float* a, int i) { return a[i & 63]; }
extern "C" __global__ void local_array(const float* x, float* y, int n) {
    __shared__ float tile[128];
    float a[64];
    for (int j = 0; j < 64; ++j) a[j] = x[j * n + threadIdx.x];
    tile[threadIdx.x % 128] = a[threadIdx.x % 64];
    __syncthreads();
    y[threadIdx.x] = tile[(threadIdx.x + 1) % 128] + pick(a, threadIdx.x * 7);
}
"""


def make_kernel(folder: Path, source: str, *, entry: str, args: str, options: str = "",
                name: str = "k.cu") -> KernelSpec:  # fmt: skip
    """Write a one-kernel spec around ``source`` and load it."""
    (folder / name).write_text(source)
    (folder / "ref.py").write_text("def ref(**kw):\n    return None\n")
    build = f"\n[kernel.build]\noptions = [{options}]\n" if options else ""
    (folder / "kcert.toml").write_text(
        f'[[kernel]]\nname = "{entry}"\nsource = "{name}"\nentry = "{entry}"\n'
        'reference = "ref.py:ref"\ngrid = ["1"]\nblock = [128]\ndims = { n = [1, 33] }\n'
        f"{build}\n[kernel.args]\n{args}\n"
    )
    return load_spec(folder / "kcert.toml").kernels[0]


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("KCERT_HOME", str(home))
    return home


SAXPY_ARGS = 'x = "in f32[n]"\ny = "inout f32[n]"\na = "f32 = 2"\nn = "i32 = n"'


@pytest.mark.parametrize(
    ("hw", "arch"),
    [("H100", "sm_90"), ("h100", "sm_90"), ("H200", "sm_90"), ("GH200", "sm_90"),
     ("A100", "sm_80"), ("L4", "sm_89"), ("L40S", "sm_89"), ("l40s", "sm_89"),
     ("B200", "sm_100")],
)  # fmt: skip
def test_arch_for_hw(hw: str, arch: str) -> None:
    assert arch_for_hw(hw) == arch


def test_unknown_hw_lists_known_classes() -> None:
    with pytest.raises(ArchError) as info:
        arch_for_hw("TPUv5")
    message = info.value.diagnostics()
    assert "TPUv5" in message and "H100" in message and "A100" in message and "--arch" in message


@pytest.mark.parametrize("arch", ["sm90", "90", "compute_90", "sm_9", "sm_90; rm -rf /", ""])
def test_bad_arch_names(arch: str) -> None:
    with pytest.raises(ArchError):
        check_arch(arch)


def test_nvrtc_version_looks_like_one() -> None:
    major, minor = nvrtc_version().split(".")
    assert int(major) >= 12 and int(minor) >= 0


def test_build_saxpy(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS)
    build = build_cuda(kernel, arch="sm_90")
    assert isinstance(build, Build)
    assert build.cubin.startswith(b"\x7fELF")
    assert ptx_entries(build.ptx_text) == ("saxpy",)
    assert ".target sm_90" in build.ptx_text
    assert "\x00" not in build.log and "\x00" not in build.ptx_text
    assert "Compiling entry function 'saxpy'" in build.log
    r = build.resources
    assert r is not None and 4 <= r.registers <= 64
    assert (r.spill_stores, r.spill_loads, r.stack_bytes, r.local_bytes) == (0, 0, 0, 0)
    assert build.digest == Digest.of_bytes(build.cubin)
    record = build.record()
    assert record.cubin_digest == str(build.digest)
    assert record.ptx_digest == str(Digest.of_bytes(build.ptx))
    assert record.compiler == f"nvrtc {nvrtc_version()}"
    assert record.options[:2] == ("--gpu-architecture=sm_90", "--ptxas-options=-v")
    assert record.resources == r


def test_architecture_changes_the_cubin(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS)
    hopper, ampere = build_cuda(kernel, arch="sm_90"), build_cuda(kernel, arch="sm_80")
    assert ".target sm_80" in ampere.ptx_text
    assert hopper.digest != ampere.digest


def test_spills_and_local_memory_are_reported(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, HEAVY, entry="heavy", options='"--maxrregcount=24"',
                         args='x = "in f32[n]"\ny = "out f32[n]"\nn = "i32 = n"')  # fmt: skip
    r = build_cuda(kernel, arch="sm_90").resources
    assert r is not None
    assert r.registers <= 24
    assert r.spill_stores > 0 and r.spill_loads > 0
    assert r.local_bytes >= r.stack_bytes > 0
    args = 'x = "in f32[n]"\ny = "out f32[n]"\nn = "i32 = n"'
    unconstrained = make_kernel(tmp_path, HEAVY, entry="heavy", args=args)
    free = build_cuda(unconstrained, arch="sm_90").resources
    assert free is not None and free.registers > 24 and free.spill_stores == 0


def test_shared_barriers_and_callee_stack(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, LOCAL, entry="local_array",
                         args='x = "in f32[n]"\ny = "out f32[n]"\nn = "i32 = n"')  # fmt: skip
    build = build_cuda(kernel, arch="sm_90")
    r = build.resources
    assert r is not None
    assert r.shared_bytes == 128 * 4
    assert r.barriers == 1
    assert r.stack_bytes >= 64 * 4
    # The non-inlined helper's section follows the entry's; it must not overwrite it.
    assert "_Z4pickPKfi" in build.log or "pick" in build.log


def test_compile_error_carries_the_log(tmp_path: Path) -> None:
    broken = SAXPY.replace("a * x[i]", "a * undefined_thing")
    kernel = make_kernel(tmp_path, broken, entry="saxpy", args=SAXPY_ARGS)
    with pytest.raises(BuildError) as info:
        build_cuda(kernel, arch="sm_90")
    assert "undefined_thing" in info.value.log
    assert "k.cu(4)" in info.value.log
    assert "does not compile" in info.value.diagnostics()
    assert "undefined_thing" in info.value.diagnostics()


def test_missing_extern_c_is_explained(tmp_path: Path) -> None:
    mangled = SAXPY.replace('extern "C" ', "")
    kernel = make_kernel(tmp_path, mangled, entry="saxpy", args=SAXPY_ARGS)
    with pytest.raises(BuildError, match='extern "C"') as info:
        build_cuda(kernel, arch="sm_90")
    assert "_Z5saxpyPKfPffi" in info.value.diagnostics()


def test_bad_option_is_a_build_error(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS,
                         options='"--no-such-option"')  # fmt: skip
    with pytest.raises(BuildError, match="refused the options") as info:
        build_cuda(kernel, arch="sm_90")
    assert "--no-such-option" in info.value.log


def test_architecture_in_spec_options_is_refused(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS,
                         options='"-arch=sm_80"')  # fmt: skip
    with pytest.raises(SpecError, match="build.options"):
        build_cuda(kernel, arch="sm_90")


def test_cache_hits_and_keys(tmp_path: Path, kcert_home: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS)
    first = build_cuda(kernel, arch="sm_90")
    assert not first.cached
    assert cache_dir() == kcert_home / "cache" / "builds"
    entries = [p for p in cache_dir().iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    second = build_cuda(kernel, arch="sm_90")
    assert second.cached
    assert (second.digest, second.ptx, second.log, second.resources) == (
        first.digest, first.ptx, first.log, first.resources,
    )  # fmt: skip
    # Every input of the build is part of the key.
    assert not build_cuda(kernel, arch="sm_80").cached
    edited = make_kernel(tmp_path, SAXPY + "\n// edited\n", entry="saxpy", args=SAXPY_ARGS)
    assert not build_cuda(edited, arch="sm_90").cached
    optioned = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS,
                           options='"-lineinfo"')  # fmt: skip
    assert not build_cuda(optioned, arch="sm_90").cached


def test_damaged_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS)
    good = build_cuda(kernel, arch="sm_90")
    (entry,) = [p for p in cache_dir().iterdir() if not p.name.startswith(".")]
    (entry / "kernel.cubin").write_bytes(b"tampered")
    again = build_cuda(kernel, arch="sm_90")
    assert not again.cached
    assert again.cubin == good.cubin


def test_unwritable_cache_still_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("KCERT_HOME", str(blocker))
    kernel = make_kernel(tmp_path, SAXPY, entry="saxpy", args=SAXPY_ARGS)
    assert build_cuda(kernel, arch="sm_90").resources is not None


# --------------------------------------------------------------- the ptxas report


REPORT = """\
ptxas info    : 7 bytes gmem
ptxas info    : Compiling entry function 'other' for 'sm_90'
ptxas info    : Function properties for other
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 99 registers, used 1 barriers, 99 bytes smem
ptxas info    : Compiling entry function 'main_k' for 'sm_90'
ptxas info    : Function properties for main_k
ptxas         .     16 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 40 registers, used 2 barriers, 2048 bytes smem, 380 bytes cmem[0], \
8 bytes cmem[2], 48 bytes cumulative stack size
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_parse_report_picks_the_entry() -> None:
    assert parse_ptxas_report(REPORT, "main_k") == Resources(
        registers=40, spill_stores=12, spill_loads=20, stack_bytes=16, shared_bytes=2048,
        const_bytes=388, local_bytes=48, barriers=2,
    )  # fmt: skip
    other = parse_ptxas_report(REPORT, "other")
    assert other is not None and other.registers == 99 and other.local_bytes == 8


def test_parse_report_lmem_and_absent_entries() -> None:
    log = REPORT.replace("48 bytes cumulative stack size", "64 bytes lmem")
    resources = parse_ptxas_report(log, "main_k")
    assert resources is not None and resources.local_bytes == 64
    assert parse_ptxas_report(REPORT, "nope") is None
    assert parse_ptxas_report("", "main_k") is None
    assert parse_ptxas_report(REPORT, "_Z6helperPfi") is None  # no "Used" line for callees


def test_ptx_param_sizes() -> None:
    ptx = """
.visible .entry k(
	.param .u64 .ptr .align 1 k_param_0,
	.param .f32 k_param_1,
	.param .u32 k_param_2,
	.param .align 2 .b8 k_param_3[2],
	.param .u8 k_param_4
)
{ ret; }
"""
    assert ptx_param_sizes(ptx, "k") == (8, 4, 4, 2, 1)
    assert ptx_param_sizes(ptx, "missing") is None
    assert ptx_entries(ptx) == ("k",)


# --------------------------------------------------------------------------- Triton


@pytest.mark.triton
def test_triton_example_builds_without_a_gpu() -> None:
    from kcert.certify.triton_build import build_triton_sets, const_sets

    kernel = load_spec(EXAMPLES / "triton" / "kcert.toml").kernel("saxpy")
    (consts,) = const_sets(kernel)
    assert consts == {"BLOCK": 1024}
    build = build_triton_sets(kernel, arch="sm_90", const_sets=[consts])[0]
    assert build.language == "triton"
    assert ptx_entries(build.ptx_text) == ("saxpy",)
    assert build.cubin.startswith(b"\x7fELF")
    assert build.resources is not None and build.resources.registers > 0
    assert "BLOCK=1024" in build.options
    assert build.compiler.startswith("triton ")
    assert build_triton_sets(kernel, arch="sm_90", const_sets=[consts])[0].cached


def test_triton_const_sets_follow_the_dims(tmp_path: Path) -> None:
    from kcert.certify.triton_build import const_sets

    source = (EXAMPLES / "triton" / "saxpy.py").read_text()
    (tmp_path / "k.py").write_text(source)
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "saxpy"\nsource = "k.py"\nentry = "saxpy"\n'
        'reference = "ref.py:ref"\ngrid = ["cdiv(n, BLOCK)"]\n'
        "dims = { n = [1, 3, 100, 5000] }\n[kernel.args]\n"
        'x_ptr = "in f32[n]"\ny_ptr = "inout f32[n]"\na = "f32 = 1"\nn = "i32 = n"\n'
        'BLOCK = "const = min(1024, next_pow2(n))"\n'
    )
    kernel = load_spec(tmp_path / "kcert.toml").kernels[0]
    assert const_sets(kernel) == [{"BLOCK": 1024}, {"BLOCK": 128}, {"BLOCK": 4}, {"BLOCK": 1}]


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("import triton\n\ndef saxpy(x_ptr, y_ptr, a, n, BLOCK):\n    pass\n",
         "not a @triton.jit function"),
        ("import triton\nraise RuntimeError('boom at import')\n", "boom at import"),
        ("import triton\n", "has no function 'saxpy'"),
        ("def broken(:\n", "does not import"),
    ],
)  # fmt: skip
@pytest.mark.triton
def test_triton_source_problems(tmp_path: Path, source: str, fragment: str) -> None:
    from kcert.certify.triton_build import build_triton_sets

    (tmp_path / "k.py").write_text(source)
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "saxpy"\nsource = "k.py"\nentry = "saxpy"\n'
        'reference = "ref.py:ref"\ngrid = ["1"]\ndims = { n = [1] }\n[kernel.args]\n'
        'x_ptr = "in f32[n]"\ny_ptr = "inout f32[n]"\na = "f32 = 1"\nn = "i32 = n"\n'
        'BLOCK = "const = 16"\n'
    )
    kernel = load_spec(tmp_path / "kcert.toml").kernels[0]
    with pytest.raises(BuildError, match=fragment):
        build_triton_sets(kernel, arch="sm_90", const_sets=[{"BLOCK": 16}])[0]


@pytest.mark.triton
def test_triton_args_must_match_parameters(tmp_path: Path) -> None:
    from kcert.certify.triton_build import build_triton_sets

    (tmp_path / "k.py").write_text((EXAMPLES / "triton" / "saxpy.py").read_text())
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "saxpy"\nsource = "k.py"\nentry = "saxpy"\n'
        'reference = "ref.py:ref"\ngrid = ["1"]\ndims = { n = [1] }\n[kernel.args]\n'
        'x_ptr = "in f32[n]"\ny = "inout f32[n]"\na = "f32 = 1"\nn = "i32 = n"\n'
        'BLOCK = "const = 16"\n'
    )
    kernel = load_spec(tmp_path / "kcert.toml").kernels[0]
    with pytest.raises(SpecError, match="missing y_ptr") as info:
        build_triton_sets(kernel, arch="sm_90", const_sets=[{"BLOCK": 16}])[0]
    assert "key 'args'" in info.value.diagnostics()


@pytest.mark.triton
def test_triton_compile_error_is_a_build_error(tmp_path: Path) -> None:
    from kcert.certify.triton_build import build_triton_sets

    source = (EXAMPLES / "triton" / "saxpy.py").read_text().replace(
        "a * x + y", "a * x + y + tl.no_such_function(x)"
    )
    (tmp_path / "k.py").write_text(source)
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "saxpy"\nsource = "k.py"\nentry = "saxpy"\n'
        'reference = "ref.py:ref"\ngrid = ["1"]\ndims = { n = [1] }\n[kernel.args]\n'
        'x_ptr = "in f32[n]"\ny_ptr = "inout f32[n]"\na = "f32 = 1"\nn = "i32 = n"\n'
        'BLOCK = "const = 16"\n'
    )
    kernel = load_spec(tmp_path / "kcert.toml").kernels[0]
    with pytest.raises(BuildError, match="Triton cannot compile") as info:
        build_triton_sets(kernel, arch="sm_90", const_sets=[{"BLOCK": 16}])[0]
    assert "no_such_function" in info.value.log
