"""A runtime mismatch's evidence: decoding it, anchoring it, and checking it again.

The guard sends the arrays of a mismatched call as base64 of their C-order
little-endian bytes (the README, "After promotion"). The registry decodes each one
within a size cap, recomputes its anchor exactly as the certifier does
(:func:`kcert.certify.anchors.anchor`) and refuses evidence whose anchor is not
the one the mismatch names for that array: what is stored is what was seen.

:func:`recheck` is the auditor's half (``kcert audit replay N --spec``): it runs
the spec's reference on the evidence inputs and says whether the recorded
reference anchor and, when the outputs are in the evidence, the mismatch
itself, come out again.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kcert.certify.anchors import anchor
from kcert.certify.executors.base import host_dtype
from kcert.certify.reference import Reference
from kcert.certify.spec import Intent
from kcert.digest import Digest
from kcert.registry.errors import InvalidInput, TooLarge
from kcert.registry.observation_models import EvidenceArray, MismatchReport


@dataclass(frozen=True, slots=True)
class DecodedEvidence:
    #: name -> {"dtype", "shape", "anchor", "bytes"}, in the order sent.
    manifest: dict[str, dict[str, Any]]
    blob: bytes

    @property
    def digest(self) -> str:
        return str(Digest.of_bytes(self.blob))


def decode_evidence(
    mismatch: MismatchReport, *, max_bytes: int, where: str
) -> DecodedEvidence | None:
    """The evidence's arrays, each checked against the anchor the mismatch names for it."""
    if mismatch.evidence is None:
        return None
    total = 0
    manifest: dict[str, dict[str, Any]] = {}
    parts: list[bytes] = []
    for name, item in mismatch.evidence.items():
        named = mismatch.inputs.get(name) or mismatch.outputs.get(name)
        if named is None:
            raise InvalidInput(f"{where}: evidence {name!r} is not among the anchored inputs "
                               "or outputs")  # fmt: skip
        # Before decoding: base64 is 4 characters per 3 bytes.
        total += len(item.data) * 3 // 4
        if total > max_bytes:
            raise TooLarge(f"{where}: evidence is over {max_bytes} bytes (the registry's "
                           "KCERT_OBSERVATION_EVIDENCE_MAX); send it as null")  # fmt: skip
        array = _array(item, f"{where}, evidence {name!r}")
        got = str(anchor(array))
        if got != named:
            raise InvalidInput(f"{where}: evidence {name!r} anchors to {got}, the mismatch "
                               f"names {named}")  # fmt: skip
        data = array.tobytes()
        manifest[name] = {"dtype": item.dtype, "shape": list(item.shape), "anchor": got,
                          "bytes": len(data)}  # fmt: skip
        parts.append(data)
    return DecodedEvidence(manifest, b"".join(parts))


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


def encode_arrays(manifest: Mapping[str, Mapping[str, Any]], blob: bytes) -> dict[str, Any]:
    """The evidence as the wire format sends it (``GET .../evidence``)."""
    out: dict[str, Any] = {}
    offset = 0
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

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "notes": list(self.notes)}


def recheck(
    kernel: Any, mismatch: Mapping[str, Any], arrays: Mapping[str, np.ndarray[Any, Any]]
) -> Recheck:
    """Run ``kernel``'s reference (a :class:`kcert.certify.spec.KernelSpec`) on the evidence.

    The reference's answer is anchored as float64 and as the output's own dtype;
    either may be what the guard recorded. Outputs present in the evidence are
    compared with the reference under the spec's tolerance (``atol + rtol·|ref|``).
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
    if wrong:
        return Recheck(False, (f"the evidence's shape of {', '.join(wrong)} is not what the "
                               f"recorded dims {dims} give",))  # fmt: skip
    if any(math.prod(launch.shapes[b.name]) > MAX_RECHECK_ELEMENTS for b in kernel.outputs):
        return Recheck(None, (f"an output of the recorded dims {dims} is over "
                              f"{MAX_RECHECK_ELEMENTS} elements: not re-run",))  # fmt: skip
    expected = Reference(kernel)(arrays, launch, probe="runtime-mismatch")
    notes: list[str] = []
    recorded_ref = mismatch.get("reference", {})
    reproduced: bool | None = None
    for out in kernel.outputs:
        ref = expected[out.name]
        anchors = {str(anchor(ref)), str(anchor(ref.astype(host_dtype(out.dtype))))}
        said = recorded_ref.get(out.name)
        if said is not None:
            notes.append(f"reference {out.name}: " + ("same anchor as recorded" if said in anchors
                         else "a different anchor than recorded (reference drift?)"))  # fmt: skip
        if out.name not in arrays or out.name in wanted:
            # An inout buffer's evidence is its value before the call, never the kernel's output.
            notes.append(f"output {out.name} is not in the evidence: the mismatch itself is "
                         "not re-checked, only the reference")  # fmt: skip
            continue
        got = arrays[out.name].astype(np.float64)
        tol = kernel.tolerance.get(out.dtype)
        atol, rtol = (tol.atol, tol.rtol) if tol is not None else (1e-5, 1.3e-6)
        with np.errstate(all="ignore"):
            error = np.abs(got - ref)
            bad = ~(error <= atol + rtol * np.abs(ref))
        count = int(np.count_nonzero(bad))
        reproduced = bool(reproduced) or count > 0
        worst = float(np.nanmax(error)) if error.size else 0.0
        notes.append(f"output {out.name}: {count} element(s) outside atol {atol:g} + rtol "
                     f"{rtol:g}·|ref| (max error {worst:.6g})")  # fmt: skip
    return Recheck(reproduced, tuple(notes))


def served_arrays(
    served: Mapping[str, Any], manifest: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, np.ndarray[Any, Any]], list[str]]:
    """The arrays a registry served for a mismatch, each held against the logged manifest.

    Returns the arrays whose bytes anchor to what the log recorded, and a note for
    each that does not (or is missing): a registry cannot swap the evidence unseen.
    """
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    notes: list[str] = []
    got = served.get("arrays") if isinstance(served.get("arrays"), Mapping) else {}
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
