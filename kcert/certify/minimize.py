"""Minimization: the smallest shape on which a failing check still fails.

Dims are shrunk one at a time, in the spec's order, keeping the others at
their current values. For each dim the candidates are 1 and the listed
values below the current one, tried smallest first; then a bisection
between the largest candidate that passed and the smallest that failed
finds sizes the spec never listed. Failures need not be monotone in size
(a tail bug fails at 33 and passes at 32), so the result is a local
minimum: no single dim can be made smaller by the search without the check
passing. A shared budget bounds how many runs minimization may cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: Decides whether the check still fails at these dims (it runs the kernel).
Predicate = Callable[[Mapping[str, int]], bool]


class Budget:
    """How many more predicate calls minimization may make."""

    def __init__(self, runs: int) -> None:
        self.left = runs

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def minimize(
    start: Mapping[str, int], listed: Mapping[str, tuple[int, ...]], fails: Predicate,
    *, budget: Budget,
) -> dict[str, int]:  # fmt: skip
    """Shrink ``start`` (a failing assignment) dim by dim while ``fails`` stays true."""
    current = dict(start)
    cache: dict[tuple[tuple[str, int], ...], bool] = {tuple(sorted(current.items())): True}

    def test(dims: dict[str, int]) -> bool | None:
        key = tuple(sorted(dims.items()))
        if key in cache:
            return cache[key]
        if not budget.take():
            return None
        cache[key] = bool(fails(dims))
        return cache[key]

    for name in start:
        value = current[name]
        candidates = sorted({1, *(v for v in listed.get(name, ()) if v < value)} - {value})
        passed_below = 0
        for candidate in candidates:
            verdict = test({**current, name: candidate})
            if verdict is None:
                return current
            if verdict:
                value = candidate
                break
            passed_below = candidate
        lo, hi = passed_below, value  # lo passes (or is 0), hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            verdict = test({**current, name: mid})
            if verdict is None:
                current[name] = hi
                return current
            if verdict:
                hi = mid
            else:
                lo = mid
        current[name] = hi
    return current
