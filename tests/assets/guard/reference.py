"""NumPy reference of saxpy."""

import numpy as np


def saxpy(x_ptr: np.ndarray, y_ptr: np.ndarray, a: float, n: int, BLOCK: int) -> np.ndarray:
    return a * x_ptr + y_ptr
