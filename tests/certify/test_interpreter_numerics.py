"""bfloat16 and float16 accumulation on the Triton interpreter: as compiled once fixed.

Each kernel runs in a child process with ``TRITON_INTERPRET=1`` (Triton reads it
when ``@triton.jit`` decorates), once as the interpreter ships and once after
:func:`kcert.certify.executors.interpreter_numerics.install`. The expected values come
from torch's CPU bfloat16 (one rounding per operation) and from the same
per-step rounding written out in NumPy, so that the test fails if the emulation
drifts from what a GPU computes, and says so if a Triton release fixes the
interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kcert.certify.executors.interpreter_numerics import decode, encode

pytest.importorskip("triton")
pytest.importorskip("torch")

SCRIPT = '''
import json, sys
import torch, triton, triton.language as tl
if sys.argv[1] == "fixed":
    from kcert.certify.executors import interpreter_numerics
    interpreter_numerics.install()
    interpreter_numerics.install()  # twice: the second changes nothing


@triton.jit
def ops(x, y, mul, add, div, lt, mx, rnd, to_int, from_int, total, running, top, at,
        N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(x + i)
    b = tl.load(y + i)
    tl.store(mul + i, a * b)
    tl.store(add + i, a + b)
    tl.store(div + i, a / b)
    tl.store(lt + i, (a < b).to(tl.int32))
    tl.store(mx + i, tl.maximum(a, b))
    tl.store(rnd + i, tl.exp(a.to(tl.float32)).to(tl.bfloat16))
    tl.store(to_int + i, (a * 4.0).to(tl.int32))
    tl.store(from_int + i, (i - 32).to(tl.bfloat16) * a)
    tl.store(total, tl.sum(a, axis=0))
    tl.store(running + i, tl.cumsum(a, axis=0))
    tl.store(top, tl.max(a, axis=0))
    tl.store(at, tl.argmax(a, axis=0))


N = 64
g = torch.Generator().manual_seed(0)
x = (torch.randn(N, generator=g) * 4).to(torch.bfloat16)
y = (torch.randn(N, generator=g) * 4).to(torch.bfloat16)
names = ["mul", "add", "div", "lt", "mx", "rnd", "to_int", "from_int", "total", "running", "top",
         "at"]
ints = {"lt", "to_int", "at"}
outs = {k: torch.zeros(1 if k in ("total", "top", "at") else N,
                       dtype=torch.int32 if k in ints else torch.bfloat16)
        for k in names}
ops[(1,)](x, y, *outs.values(), N=N)
bits = lambda t: t.view(torch.int16).to(torch.int32).flatten().tolist()


@triton.jit
def dots(p, q, r, s, f16acc, bf16dot, M: tl.constexpr, K: tl.constexpr):
    m = tl.arange(0, M)
    k = tl.arange(0, K)
    a = tl.load(p + m[:, None] * K + k[None, :])
    b = tl.load(q + k[:, None] * M + m[None, :])
    tl.store(f16acc + m[:, None] * M + m[None, :], tl.dot(a, b, out_dtype=tl.float16))
    c = tl.load(r + m[:, None] * K + k[None, :])
    e = tl.load(s + k[:, None] * M + m[None, :])
    tl.store(bf16dot + m[:, None] * M + m[None, :], tl.dot(c, e))


M, K = 16, 256
p, q = torch.randn(M, K, generator=g).half(), torch.randn(K, M, generator=g).half()
r, s = torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, M, generator=g).bfloat16()
f16acc, bf16dot = torch.zeros(M, M, dtype=torch.float16), torch.zeros(M, M)
dots[(1,)](p, q, r, s, f16acc, bf16dot, M=M, K=K)
print(json.dumps({"x": bits(x), "y": bits(y),
                  **{k: (v.tolist() if k in ints else bits(v)) for k, v in outs.items()},
                  "p": bits(p), "q": bits(q), "r": bits(r), "s": bits(s),
                  "f16acc": bits(f16acc), "bf16dot": bf16dot.flatten().tolist()}))
'''


def run(tmp_path: Path, mode: str) -> dict[str, np.ndarray]:
    script = tmp_path / "ops.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                          env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: np.asarray(v, dtype=np.float64 if k == "bf16dot" else np.int32)
            for k, v in raw.items()}  # fmt: skip


def values(bits: np.ndarray) -> np.ndarray:
    return decode(bits.astype(np.uint16))


def round16(v: np.ndarray) -> np.ndarray:
    return values(encode(v))


def halves(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def f16_accumulated(r: dict[str, np.ndarray]) -> np.ndarray:
    """What a float16 MMA accumulator holds: rounded to float16 after every 16 of K."""
    a, b = halves(r["p"]).reshape(16, 256), halves(r["q"]).reshape(256, 16)
    acc = np.zeros((16, 16), dtype=np.float32)
    for k in range(0, 256, 16):
        acc = (acc + a[:, k:k + 16] @ b[k:k + 16]).astype(np.float16).astype(np.float32)
    return acc.reshape(-1)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("bf16")
    return {mode: run(folder, mode) for mode in ("raw", "fixed")}


def expected(r: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a, b = values(r["x"]), values(r["y"])
    total = a.copy()
    while total.size > 1:  # pairs, each partial sum rounded (a reduction tree)
        total = np.concatenate([total, [0.0]]) if total.size % 2 else total
        total = round16(total[0::2] + total[1::2])
    running = a.copy()
    for i in range(1, a.size):
        running[i] = round16(running[i - 1] + a[i])
    return {"mul": round16(a * b), "add": round16(a + b), "div": round16(a / b),
            "lt": (a < b).astype(np.int32), "mx": np.maximum(a, b),
            "rnd": round16(np.exp(a)), "to_int": np.trunc(round16(a * 4)).astype(np.int32),
            "from_int": round16((np.arange(64) - 32) * a), "total": total, "running": running,
            "top": np.max(a, keepdims=True), "at": np.argmax(a, keepdims=True).astype(np.int32),
            "f16acc": f16_accumulated(r),
            "bf16dot": (values(r["r"]).reshape(16, 256).astype(np.float64)
                        @ values(r["s"]).reshape(256, 16)).reshape(-1)}


def got(r: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name == "f16acc":
        return halves(r[name])
    return r[name] if name in ("lt", "to_int", "at", "bf16dot") else values(r[name])


def test_the_interpreter_alone_computes_on_the_bits(
    results: dict[str, dict[str, np.ndarray]],
) -> None:
    # pinned: if this fails, a Triton release fixed the interpreter and the emulation can go
    raw, want = results["raw"], expected(results["raw"])
    # (tl.max and tl.argmax promote bfloat16 to float32 themselves: right either way)
    bitwise = ("mul", "add", "lt", "mx", "rnd", "from_int", "total", "running", "f16acc",
               "bf16dot")
    wrong = [k for k in bitwise if not np.array_equal(got(raw, k), want[k], equal_nan=True)]
    assert wrong == list(bitwise)


def test_after_install_every_operation_rounds_as_compiled(
    results: dict[str, dict[str, np.ndarray]],
) -> None:
    fixed, want = results["fixed"], expected(results["fixed"])
    for name, value in want.items():
        if name == "bf16dot":  # a float32 accumulator: float32 rounding of an exact sum
            assert np.allclose(got(fixed, name), value, rtol=1e-5, atol=1e-4), name
        else:
            assert np.array_equal(got(fixed, name), value, equal_nan=True), name


def test_encode_rounds_to_nearest_even_and_keeps_specials() -> None:
    one = np.float32(1.0)
    ulp = np.float32(2.0**-7)
    halfway = np.array([one + ulp / 2, one + ulp * 1.5, -(one + ulp / 2)], dtype=np.float32)
    assert values(encode(halfway)).tolist() == [1.0, float(one + 2 * ulp), -1.0]
    special = values(encode(np.array([np.inf, -np.inf, np.nan], dtype=np.float32)))
    assert special[0] == np.inf and special[1] == -np.inf and np.isnan(special[2])
    assert np.array_equal(encode(decode(np.arange(0, 65536, 7, dtype=np.uint16))[:4000]),
                          np.arange(0, 65536, 7, dtype=np.uint16)[:4000])  # fmt: skip


def test_an_interpreter_without_the_entry_points_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton.runtime import interpreter

    from kcert.certify.executors import interpreter_numerics

    monkeypatch.delattr(interpreter.ReduceOps, "min_max")
    with pytest.raises(interpreter_numerics.Unsupported, match=r"ReduceOps\.min_max"):
        interpreter_numerics.install()
