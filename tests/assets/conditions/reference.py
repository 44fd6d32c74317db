"""NumPy reference of the condition-reading kernels: all of them add."""


def add(x, y, **_):
    return x + y
