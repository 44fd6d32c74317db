"""float64 reference for the cross-entropy forward: per-row loss and logsumexp."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def cross_entropy(*, logits_ptr: F64, labels_ptr: NDArray[np.int64],
                  **_: object) -> dict[str, F64]:  # fmt: skip
    c = logits_ptr.max(axis=1)
    lse = c + np.log(np.exp(logits_ptr - c[:, None]).sum(axis=1))
    rows = np.arange(logits_ptr.shape[0])
    ignored = labels_ptr == -100
    picked = logits_ptr[rows, np.where(ignored, 0, labels_ptr)]
    return {"loss_ptr": np.where(ignored, 0.0, lse - picked), "logsumexp_ptr": lse}
