"""A generate -> verify -> refine loop around kcert's Python API.

A model writes a kernel, kcert certifies it, and when it fails the report's
``feedback()`` goes back into the model's next prompt: the failing checks on
their smallest shape, the first bad element with got, want and allowed error,
a failed build's compiler error at its source line. The loop ends at the first
kernel that passes (or after ``max_rounds``).

The "model" here is scripted so the example runs anywhere, on the CPU through
the Triton interpreter: it answers each prompt with the next of three
candidates (a kernel that does not build, one with an off-by-one tail mask,
a correct one). Put a real model behind the same ``Model`` signature.

    python examples/refine_loop.py
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import kcert

#: Takes a prompt, returns the source of a Triton module.
Model = Callable[[str], str]

TASK = """\
Write a Triton kernel `scale(x, out, n, BLOCK: tl.constexpr)` that stores 3 * x[i] into out[i]
for i < n, one program per BLOCK elements (grid cdiv(n, BLOCK))."""

SPEC = """\
[[kernel]]
name = "scale"
source = "scale.py"
entry = "scale"
reference = "reference.py:scale"
grid = ["cdiv(n, BLOCK)"]
dims = { n = [1, 100, 200] }
probes = { fresh = 1 }

[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
"""

REFERENCE = "def scale(*, x, out, n, BLOCK):\n    return 3.0 * x\n"

_HEADER = "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"

#: What the scripted model answers, in order.
CANDIDATES: tuple[str, ...] = (
    # a name that does not exist: the build fails with Triton's NameError
    _HEADER + "def scale(x, out, n, BLOCK: tl.constexpr):\n"
    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    "    mask = offs < n\n"
    "    tl.store(out + offs, tl.load(x + offs, mask=mask) * three, mask=mask)\n",
    # the tail mask is off by one: it writes one element past the end of `out`
    _HEADER + "def scale(x, out, n, BLOCK: tl.constexpr):\n"
    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    "    mask = offs <= n\n"
    "    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.0, mask=mask)\n",
    # right
    _HEADER + "def scale(x, out, n, BLOCK: tl.constexpr):\n"
    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    "    mask = offs < n\n"
    "    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.0, mask=mask)\n",
)


class ScriptedModel:
    """Stands in for a language model: each prompt gets the next candidate."""

    def __init__(self, candidates: Sequence[str]) -> None:
        self.candidates = list(candidates)
        #: Every prompt it was given, feedback included (what a real model would read).
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.candidates[min(len(self.prompts), len(self.candidates)) - 1]


@dataclass(frozen=True)
class Round:
    number: int
    verdict: kcert.Verdict
    feedback: str


def refine(model: Model, workdir: Path, *, max_rounds: int = 5,
           executor: str = "triton-interpreter") -> list[Round]:  # fmt: skip
    """Generate, certify and feed back until a kernel passes; the rounds, in order."""
    (workdir / "kcert.toml").write_text(SPEC)
    (workdir / "reference.py").write_text(REFERENCE)
    options = kcert.CertifyOptions(executor=executor)
    rounds: list[Round] = []
    prompt = TASK
    # one pool for every round, a warm sandbox worker kept ahead: while the model writes the
    # next kernel, its worker imports torch and Triton; closing the pool kills them all
    with kcert.WorkerPool(spares=1) as pool:
        for number in range(1, max_rounds + 1):
            (workdir / "scale.py").write_text(model(prompt))
            kernel = kcert.load_kernel(workdir / "kcert.toml", "scale")
            report = kcert.certify_kernel(kernel, options, pool=pool)
            rounds.append(Round(number, report.verdict, report.feedback()))
            if report.verdict is kcert.Verdict.PASS:
                break
            prompt = (f"{TASK}\n\nYour last kernel failed certification. What kcert found:\n\n"
                      f"{report.feedback()}\n\nWrite a corrected kernel.")  # fmt: skip
    return rounds


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kcert-refine-") as tmp:
        rounds = refine(ScriptedModel(CANDIDATES), Path(tmp))
    for r in rounds:
        print(f"--- round {r.number}: {r.verdict}")  # noqa: T201
        print(r.feedback)  # noqa: T201
    return 0 if rounds and rounds[-1].verdict is kcert.Verdict.PASS else 1


if __name__ == "__main__":
    sys.exit(main())
