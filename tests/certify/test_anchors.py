"""Anchors are sha256 over exactly the bytes docs/certificate.md fixes."""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np

from kcert.certify.anchors import anchor, anchor_bytes_header


def test_golden_float32_anchor_from_hand_built_bytes() -> None:
    values = [1.0, -2.5, 0.0, 3.25, 7.0, -0.0]
    array = np.array(values, dtype=np.float32).reshape(2, 3)
    raw = b"kcert-array-v1\0" + b"<f4" + b"\0" + b"2,3" + b"\0" + struct.pack("<6f", *values)
    assert str(anchor(array)) == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert anchor_bytes_header(array) == raw[: -4 * 6]


def test_int64_one_dimensional_and_bool() -> None:
    ints = np.array([1, -1, 1 << 40], dtype=np.int64)
    raw = b"kcert-array-v1\0<i8\0" + b"3\0" + struct.pack("<3q", 1, -1, 1 << 40)
    assert anchor(ints).hex == hashlib.sha256(raw).hexdigest()
    flags = np.array([True, False, True])
    raw = b"kcert-array-v1\0|b1\0" + b"3\0" + bytes([1, 0, 1])
    assert anchor(flags).hex == hashlib.sha256(raw).hexdigest()


def test_bfloat16_is_named_as_numpy_writes_it() -> None:
    array = np.array([1.0, -2.0], dtype=ml_dtypes.bfloat16)
    raw = b"kcert-array-v1\0<V2\0" + b"2\0" + bytes([0x80, 0x3F, 0x00, 0xC0])
    assert anchor(array).hex == hashlib.sha256(raw).hexdigest()


def test_byte_order_and_memory_layout_do_not_change_the_anchor() -> None:
    little = np.arange(12, dtype="<f8").reshape(3, 4)
    big = little.astype(">f8")
    fortran = np.asfortranarray(little)
    wide = np.zeros((3, 8), dtype="<f8")
    wide[:, ::2] = little
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    assert anchor(big) == anchor(little) == anchor(fortran) == anchor(strided)


def test_shape_and_dtype_are_part_of_the_anchor() -> None:
    flat = np.zeros(6, dtype=np.float32)
    assert anchor(flat) != anchor(flat.reshape(2, 3))
    assert anchor(flat) != anchor(flat.view(np.int32))
