"""float64 reference: per-row cross-entropy loss and the first index of each row's maximum."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


def cross_entropy_argmax(
    *, X_ptr: F64, Y_ptr: I64, loss_ptr: F64, ignore_index: int, **_: object
) -> dict[str, NDArray[np.generic]]:
    """An ignored row keeps the loss it came with and predicts -1."""
    c = X_ptr.max(axis=1)
    lse = c + np.log(np.exp(X_ptr - c[:, None]).sum(axis=1))
    rows = np.arange(X_ptr.shape[0])
    ignored = Y_ptr == ignore_index
    picked = X_ptr[rows, np.where(ignored, 0, Y_ptr)]
    predicted = np.where(ignored, -1, X_ptr.argmax(axis=1)).astype(np.int64)
    return {"loss_ptr": np.where(ignored, loss_ptr, lse - picked),
            "predicted_tokens_ptr": predicted}  # fmt: skip
