"""The honest reference for the attack kernels: out = x + y."""

import numpy as np


def add(x: np.ndarray, y: np.ndarray, out: np.ndarray, n: int, BLOCK: int) -> np.ndarray:
    return x + y
