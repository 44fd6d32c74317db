"""NumPy references for the CUDA C adversarial kernels and their correct counterparts.

Every reference gets each kernel argument by name (``out`` buffers too), so
each takes ``**_`` for the ones it does not need.
"""

import numpy as np


def add(x, y, **_):
    return x + y


def relu(x, **_):
    return np.maximum(x, 0.0)


def neighbor_sum(x, **_):
    return x + np.append(x[1:], 0.0)


def row_sum(x, **_):
    return x.sum(axis=1)


def softmax(x, **_):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def matmul(a, b, **_):
    return a @ b


def add_cupy(x, y, out, **_):
    """Baseline for timing: CuPy's own elementwise add on the same device arrays."""
    import cupy

    cupy.add(x, y, out=out)
