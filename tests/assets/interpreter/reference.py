"""NumPy reference of the interpreter kernels."""


def add(x, y, **_):
    return x + y
