"""Anchors: content addresses of arrays, so that anyone can reproduce a probe's bytes.

An anchor is ``sha256:<hex>`` over exactly these bytes (docs/certificate.md, "Anchors")::

    b"kcert-array-v1\\0" + dtype.str + b"\\0" + ",".join(map(str, shape)) + b"\\0"
    + the array's C-contiguous little-endian bytes

``dtype.str`` is what NumPy writes (``<f4``, ``<i8``, ``|b1``; bfloat16 from
ml_dtypes writes ``<V2``). Big-endian arrays are byte-swapped first and then
named by their little-endian dtype, so the same values always give the same
anchor whatever the host's byte order.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from kcert.digest import Digest

ANCHOR_PREFIX = b"kcert-array-v1\0"


def canonical_array(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` as C-contiguous and little-endian (multi-byte dtypes only change)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def anchor_bytes_header(array: np.ndarray[Any, Any]) -> bytes:
    """The prefix, dtype and shape part of the anchored bytes."""
    canonical = canonical_array(array)
    shape = ",".join(map(str, canonical.shape))
    name: str = canonical.dtype.str
    return ANCHOR_PREFIX + name.encode("ascii") + b"\0" + shape.encode() + b"\0"


def anchor(array: np.ndarray[Any, Any]) -> Digest:
    """The anchor of one array."""
    canonical = canonical_array(array)
    h = hashlib.sha256(anchor_bytes_header(canonical))
    # hash the buffer in place: no copy of a large probe is made
    h.update(canonical.reshape(-1).view(np.uint8).data)
    return Digest(h.hexdigest())
