"""The log's side of C2SP tlog-witness: submit a checkpoint, get a verified cosignature.

The log does not know which size a witness holds. It offers the size it
expects (the previous checkpoint's); a ``409`` answers the witness's size, and
the log retries once from there with the matching consistency proof. A witness
that claims a *larger* size than the new checkpoint, or answers ``422``, raises
:class:`WitnessSawOtherTree`: a claim the caller weighs by fetching the
checkpoint the witness holds (:func:`held_checkpoint`); only one signed by the
log's own key is evidence against the log.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from kcert.log.cosignature import CosignerKey, add_signature_lines
from kcert.log.errors import LogError, WitnessSawOtherTree, WitnessSubmitError
from kcert.log.note import Checkpoint
from kcert.log.witness import SIZE_MEDIA_TYPE, AddCheckpoint, origin_hash

_SIZE_BODY = re.compile(r"^(0|[1-9][0-9]{0,19})\n$")


@dataclass(frozen=True, slots=True)
class WitnessEndpoint:
    """A witness: its submission prefix and its cosigner key."""

    url: str
    key: CosignerKey

    @property
    def label(self) -> str:
        return f"witness {self.key.name} at {self.url}"


ProofSource = Callable[[int, int], Sequence[bytes]]


def submit(
    endpoint: WitnessEndpoint, note: str, checkpoint: Checkpoint, *, old_size: int,
    proof: ProofSource, client: httpx.Client,
) -> str:  # fmt: skip
    """The witness's verified cosignature line(s) on ``note`` (the checkpoint it signs)."""
    url = endpoint.url.rstrip("/") + "/add-checkpoint"
    old = min(old_size, checkpoint.size)
    for _attempt in range(2):
        hashes = tuple(proof(old, checkpoint.size)) if 0 < old < checkpoint.size else ()
        body = AddCheckpoint(old, hashes, note).encode()
        try:
            response = client.post(url, content=body)
        except httpx.HTTPError as exc:
            raise WitnessSubmitError(f"cannot reach {endpoint.label}: {exc}") from exc
        if response.status_code == 200:
            return _verified_lines(endpoint, note, response.text)
        if response.status_code == 409:
            held = _held_size(endpoint, response)
            if held > checkpoint.size:
                raise WitnessSawOtherTree(
                    f"{endpoint.label} has cosigned a tree of {held} entries of this log, "
                    f"larger than the {checkpoint.size} it holds now: the log was rolled back"
                )
            old = held
            continue
        if response.status_code == 422:
            raise WitnessSawOtherTree(
                f"{endpoint.label} refused the checkpoint of size {checkpoint.size} as "
                f"inconsistent with the tree it cosigned before: {response.text.strip()[:200]}"
            )
        raise WitnessSubmitError(
            f"{endpoint.label} answered {response.status_code}: {response.text.strip()[:200]}"
        )
    raise WitnessSubmitError(f"{endpoint.label} kept changing its size; try again later")


def held_checkpoint(endpoint: WitnessEndpoint, origin: str, client: httpx.Client) -> str | None:
    """The note the witness holds for ``origin`` (its monitoring read), or ``None``."""
    url = f"{endpoint.url.rstrip('/')}/{origin_hash(origin)}/checkpoint"
    try:
        response = client.get(url)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _held_size(endpoint: WitnessEndpoint, response: httpx.Response) -> int:
    media = response.headers.get("content-type", "").split(";")[0].strip()
    match = _SIZE_BODY.match(response.text)
    if media != SIZE_MEDIA_TYPE or match is None:
        raise WitnessSubmitError(f"{endpoint.label} answered 409 without a {SIZE_MEDIA_TYPE} size")
    return int(match.group(1))


def _verified_lines(endpoint: WitnessEndpoint, note: str, text: str) -> str:
    """Only the lines by the configured key (name *and* key id), and only when they verify.

    Anything else a witness returns (another key's line, a line named like the
    log) is dropped, never stored: the checkpoint file keeps the log's own
    signature and verified cosignatures, nothing a witness chose to add.
    """
    lines = [line for line in text.splitlines() if line]
    if not lines or not all(line.startswith("\u2014 ") for line in lines):
        raise WitnessSubmitError(f"{endpoint.label} answered 200 without signature lines")
    own = "".join(f"{line}\n" for line in lines if is_by(endpoint.key, line))
    if not own:
        raise WitnessSubmitError(f"{endpoint.label} answered no cosignature by its key")
    try:
        endpoint.key.verify(add_signature_lines(note, own))
    except LogError as exc:
        raise WitnessSubmitError(f"{endpoint.label} answered no valid cosignature: {exc}") from exc
    return own


def with_cosignature(note: str, key: CosignerKey, lines: str) -> str:
    """``note`` with ``key``'s signature lines replaced by ``lines`` (a fresher cosignature)."""
    body, sep, signatures = note.partition("\n\n")
    kept = [line for line in signatures.splitlines() if line and not is_by(key, line)]
    return body + sep + "".join(f"{line}\n" for line in kept) + lines


def is_by(key: CosignerKey, line: str) -> bool:
    """Whether the signature ``line`` names ``key`` and carries its key id."""
    parts = line[2:].split(" ")
    if len(parts) != 2 or parts[0] != key.name:
        return False
    try:
        blob = base64.b64decode(parts[1].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    return blob[:4] == key.key_id
