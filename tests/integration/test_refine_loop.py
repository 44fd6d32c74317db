"""``examples/refine_loop.py`` runs: each failure's feedback reaches the model, the last
candidate passes."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "refine_loop.py"


def load_example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("refine_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up while the class is made
    monkeypatch.setitem(sys.modules, "refine_loop", module)
    spec.loader.exec_module(module)
    return module


def test_the_loop_ends_with_a_pass_after_seeing_each_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    example = load_example(monkeypatch)
    model = example.ScriptedModel(example.CANDIDATES)
    rounds = example.refine(model, tmp_path)
    assert [str(r.verdict) for r in rounds] == ["fail", "fail", "pass"]
    assert [r.number for r in rounds] == [1, 2, 3]
    # what each round's model read: the task, then the last round's feedback
    assert len(model.prompts) == 3 and model.prompts[0] == example.TASK
    build, bounds = model.prompts[1], model.prompts[2]
    assert "FAILED build" in build and "NameError('three is not defined')" in build
    assert "compiler error at scale.py:9:" in build and "* three, mask=mask)" in build
    assert "FAILED bounds" in bounds and "past its end" in bounds
    assert "smallest failing shape n=1" in bounds
    # the probe count follows the spec's dims and the drawn fresh sizes, not this test
    assert re.search(r"PASS: every required check passed on \d+ probe\(s\)\.$",
                     rounds[-1].feedback), rounds[-1].feedback

