"""Reference for every sandbox test kernel: a copy."""


def copy(x, n, BLOCK):
    return x.copy()
