"""Test conditions that no kernel can tune itself to: drawn buffer contents, addresses, sizes.

The kernels in tests/assets/conditions each passed certification while kcert's
conditions were fixed; each must now fail for the reason it was written to
show, and their correct twin must pass under the same conditions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kcert.attest.statement import validate_predicate
from kcert.certify.conditions import (
    SMALL_GUARD_EXP,
    buffer_shifts,
    draw_conditions,
    guard_fill,
    out_fills,
)  # fmt: skip
from kcert.certify.errors import SpecError
from kcert.certify.executors.base import host_dtype
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import CertificationReport, Status, Verdict
from kcert.certify.sizes import MODULI, drawn_sizes
from kcert.certify.spec import load_spec, parse_spec
from kcert.certify.tolerance import float_info

SPEC = Path(__file__).resolve().parents[1] / "assets" / "conditions" / "kcert.toml"
FRESH_SEED = 7


def certify_kernel(name: str, *, minimize: bool = False, seed: int = FRESH_SEED,
                   ) -> CertificationReport:  # fmt: skip
    kernel = load_spec(SPEC).kernel(name)
    options = CertifyOptions(executor="triton-interpreter", fresh_seed=seed, minimize=minimize)
    return certify(kernel, options)


def failed(report: CertificationReport) -> dict[str, str]:
    return {c.name: c.message for c in report.checks if c.status is Status.FAIL}


# ---------------------------------------------------------------------------- drawn conditions


def test_conditions_come_from_the_fresh_seed_and_are_never_the_old_fixed_ones() -> None:
    assert draw_conditions(5, "n=33") == draw_conditions(5, "n=33")
    shifts_a, shifts_b = set(), set()
    for seed in range(64):
        runs = draw_conditions(seed, "n=33")
        assert runs["A"].shift % 16 == 0 and runs["A"].shift % 256 != 0
        assert runs["B"].shift % 256 == 0 and runs["A"].seed != runs["B"].seed
        shifts_a.add(runs["A"].shift)
        shifts_b.add(runs["B"].shift)
    assert len(shifts_a) > 40 and len(shifts_b) >= 12  # drawn, not two fixed layouts
    assert draw_conditions(1, "n=33") != draw_conditions(2, "n=33")


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_a_write_of_guard_plus_a_little_never_rounds_back(dtype: str) -> None:
    runs = draw_conditions(3, "n=1")
    a = guard_fill(dtype, 4096, runs["A"], "out")
    b = guard_fill(dtype, 4096, runs["B"], "out")
    little = 2.0**-20  # about 1e-6
    np_dtype = host_dtype(dtype)
    for guard in (a, b):
        small = np.isfinite(guard) & (np.abs(guard.astype(np.float64)) < 2.0**SMALL_GUARD_EXP)
        written = (guard[small].astype(np.float64) + little).astype(np_dtype)
        assert (written.view(np.uint8) != guard[small].view(np.uint8)).reshape(
            written.size, -1).any(axis=1).all()
    # an element is small in one of the two runs two times in three (a region of up to
    # 512 elements draws its pair whole, so one draw of 4096 varies: over 24 draws)
    shares = []
    for seed in range(24):
        pair = [guard_fill(dtype, 4096, draw_conditions(seed, "n=1")[run], "out")
                for run in ("A", "B")]  # fmt: skip
        either = (np.abs(pair[0].astype(np.float64)) < 2.0**SMALL_GUARD_EXP) | (
            np.abs(pair[1].astype(np.float64)) < 2.0**SMALL_GUARD_EXP)
        shares.append(either.mean())
    assert 0.6 < np.mean(shares) < 0.75, np.mean(shares)
    # what the old fixed poison did: the write rounded back to the very same bytes
    old = np.array(-float(float_info(dtype).max) / 3, dtype=np_dtype)
    assert (old.astype(np.float64) + 1e-3).astype(np_dtype).tobytes() == old.tobytes()


# ---------------------------------------------------------------------------- drawn sizes


def _spec(tmp_path: Path, dims: str, probes: str = "") -> str:
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(f'''
[[kernel]]
name = "k"
source = "k.py"
entry = "k"
reference = "ref.py:ref"
grid = ["1"]
dims = {dims}
{probes}
[kernel.args]
x = "out f32[n, d]"
''')
    return str(tmp_path / "kcert.toml")


def test_drawn_sizes_cover_residues_primes_and_reach_past_the_listed(tmp_path: Path) -> None:
    path = _spec(tmp_path, "{ n = [1, 8, 64, 1000], d = [64] }")
    kernel = load_spec(Path(path)).kernel("k")
    for seed in range(20):
        sizes = drawn_sizes(kernel, seed, 4)
        assert sizes["d"] == ()  # one listed value: a fixed size
        n = sizes["n"]
        assert 1000 < n[0] <= 2000  # anywhere past the listed, up to the default cap
        assert 2000 - 1000 // 8 <= n[1] <= 2000  # and one near the cap
        assert all(1 <= v <= 1000 for v in n[2:])
        residues = {v % 4 for v in (1, 8, 64, 1000, *n)}
        assert residues == {0, 1, 2, 3}, (seed, n)
        assert any(v > 2 and all(v % p for p in range(2, v)) for v in n)  # a prime
    assert len({drawn_sizes(kernel, s, 4)["n"] for s in range(20)}) == 20
    assert set(MODULI) >= {2, 4, 8}


def test_the_size_past_the_listed_reaches_every_part_of_the_stretch(tmp_path: Path) -> None:
    path = _spec(tmp_path, "{ n = [1, 8, 64, 4096], d = [64] }")
    kernel = load_spec(Path(path)).kernel("k")
    firsts = [drawn_sizes(kernel, seed, 4)["n"][0] for seed in range(64)]
    eighths = {(v - 4097) * 8 // 4096 for v in firsts}
    assert all(4096 < v <= 8192 for v in firsts) and eighths == set(range(8)), sorted(firsts)
    assert drawn_sizes(kernel, 3, 2)["n"][1] <= 4096  # two draws: no second large one


def test_draw_up_to_sets_the_cap_or_keeps_the_listed_values(tmp_path: Path) -> None:
    path = _spec(tmp_path, "{ n = [1, 8, 64], d = [16, 64] }",
                 '[kernel.probes]\ndraw_up_to = { n = 100000, d = "listed" }\n')
    kernel = load_spec(Path(path)).kernel("k")
    sizes = drawn_sizes(kernel, 1, 4)
    assert sizes["d"] == () and 64 < sizes["n"][0] <= 100000
    assert 100000 - 100000 // 8 <= sizes["n"][1] <= 100000
    assert kernel.normalized()["probes"]["draw_up_to"] == {"d": "listed", "n": 100000}
    for bad, word in (("{ m = 5 }", "'m' is not a dim"), ("{ n = 10 }", "largest listed"),
                      ('{ n = "all" }', "must be")):  # fmt: skip
        path = _spec(tmp_path, "{ n = [1, 8, 64], d = [16] }",
                     f"[kernel.probes]\ndraw_up_to = {bad}\n")
        with pytest.raises(SpecError, match=word) as info:
            load_spec(Path(path))
        assert "probes.draw_up_to" in info.value.diagnostics()


def test_a_spec_without_the_key_keeps_its_digest(tmp_path: Path) -> None:
    path = _spec(tmp_path, "{ n = [1, 8], d = [16] }")
    kernel = load_spec(Path(path)).kernel("k")
    assert "draw_up_to" not in kernel.normalized()["probes"]
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": {"n": [1, 8], "d": [16]}, "args": {"x": "out f32[n, d]"}}
    again = parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]
    assert again.digest == kernel.digest


# ---------------------------------------------------------------------------- the kernels


@pytest.mark.triton
def test_the_correct_twin_passes_and_the_certificate_records_conditions_and_scope() -> None:
    report = certify_kernel("add")
    assert report.verdict is Verdict.PASS, failed(report)
    predicate = json.loads(json.dumps(report.predicate()))
    validate_predicate(predicate)
    probes = predicate["probes"]
    assert probes["conditions"] == "kcert-conditions-v3"
    scope = probes["scope"]["n"]
    assert scope["listed"] == [1, 5, 8, 64, 1000, 4096] and scope["draw_up_to"] == 8192
    assert scope["drawn"] and scope["max"] > 4096 and scope["min"] == 1
    assert {v % 4 for v in scope["listed"] + scope["drawn"]} == {0, 1, 2, 3}
    for item in probes["items"]:
        assert item["conditions"] == {run: c.to_json(["x", "y", "out"]) for run, c in
                                      draw_conditions(FRESH_SEED, item["id"]).items()}
        offsets = {run: item["conditions"][run]["offsets"] for run in ("A", "B")}
        assert all(v % 256 != 0 for v in offsets["A"].values())
        assert all(v % 256 == 0 for v in offsets["B"].values())
        assert len(set(offsets["B"].values())) == 3  # no two buffers share run B's alignment


@pytest.mark.triton
def test_keeping_a_plausible_value_found_in_out_fails_coverage() -> None:
    fails = failed(certify_kernel("add_keeps_found"))
    assert set(fails) == {"coverage"}, fails
    assert "kept" in fails["coverage"] and "stale element(s)" in fails["coverage"]


@pytest.fixture(scope="module")
def reads_guard() -> CertificationReport:
    """``add_reads_guard`` certified once under FRESH_SEED: its failure and its rerun read it."""
    return certify_kernel("add_reads_guard")


@pytest.mark.triton
def test_reading_the_guard_band_to_tell_the_test_apart_fails(
    reads_guard: CertificationReport,
) -> None:
    fails = failed(reads_guard)
    assert fails and set(fails) <= {"correctness", "determinism"}, fails
    assert "'out'" in next(iter(fails.values()))


@pytest.mark.triton
def test_reading_the_alignment_fails_correctness() -> None:
    fails = failed(certify_kernel("add_reads_alignment"))
    assert "correctness" in fails and set(fails) <= {"correctness", "determinism"}, fails
    assert "outside tolerance" in fails["correctness"]


@pytest.mark.triton
def test_a_write_that_rounds_to_the_old_poison_fails_bounds() -> None:
    fails = failed(certify_kernel("add_rounds_into_guard"))
    assert set(fails) == {"bounds"}, fails
    assert "written up to 1 element(s) past its end" in fails["bounds"]


@pytest.mark.triton
def test_a_size_nobody_listed_fails_fresh_probes_and_is_minimized() -> None:
    report = certify_kernel("add_wrong_unlisted_sizes", minimize=True)
    fails = failed(report)
    assert set(fails) == {"fresh-probes"}, fails
    assert fails["fresh-probes"].startswith("correctness")
    probe = next(c.probe for c in report.checks if c.name == "fresh-probes")
    assert probe is not None and int(probe.rsplit("=", 1)[1]) % 4 == 2
    assert report.minimized["fresh-probes"]["n"] % 4 == 2


@pytest.mark.triton
def test_a_size_past_every_listed_one_fails_under_the_spec_cap() -> None:
    report = certify_kernel("add_wrong_past_65536_large")
    fails = failed(report)
    assert set(fails) == {"fresh-probes"}, fails
    probe = next(c.probe for c in report.checks if c.name == "fresh-probes")
    assert probe is not None and int(probe.rsplit("=", 1)[1]) > 65536
    twin = certify_kernel("add_large")
    assert twin.verdict is Verdict.PASS, failed(twin)


@pytest.mark.triton
def test_a_size_between_the_listed_and_the_top_of_the_stretch_fails() -> None:
    # wrong for 4096 < n < 7168; the cap is 8192: the top eighth alone never reached it
    report = certify_kernel("add_wrong_below_the_cap")
    fails = failed(report)
    assert set(fails) == {"fresh-probes"}, fails
    assert fails["fresh-probes"].startswith("correctness")
    probe = next(c.probe for c in report.checks if c.name == "fresh-probes")
    assert probe is not None and 4096 < int(probe.rsplit("=", 1)[1]) < 7168
    scope = report.predicate()["probes"]["scope"]["n"]
    assert any(4096 < v < 7168 for v in scope["drawn"])  # the sizes probed, as they were


@pytest.mark.triton
def test_listed_only_sizes_are_what_the_certificate_says_it_covers() -> None:
    report = certify_kernel("add_wrong_unlisted_sizes_listed")
    assert report.verdict is Verdict.PASS  # the spec asked for its listed sizes only...
    scope = report.predicate()["probes"]["scope"]["n"]
    assert scope["drawn"] == [] and scope["draw_up_to"] == "listed" and scope["max"] == 4096


@pytest.mark.triton
def test_the_same_seed_reproduces_every_condition_and_anchor(
    reads_guard: CertificationReport,
) -> None:
    first = reads_guard.predicate()["probes"]
    again = certify_kernel("add_reads_guard", seed=FRESH_SEED).predicate()["probes"]  # a new run
    assert first == again  # a kernel that reads the conditions gives the same bytes


@pytest.mark.triton
def test_a_buffer_larger_than_any_one_dim_reaches_alone_fails_in_the_joint_probe() -> None:
    # wrong once m * n > 66,000: m's and n's large sizes each sit in a probe of their own
    report = certify_kernel("row_scale_wrong_large_product")
    fails = failed(report)
    assert set(fails) == {"fresh-probes"}, fails
    assert fails["fresh-probes"].startswith("correctness")
    probe = next(c.probe for c in report.checks if c.name == "fresh-probes")
    assert probe is not None
    dims = dict(part.split("=") for part in probe.split(":", 1)[1].split(","))
    assert int(dims["m"]) > 33 and int(dims["n"]) > 1000 and int(dims["m"]) * int(dims["n"]) > 66000
    twin = certify_kernel("row_scale")
    assert twin.verdict is Verdict.PASS, failed(twin)
    predicate = twin.predicate()
    validate_predicate(json.loads(json.dumps(predicate)))
    assert predicate["probes"]["largest_elements"] > 66000


@pytest.mark.triton
def test_run_b_stale_answer_comes_from_another_draw_so_a_kernel_cannot_find_it() -> None:
    # the kernel computes right only when its old `out` values are among its answers
    fails = failed(certify_kernel("add_knows_its_stale_answer"))
    assert set(fails) == {"determinism"}, fails
    assert "'out'" in fails["determinism"]


def test_the_stale_fill_is_another_answer_and_still_differs_from_the_markers() -> None:
    runs = draw_conditions(5, "n=4096")
    rng = np.random.default_rng(0)
    answer = rng.standard_normal(4096).astype(np.float32)
    earlier = rng.standard_normal(4096).astype(np.float32)
    fills = out_fills("f32", (4096,), runs, "out", earlier, answer)
    b = fills["B"]
    assert np.isin(b, answer).mean() < 0.01  # not this probe's answer, moved
    assert np.isin(b, earlier).all() and (b != earlier).any()  # an earlier answer, moved
    # where the earlier answer lands on this one's right value, keeping it would be right
    same = out_fills("f32", (4096,), runs, "out", answer, np.roll(answer, runs["B"].roll))
    assert not (same["B"] == np.roll(answer, runs["B"].roll)).any()
    a_bytes = fills["A"].view(np.uint32)
    assert (a_bytes != b.view(np.uint32)).all()


def test_buffers_of_one_run_get_offsets_of_their_own() -> None:
    names = ["x", "y", "out"]
    for seed in range(32):
        runs = draw_conditions(seed, "n=33")
        a, b = (buffer_shifts(runs[r], names) for r in ("A", "B"))
        assert a["x"] == runs["A"].shift and all(v % 16 == 0 and v % 256 for v in a.values())
        assert all(v % 256 == 0 for v in b.values()) and len(set(b.values())) == 3
        assert {(v - b["x"]) % 512 for v in b.values()} == {0}  # 512-byte packing


@pytest.mark.triton
def test_a_kernel_that_needs_its_buffers_to_share_an_alignment_fails() -> None:
    fails = failed(certify_kernel("add_needs_shared_alignment"))
    assert "correctness" in fails and set(fails) <= {"correctness", "determinism"}, fails
    assert "outside tolerance" in fails["correctness"]


@pytest.mark.parametrize("count", [256, 1024, 5000])
def test_the_guard_next_to_the_data_is_plausible_in_one_run(count: int) -> None:
    for seed in range(16):
        runs = draw_conditions(seed, "n=33")
        for name, before in (("x\0before", True), ("x\0after", False)):
            a, b = (guard_fill("f32", count, runs[r], name, before=before) for r in ("A", "B"))
            near = slice(count - 64, count) if before else slice(0, 64)

            def plausible(g: np.ndarray) -> bool:
                return bool(np.isfinite(g).all() and (np.abs(g) >= 2.0**-3).all())

            assert plausible(a[near]) != plausible(b[near]), (seed, name)
            assert (a.view(np.uint32) != b.view(np.uint32)).all()  # bounds' premise kept


def test_a_one_element_write_past_the_end_is_seen_in_two_probes_in_three() -> None:
    # "the guard plus a little" written next to the data changes its bytes only where
    # that element is small in one of the runs; measured over probes (each probe draws
    # its own conditions), on both sides of a buffer
    little = 2.0**-20
    seen = {"after": 0, "before": 0}
    probes = 300
    for i in range(probes):
        runs = draw_conditions(4, f"n={i}")
        for side, before in (("after", False), ("before", True)):
            for run in ("A", "B"):
                guard = guard_fill("f16", 2048, runs[run], "out\0" + side, before=before)
                g = guard[-1 if before else 0]
                if (np.float16(float(g) + little)).tobytes() != g.tobytes():
                    seen[side] += 1
                    break
    # two in three expected (200 of 300, sd 8); the even split this replaced gave 150
    assert all(count >= 180 for count in seen.values()), seen


@pytest.mark.triton
def test_a_kernel_that_counts_odd_values_in_the_guard_fails() -> None:
    fails = failed(certify_kernel("add_counts_odd_guards"))
    assert fails and set(fails) <= {"correctness", "determinism"}, fails
    assert "'out'" in next(iter(fails.values()))
