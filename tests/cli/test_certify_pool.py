"""``kcert certify`` runs its sandboxes in one worker pool, and reads the signing key only
after that pool is closed and every worker that could have run kernel code is dead."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from sandbox_procs import worker_processes
from typer.testing import CliRunner

from kcert.certify.spares import WorkerPool
from kcert.cli.app import app

pytest.importorskip("triton")

KERNELS = """
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 3.0, mask=offs < n)


@triton.jit
def twice(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 3.0, mask=offs < n)
"""

SPEC = """
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{name}"
reference = "reference.py:scale"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [1, 100] }}
probes = {{ fresh = 1 }}

[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
"""


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    (tmp_path / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "reference.py").write_text("def scale(*, x, out, n, BLOCK):\n    return x * 3.0\n")
    (tmp_path / "kcert.toml").write_text(SPEC.format(name="scale") + SPEC.format(name="twice"))
    return tmp_path / "kcert.toml"


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Record the CLI's pools, and what was alive when it read the key."""
    # imported once the app is: importing a command module first is an import cycle
    from kcert.cli import certify_cmds, certify_many

    seen: dict[str, Any] = {"pools": [], "at_key": []}

    class Recorded(WorkerPool):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            seen["pools"].append(self)

    load_key = certify_cmds._load_key

    def spy(path: Path) -> Any:
        seen["at_key"].append((worker_processes(), [p.closed for p in seen["pools"]]))
        return load_key(path)

    for module in (certify_cmds, certify_many):
        monkeypatch.setattr(module, "WorkerPool", Recorded)
        monkeypatch.setattr(module, "_load_key", spy)
    return seen


@pytest.mark.parametrize("kernel", [("--kernel", "scale"), ()], ids=["one", "several"])
def test_the_key_is_read_after_the_pool_is_closed_and_every_worker_is_dead(
    spec: Path, tmp_path: Path, watched: dict[str, Any], kernel: tuple[str, ...],
) -> None:  # fmt: skip
    key = tmp_path / "signing"
    assert CliRunner().invoke(app, ["keys", "generate", "--out", str(key)]).exit_code == 0
    out = tmp_path / "certs"
    out.mkdir()
    target = out / "scale.cert.json" if kernel else out
    result = CliRunner().invoke(app, ["certify", str(spec), *kernel, "--executor",
                                      "triton-interpreter", "--key", str(key), "--out",
                                      str(target)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "scale.cert.json").is_file()
    [pool] = watched["pools"]
    [(alive, closed)] = watched["at_key"]
    assert closed == [True] and alive == set()
    # with one kernel nothing is started ahead; with several, the last one takes the worker
    # started ahead for it, and nothing is started after it
    assert pool.started == pool.used == (1 if kernel else 2)
