"""Minimization: the smallest shape on which a failing check still fails.

Dims are shrunk one at a time, in the spec's order, keeping the others at
their current values. For each dim the candidates are the listed values
below the current one, tried smallest first; then a bisection between the
largest candidate that passed and the smallest that failed finds sizes the
spec never listed. The search never leaves the spec's domain: no dim goes
below its smallest listed value (a reference may index out of range below
it), and the predicate says False where the spec cannot launch. Failures
need not be monotone in size (a tail bug fails at 33 and passes at 32), so
the result is a local minimum: no single dim can be made smaller by the
search without the check passing. A shared budget bounds how many runs
minimization may cost. When a try cannot be judged (the reference raises
there), the predicate raises :class:`Stop`; the search keeps the smallest
failing shape it has and says why it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Decides whether the check still fails at these dims (it runs the kernel).
Predicate = Callable[[Mapping[str, int]], bool]


class Stop(Exception):
    """Raised by a predicate that cannot judge a shape; the message says why."""


@dataclass(frozen=True, slots=True)
class Minimized:
    """The smallest failing dims found, and why the search ended early (None: it finished)."""

    dims: dict[str, int]
    stopped: str | None = None


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
    return search(start, listed, fails, budget=budget).dims


def search(
    start: Mapping[str, int], listed: Mapping[str, tuple[int, ...]], fails: Predicate,
    *, budget: Budget,
) -> Minimized:  # fmt: skip
    """:func:`minimize`, saying why it stopped when it did not finish."""
    progress: dict[str, int] = dict(start)
    try:
        return Minimized(_shrink(progress, listed, fails, budget))
    except Stop as stop:
        return Minimized(dict(progress), str(stop))
    except _BudgetSpent:
        return Minimized(dict(progress), "the minimization budget was spent")


class _BudgetSpent(Exception):
    pass


def _shrink(
    current: dict[str, int], listed: Mapping[str, tuple[int, ...]], fails: Predicate,
    budget: Budget,
) -> dict[str, int]:  # fmt: skip
    """Shrink ``current`` in place (so that a stop keeps what was found) and return it."""
    start = dict(current)
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
        floor = min(listed.get(name) or (1,))
        candidates = sorted({floor, *(v for v in listed.get(name, ()) if v < value)} - {value})
        passed_below = floor - 1
        for candidate in candidates:
            if candidate > value:
                break  # a start below the listed values: nothing smaller is in the domain
            verdict = test({**current, name: candidate})
            if verdict is None:
                raise _BudgetSpent
            if verdict:
                value = current[name] = candidate
                break
            passed_below = candidate
        lo, hi = passed_below, value  # lo passes (or is below the domain), hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            verdict = test({**current, name: mid})
            if verdict is None:
                raise _BudgetSpent
            if verdict:
                hi = current[name] = mid
            else:
                lo = mid
        current[name] = hi
    return current
