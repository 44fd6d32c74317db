"""Element-wise helpers of the probe checks on the bytes a kernel can leave behind."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from kcert.certify.elementwise import lost_specials, unexpected_specials


def _bf16(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=np.uint16).view(ml_dtypes.bfloat16)


def test_a_signalling_nan_left_in_a_bf16_output_is_judged_not_warned_about() -> None:
    # run A's poison is a NaN of drawn payload, quiet bit clear included; NumPy warns
    # "invalid value encountered in cast" when it widens such a bf16 NaN, and under
    # `filterwarnings = error` (or a caller's strict warnings) that warning was raised
    # out of the check instead of the element being reported
    got = _bf16(0x7F81, 0x3F80, 0xFF81)  # sNaN, 1.0, -sNaN
    ref = _bf16(0x3F80, 0x3F80, 0x3F80)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bad = unexpected_specials("bf16", got, ref, np.zeros(3))
        assert bad.tolist() == [True, False, True]
        assert lost_specials("bf16", ref, got).tolist() == [True, False, True]
