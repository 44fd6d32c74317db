"""NumPy references of the condition-reading kernels: an add and a row scale."""

import numpy as np


def add(x, y, **_):
    return x + y


def row_scale(x, w, **_):
    return x.astype(np.float64) * w.astype(np.float64)[None, :]
