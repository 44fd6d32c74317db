"""A runtime mismatch's evidence: decoding it, anchoring it, and checking it again.

The guard sends the arrays of a mismatched call as base64 of their C-order
little-endian bytes (the README, "After promotion"). The registry decodes each one
within a size cap, recomputes its anchor exactly as the certifier does
(:func:`kcert.certify.anchors.anchor`) and refuses evidence whose anchor is not
the one the mismatch names for that array: what is stored is what was seen.

:func:`recheck` is the auditor's half (``kcert audit replay N --spec``): it runs
the spec's reference on the evidence inputs and says whether the recorded
reference anchor and, when the outputs are in the evidence
(``outputs_evidence``), the mismatch itself with its max error and ratio, come
out again.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kcert.certify.anchors import anchor
from kcert.certify.executors.base import host_dtype
from kcert.certify.reference import Reference
from kcert.certify.spec import Intent
from kcert.digest import Digest
from kcert.guard.check import measure
from kcert.registry.errors import InvalidInput, TooLarge
from kcert.registry.observation_models import EvidenceArray, MismatchReport


@dataclass(frozen=True, slots=True)
class DecodedEvidence:
    #: name -> {"dtype", "shape", "anchor", "bytes"}, in the order sent.
    manifest: dict[str, dict[str, Any]]
    #: The bytes of ``manifest``'s arrays, then of ``outputs``'.
    blob: bytes
    #: The kernel's outputs (``outputs_evidence``), laid out as ``manifest``; None if not sent.
    outputs: dict[str, dict[str, Any]] | None = None

    @property
    def digest(self) -> str:
        return str(Digest.of_bytes(self.blob))


def decode_evidence(
    mismatch: MismatchReport, *, max_bytes: int, where: str
) -> DecodedEvidence | None:
    """The evidence's arrays, each checked against the anchor the mismatch names for it."""
    if mismatch.evidence is None:
        if mismatch.outputs_evidence is not None:
            raise InvalidInput(f"{where}: outputs_evidence needs the inputs' evidence beside "
                               "it (an output alone cannot be re-checked)")  # fmt: skip
        return None
    parts: list[bytes] = []
    budget = [max_bytes]
    manifest = _decode(mismatch.evidence, lambda n: mismatch.inputs.get(n) or
                       mismatch.outputs.get(n), "evidence", "inputs or outputs", parts, budget,
                       where)  # fmt: skip
    outputs = None
    if mismatch.outputs_evidence is not None:
        # Against the *outputs* anchors only: for an inout buffer the input anchor is the
        # value before the call, and evidence of it must not pass for the kernel's result.
        outputs = _decode(mismatch.outputs_evidence, mismatch.outputs.get, "outputs_evidence",
                          "outputs", parts, budget, where)  # fmt: skip
    return DecodedEvidence(manifest, b"".join(parts), outputs)


