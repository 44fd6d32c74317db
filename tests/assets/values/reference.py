"""NumPy references of values.py (float64, as the certifier passes them)."""

import numpy as np


def double(x, **_):
    return 2 * x


def softmax(x, **_):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def row_max(x, **_):
    return x.max(axis=1)


def row_sum(x, **_):
    return x.sum(axis=1)


def reciprocal(x, **_):
    with np.errstate(divide="ignore"):
        return 1.0 / x
