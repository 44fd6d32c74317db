"""Fresh probes on tile boundaries: sizes at multiples of likely block sizes, and one off them.

A wrong program-id mapping (tiles that overlap or leave a gap) hides wherever the
last, partial tile masks it away; it shows at an exact multiple of the tile with
two tiles or more. The draw must reach those sizes for every block size a kernel
may use, their neighbours too, without a probe per block size.
"""

from __future__ import annotations

from pathlib import Path

from kcert.certify.sizes import TILE_SIZES, fresh_dims, tile_sizes
from kcert.certify.spec import KernelSpec, load_spec


def _kernel(tmp_path: Path, dims: str, args: str = 'x = "out f32[n]"',
            probes: str = "") -> KernelSpec:  # fmt: skip
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(f"""
[[kernel]]
name = "k"
source = "k.py"
entry = "k"
reference = "ref.py:ref"
grid = ["1"]
dims = {dims}
{probes}
[kernel.args]
{args}
""")
    return load_spec(tmp_path / "kcert.toml").kernel("k")


def test_every_likely_block_size_gets_two_tiles_or_more_and_both_neighbours(
        tmp_path: Path) -> None:  # fmt: skip
    kernel = _kernel(tmp_path, "{ n = [1, 33, 1024, 3000] }")  # capped at 6000
    blocks = [b for b in TILE_SIZES if 2 * b <= 6000]
    assert blocks == [16, 32, 64, 128, 256, 512, 1024, 2048]
    below = above = 0
    for seed in range(30):
        sizes = [d["n"] for d in fresh_dims(kernel, seed, 4)]
        assert fresh_dims(kernel, seed, 4) == fresh_dims(kernel, seed, 4)
        assert len(sizes) <= 4 + 2 and max(sizes) <= 6000
        for block in blocks:
            # the size at which BLOCK_SIZE - 1 strides (swiglu's pid_stride_off) leave a gap
            assert any(s % block == 0 and s >= 2 * block for s in sizes), (seed, block, sizes)
            near = [s for s in sizes if s % block in (1, block - 1) and s > 2 * block - 2]
            assert near, (seed, block, sizes)
        below += any(s % 2048 == 2047 for s in sizes)
        above += any(s % 2048 == 1 and s > 4096 for s in sizes)
    assert below >= 8 and above >= 8, (below, above)  # the sign is drawn per seed


def test_the_pid_stride_off_gap_shows_at_the_tile_probe(tmp_path: Path) -> None:
    # offsets = pid * (BLOCK - 1) + arange(BLOCK): programs cover [0, k * (BLOCK - 1)]
    # for k = cdiv(n, BLOCK), so an element is missed only for n in (k*1023 + 1, k*1024]
    def missed(n: int, block: int = 1024) -> bool:
        k = -(-n // block)
        return n > k * (block - 1) + 1

    kernel = _kernel(tmp_path, "{ n = [1, 33, 1024, 3000] }")
    assert not any(missed(n) for n in (1, 33, 1024, 3000))  # the listed sizes never show it
    for seed in range(30):
        assert any(missed(d["n"]) for d in fresh_dims(kernel, seed, 4)), seed


def test_tile_probes_are_bounded_and_fit_max_elements(tmp_path: Path) -> None:
    kernel = _kernel(
        tmp_path,
        "{ m = [1, 3, 15], n = [1, 100, 5000], d = [64] }",
        'x = "out f32[m, n, d]"',
        "[kernel.probes]\nmax_elements = 300000\n",
    )
    tiles = tile_sizes(kernel, 3)
    assert set(tiles) == {"n"}  # m's cap (30) holds no two tiles of 16; d is fixed
    assert tiles["n"].tile == 4096 and tiles["n"].multiple == 8192  # the cap is 10000
    for seed in range(20):
        probes = fresh_dims(kernel, seed, 4)
        assert len(probes) <= 4 + 3  # a joint and two tile probes, whatever the dims
        for dims in probes:
            assert dims["m"] * dims["n"] * dims["d"] <= 300000
        draw = tile_sizes(kernel, seed)["n"]
        tiled = [d for d in probes if d["n"] % 32 in (0, 1, 31) and d["n"] >= 32]
        # halved to fit: still on a boundary of 16 elements, at two tiles or more
        assert any(d["n"] % 16 == 0 and d["n"] < draw.multiple for d in tiled), probes
    assert fresh_dims(kernel, 3, 0) == []


def test_no_tile_probe_where_no_two_tiles_fit_or_sizes_are_listed_only(tmp_path: Path) -> None:
    small = _kernel(tmp_path, "{ n = [1, 5, 15] }")  # cap 30: not two tiles of 16
    assert tile_sizes(small, 1) == {}
    assert len(fresh_dims(small, 1, 4)) <= 4
    listed = _kernel(
        tmp_path,
        "{ n = [1, 64, 1000] }",
        probes=('[kernel.probes]\ndraw_up_to = { n = "listed" }\n'),
    )
    assert tile_sizes(listed, 1) == {}
    capped = _kernel(
        tmp_path, "{ n = [1, 64, 1000] }", probes=("[kernel.probes]\ndraw_up_to = { n = 100000 }\n")
    )
    draw = tile_sizes(capped, 5)["n"]
    assert draw.tile == 4096 and 8192 <= draw.multiple <= 100000
    assert draw.other % 4096 == 0 and draw.other + draw.step <= 100000
