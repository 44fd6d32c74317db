"""A Triton kernel of examples/triton, run by the interpreter on torch CPU tensors, guarded."""

from __future__ import annotations

import base64
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from guard_factory import EXAMPLES, pair

from kcert.guard import Guard, ListReporter

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")


@pytest.fixture
def saxpy_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # @triton.jit reads TRITON_INTERPRET when it decorates: load the example afresh under it
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location("guard_saxpy_example",
                                                  EXAMPLES.parent / "saxpy.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tensors(n: int, seed: int) -> tuple[Any, Any]:
    x, y = pair(n, seed)
    return torch.from_numpy(x), torch.from_numpy(y)


def test_a_triton_launch_is_checked_through_torch_tensors(
    make_guard: Callable[..., Guard], saxpy_module: ModuleType,
) -> None:
    kernel = saxpy_module.saxpy

    def launch(x_ptr: Any, y_ptr: Any, a: float, n: int) -> None:
        kernel[(triton.cdiv(n, 1024),)](x_ptr, y_ptr, a, n, BLOCK=1024)

    def launch_short(x_ptr: Any, y_ptr: Any, a: float, n: int) -> None:
        launch(x_ptr, y_ptr, a, n - 1)  # the last element is never updated

    reporter = ListReporter(target="cpu-ci")
    guard = make_guard(sample_rate=1.0, seed=0, reporter=reporter)
    good, short = guard.wrap(launch), guard.wrap(launch_short)
    x, y = tensors(3000, 1)
    y0 = y.clone()
    good(x, y, 2.5, 3000)
    assert torch.equal(y, 2.5 * x + y0)  # the caller's in-place result as the kernel made it
    good(*tensors(1, 2), 2.5, 1)
    short(*tensors(2049, 3), 2.5, 2049)
    assert guard.flush(60)
    stats = guard.stats()
    assert (stats.calls_checked, stats.mismatches, stats.out_of_scope) == (3, 1, 0)
    [m] = [m for r in reporter.body()["reports"] for m in r["mismatches"]]
    assert m["dims"] == {"n": 2049} and m["in_scope"] is True
    xs = np.frombuffer(base64.b64decode(m["evidence"]["x_ptr"]["data"]), np.float32)
    assert np.array_equal(xs, pair(2049, 3)[0])
