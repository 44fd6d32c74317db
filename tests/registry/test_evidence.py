"""A mismatch's evidence, checked again by an auditor: anchors, the reference, hostile dims."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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


def _wrong_outputs(arrays: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    y = (np.float32(2.5) * arrays["x_ptr"] + arrays["y_ptr"]).astype(np.float32)
    y[-1024:] *= np.float32(1.01)  # what saxpy_large does past its certified sizes
    return {"y_ptr": y}


def test_with_the_outputs_the_error_is_measured_again_same_or_different() -> None:
    kernel = load_spec(SPEC).kernel("saxpy_large")
    mismatch, arrays = _mismatch(20000)
    outputs = _wrong_outputs(arrays)
    ref = (2.5 * arrays["x_ptr"].astype(np.float64) + arrays["y_ptr"]).astype(np.float32)
    error = float(np.abs(outputs["y_ptr"].astype(np.float64) - ref).max())
    first = recheck(kernel, mismatch, arrays, outputs)
    assert first.reproduced is True and first.max_error is not None and first.max_ratio
    assert first.max_error == pytest.approx(error, rel=1e-9) and first.max_ratio > 1
    assert first.same_error is False  # the leaf recorded no error at all

    mismatch.update(max_error=error, max_ratio=first.max_ratio)
    same = recheck(kernel, mismatch, arrays, outputs)
    assert same.same_error is True and "SAME" in same.notes[-1], same.notes
    mismatch["max_error"] = error * 10  # a guard (or registry) that overstated the error
    different = recheck(kernel, mismatch, arrays, outputs)
    assert different.same_error is False and "DIFFERENT" in different.notes[-1]

    # Outputs that are in fact right: the mismatch is not reproduced.
    right = {"y_ptr": ref}
    assert recheck(kernel, dict(mismatch, max_error=error), arrays, right).reproduced is False
    # Outputs of the wrong shape for the recorded dims are not measured.
    short = {"y_ptr": outputs["y_ptr"][:100]}
    assert recheck(kernel, mismatch, arrays, short).reproduced is False


def test_inputs_and_outputs_share_one_evidence_cap() -> None:
    from kcert.registry.errors import TooLarge
    from kcert.registry.evidence import decode_evidence
    from kcert.registry.observation_models import MismatchReport

    _, arrays = _mismatch(256)  # 1 KiB per array
    outputs = _wrong_outputs(arrays)

    def wire(v: np.ndarray[Any, Any]) -> dict[str, Any]:
        return {"dtype": "float32", "shape": list(v.shape),
                "data": base64.b64encode(v.tobytes()).decode()}  # fmt: skip

    report = MismatchReport.model_validate({
        "at": "2026-11-23T17:00:03Z", "dims": {"n": 256},
        "inputs": {n: str(anchor(v)) for n, v in arrays.items()},
        "outputs": {"y_ptr": str(anchor(outputs["y_ptr"]))}, "reference": {},
        "max_error": 1.0, "max_ratio": 2.0, "in_scope": True,
        "evidence": {n: wire(v) for n, v in arrays.items()},
        "outputs_evidence": {"y_ptr": wire(outputs["y_ptr"])},
    })  # fmt: skip
    decoded = decode_evidence(report, max_bytes=3 * 1024, where="test")
    assert decoded is not None and decoded.outputs is not None
    assert len(decoded.blob) == 3 * 1024 and list(decoded.outputs) == ["y_ptr"]
    with pytest.raises(TooLarge):
        decode_evidence(report, max_bytes=3 * 1024 - 1, where="test")


def test_served_outputs_are_held_against_the_logged_outputs_manifest() -> None:
    _, arrays = _mismatch(16)
    y = _wrong_outputs(arrays)["y_ptr"]
    manifest = {"y_ptr": {"dtype": "float32", "shape": [16], "anchor": str(anchor(y)),
                          "bytes": 64}}  # fmt: skip

    def served(v: np.ndarray[Any, Any]) -> dict[str, Any]:
        return {"outputs": {"y_ptr": {"dtype": "float32", "shape": [16],
                                      "data": base64.b64encode(v.tobytes()).decode()}}}

    got, notes = served_arrays(served(y), manifest, key="outputs")
    assert notes == [] and np.array_equal(got["y_ptr"], y)
    # A registry that serves the right output bytes as the inputs' is not believed either.
    assert served_arrays(served(y), manifest)[1] == ["evidence y_ptr was not served"]
    forged = y.copy()
    forged[3] = 0  # a registry that "fixes" the output
    got, notes = served_arrays(served(forged), manifest, key="outputs")
    assert got == {} and "does not anchor" in notes[0]
