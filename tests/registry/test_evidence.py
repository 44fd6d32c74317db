"""A mismatch's evidence, checked again by an auditor: anchors, the reference, hostile dims."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from kcert.certify.anchors import anchor
from kcert.certify.spec import load_spec
from kcert.registry.evidence import recheck, served_arrays

SPEC = Path(__file__).resolve().parents[1] / "assets" / "guard" / "kcert.toml"


def _mismatch(n: int) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    ref = (2.5 * x.astype(np.float64) + y).astype(np.float32)
    return ({"dims": {"n": n}, "inputs": {"x_ptr": str(anchor(x)), "y_ptr": str(anchor(y))},
             "reference": {"y_ptr": str(anchor(ref))}},
            {"x_ptr": x, "y_ptr": y})  # fmt: skip


def test_the_reference_comes_out_as_recorded() -> None:
    kernel = load_spec(SPEC).kernel("saxpy_large")
    mismatch, arrays = _mismatch(20000)
    result = recheck(kernel, mismatch, arrays)
    assert result.reproduced is None  # saxpy's output is inout: only its input travels
    assert any("same anchor as recorded" in n for n in result.notes), result.notes
    mismatch["reference"]["y_ptr"] = "sha256:" + "0" * 64
    assert any("different anchor" in n for n in recheck(kernel, mismatch, arrays).notes)


def test_dims_that_do_not_fit_the_evidence_are_not_run() -> None:
    kernel = load_spec(SPEC).kernel("saxpy_large")
    mismatch, arrays = _mismatch(64)
    mismatch["dims"] = {"n": 2**40}  # a leaf that would make the auditor allocate terabytes
    result = recheck(kernel, mismatch, arrays)
    assert result.reproduced is False and "shape" in result.notes[0]


def test_served_evidence_must_match_the_logged_anchors() -> None:
    _, arrays = _mismatch(16)
    manifest = {n: {"dtype": "float32", "shape": [16], "anchor": str(anchor(v)), "bytes": 64}
                for n, v in arrays.items()}  # fmt: skip
    served = {"arrays": {n: {"dtype": "float32", "shape": [16],
                             "data": base64.b64encode(v.tobytes()).decode()}
                         for n, v in arrays.items()}}  # fmt: skip
    got, notes = served_arrays(served, manifest)
    assert notes == [] and set(got) == {"x_ptr", "y_ptr"}
    swapped = arrays["x_ptr"].copy()
    swapped[0] += 1
    served["arrays"]["x_ptr"]["data"] = base64.b64encode(swapped.tobytes()).decode()
    del served["arrays"]["y_ptr"]
    got, notes = served_arrays(served, manifest)
    assert got == {} and len(notes) == 2 and "does not anchor" in notes[0]