def _decode(sent: Mapping[str, EvidenceArray], named_of: Callable[[str], str | None],
            field: str, among: str, parts: list[bytes], budget: list[int],
            where: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    manifest: dict[str, dict[str, Any]] = {}
    for name, item in sent.items():
        named = named_of(name)
        if named is None:
            raise InvalidInput(f"{where}: {field} {name!r} is not among the anchored "
                               f"{among}")  # fmt: skip
        # Before decoding: base64 is 4 characters per 3 bytes, less its padding.
        budget[0] -= len(item.data) * 3 // 4 - item.data[-2:].count("=")
        if budget[0] < 0:
            raise TooLarge(f"{where}: evidence is over the registry's "
                           "KCERT_OBSERVATION_EVIDENCE_MAX bytes (inputs and outputs "
                           "together); send outputs_evidence, or both, as null")  # fmt: skip
        array = _array(item, f"{where}, {field} {name!r}")
        got = str(anchor(array))
        if got != named:
            raise InvalidInput(f"{where}: {field} {name!r} anchors to {got}, the mismatch "
                               f"names {named}")  # fmt: skip
        data = array.tobytes()
        manifest[name] = {"dtype": item.dtype, "shape": list(item.shape), "anchor": got,
                          "bytes": len(data)}  # fmt: skip
        parts.append(data)
    return manifest


def _array(item: EvidenceArray, where: str) -> np.ndarray[Any, Any]:
    try:
        data = base64.b64decode(item.data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{where}: data is not base64 (RFC 4648, padded)") from exc
    dtype = np.dtype(item.dtype).newbyteorder("<")
    want = math.prod(item.shape) * dtype.itemsize
    if len(data) != want:
        raise InvalidInput(f"{where}: {len(data)} bytes, but {item.dtype}{item.shape} is {want}")
    return np.frombuffer(data, dtype=dtype).reshape(item.shape)


def arrays_of(
    manifest: Mapping[str, Mapping[str, Any]], blob: bytes
) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays a stored manifest and blob hold."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    offset = 0
    for name, item in manifest.items():
        size = int(item["bytes"])
        dtype = np.dtype(str(item["dtype"])).newbyteorder("<")
        chunk = blob[offset : offset + size]
        if len(chunk) != size:
            raise InvalidInput(f"evidence {name!r} is cut short")
        out[name] = np.frombuffer(chunk, dtype=dtype).reshape([int(d) for d in item["shape"]])
        offset += size
    return out


def manifest_bytes(manifest: Mapping[str, Mapping[str, Any]]) -> int:
    """How many bytes of the blob ``manifest``'s arrays take (where the outputs begin)."""
    return sum(int(item["bytes"]) for item in manifest.values())


def encode_arrays(manifest: Mapping[str, Mapping[str, Any]], blob: bytes,
                  offset: int = 0) -> dict[str, Any]:  # fmt: skip
    """The evidence as the wire format sends it (``GET .../evidence``), from ``offset``."""
    out: dict[str, Any] = {}
    for name, item in manifest.items():
        size = int(item["bytes"])
        out[name] = {"dtype": item["dtype"], "shape": item["shape"], "anchor": item["anchor"],
                     "data": base64.b64encode(blob[offset : offset + size]).decode("ascii")}
        offset += size
    return out


#: Elements of one output the re-check lets the reference allocate.
MAX_RECHECK_ELEMENTS = 1 << 28


@dataclass(frozen=True, slots=True)
class Recheck:
    """What re-running the reference on the evidence shows."""

    #: The mismatch came out again (the outputs in the evidence are outside tolerance).
    reproduced: bool | None
    notes: tuple[str, ...]
    #: The re-measured largest error and ratio to the allowed error (outputs in the evidence).
    max_error: float | None = None
    max_ratio: float | None = None
    #: Whether they are the recorded ones (None: nothing re-measured).
    same_error: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "notes": list(self.notes),
                "max_error": _wire(self.max_error), "max_ratio": _wire(self.max_ratio),
                "same_error": self.same_error}  # fmt: skip


def recheck(
    kernel: Any, mismatch: Mapping[str, Any], arrays: Mapping[str, np.ndarray[Any, Any]],
    outputs: Mapping[str, np.ndarray[Any, Any]] | None = None,
) -> Recheck:
    """Run ``kernel``'s reference (a :class:`kcert.certify.spec.KernelSpec`) on the evidence.

    The reference's answer is anchored as float64 and as the output's own dtype;
    either may be what the guard recorded. With the kernel's ``outputs`` (the
    mismatch's ``outputs_evidence``) the error is measured again exactly as the
    guard measured it (:func:`kcert.guard.check.measure`: the certification's
    tolerance and comparison) and held against the recorded ``max_error`` and
    ``max_ratio``.
    """
    dims = {str(k): int(v) for k, v in mismatch.get("dims", {}).items()}
    launch = kernel.bind(dims)
    wanted = [b.name for b in kernel.buffers if b.intent is not Intent.OUT]
    missing = [name for name in wanted if name not in arrays]
    if missing:
        return Recheck(None, (f"the evidence lacks input(s) {', '.join(missing)}",))
    # The dims come from the leaf: hold them to the evidence before the reference allocates
    # anything of their size.
    wrong = [n for n in wanted if tuple(arrays[n].shape) != tuple(launch.shapes[n])]
    if outputs is not None:
        wrong += [o.name for o in kernel.outputs if o.name in outputs
                  and tuple(outputs[o.name].shape) != tuple(launch.shapes[o.name])]  # fmt: skip
    if wrong:
        return Recheck(False, (f"the evidence's shape of {', '.join(wrong)} is not what the "
                               f"recorded dims {dims} give",))  # fmt: skip
    if any(math.prod(launch.shapes[b.name]) > MAX_RECHECK_ELEMENTS for b in kernel.outputs):
        return Recheck(None, (f"an output of the recorded dims {dims} is over "
                              f"{MAX_RECHECK_ELEMENTS} elements: not re-run",))  # fmt: skip
    reference = Reference(kernel)
    expected = reference(arrays, launch, probe="runtime-mismatch")
    notes: list[str] = []
    recorded_ref = mismatch.get("reference", {})
    for out in kernel.outputs:
        ref = expected[out.name]
        anchors = {str(anchor(ref)), str(anchor(ref.astype(host_dtype(out.dtype))))}
        said = recorded_ref.get(out.name)
        if said is not None:
            notes.append(f"reference {out.name}: " + ("same anchor as recorded" if said in anchors
                         else "a different anchor than recorded (reference drift?)"))  # fmt: skip
    absent = [o.name for o in kernel.outputs if outputs is None or o.name not in outputs]
    if absent:
        # An inout buffer's evidence is its value before the call, never the kernel's output.
        notes.append(f"output(s) {', '.join(absent)} not in the evidence (outputs_evidence): "
                     "the error is not measured again, only the reference")  # fmt: skip
        return Recheck(None, tuple(notes))
    assert outputs is not None
    measured = measure(kernel, reference, launch, dims, dict(arrays), outputs)
    notes.extend(measured.reasons)
    recorded_error = _recorded(mismatch.get("max_error"))
    recorded_ratio = _recorded(mismatch.get("max_ratio"))
    same = measured.bad and _close(measured.max_error, recorded_error) and \
        _close(measured.max_ratio, recorded_ratio)  # fmt: skip
    notes.append(f"re-measured: max error {measured.max_error:.6g} (recorded "
                 f"{_show(recorded_error)}), {measured.max_ratio:.6g}× the allowed error "
                 f"(recorded {_show(recorded_ratio)}): {'SAME' if same else 'DIFFERENT'}")
    return Recheck(measured.bad, tuple(notes), measured.max_error, measured.max_ratio, same)


def _recorded(value: Any) -> float | None:
    if isinstance(value, str):  # "nan", "inf", "-inf" on the wire
        try:
            return float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _close(measured: float, recorded: float | None) -> bool:
    if recorded is None:
        return False
    if math.isnan(measured) or math.isnan(recorded):
        return math.isnan(measured) and math.isnan(recorded)
    if math.isinf(measured) or math.isinf(recorded):
        return measured == recorded
    # the same reference on the same bytes; only the last float64 digits may move
    return math.isclose(measured, recorded, rel_tol=1e-9, abs_tol=1e-300)


def _show(value: float | None) -> str:
    return "nothing" if value is None else f"{value:.6g}"


def _wire(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def served_arrays(
    served: Mapping[str, Any], manifest: Mapping[str, Mapping[str, Any]], key: str = "arrays"
) -> tuple[dict[str, np.ndarray[Any, Any]], list[str]]:
    """The arrays a registry served for a mismatch, each held against the logged manifest.

    Returns the arrays whose bytes anchor to what the log recorded, and a note for
    each that does not (or is missing): a registry cannot swap the evidence unseen.
    """
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    notes: list[str] = []
    got = served.get(key) if isinstance(served.get(key), Mapping) else {}
    for name, item in manifest.items():
        sent = got.get(name) if isinstance(got, Mapping) else None
        if not isinstance(sent, Mapping):
            notes.append(f"evidence {name} was not served")
            continue
        try:
            item_in = EvidenceArray.model_validate(
                {k: sent.get(k) for k in ("dtype", "shape", "data")}
            )
            array = _array(item_in, f"evidence {name}")
        except (InvalidInput, ValueError) as exc:
            notes.append(f"evidence {name} is unreadable: {exc}")
            continue
        if str(anchor(array)) != item.get("anchor"):
            notes.append(f"evidence {name} does not anchor to the logged {item.get('anchor')}")
            continue
        arrays[name] = array
    return arrays, notes
