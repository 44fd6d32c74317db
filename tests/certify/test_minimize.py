"""Minimization shrinks each dim to the smallest size that still fails."""

from __future__ import annotations

from collections.abc import Mapping

from kcert.certify.minimize import Budget, Stop, minimize, search


def test_monotone_failure_is_bisected_below_the_listed_values() -> None:
    calls: list[dict[str, int]] = []

    def fails(dims: Mapping[str, int]) -> bool:
        calls.append(dict(dims))
        return dims["n"] >= 37  # never a listed value

    result = minimize({"n": 1000}, {"n": (1, 32, 1000)}, fails, budget=Budget(40))
    assert result == {"n": 37}
    assert all(c["n"] < 1000 for c in calls)


def test_tail_bug_shrinks_to_the_smallest_listed_failing_size() -> None:
    # fails only when n is not a multiple of 32 (an unmasked tail), and never at 1
    def fails(dims: Mapping[str, int]) -> bool:
        return dims["n"] % 32 != 0 and dims["n"] > 1

    result = minimize({"n": 1000}, {"n": (1, 31, 32, 33, 1000)}, fails, budget=Budget(40))
    assert result == {"n": 2}


def test_each_dim_shrinks_while_the_others_stay() -> None:
    def fails(dims: Mapping[str, int]) -> bool:
        return dims["m"] >= 3 and dims["k"] >= 17

    result = minimize({"m": 100, "n": 64, "k": 100},
                      {"m": (1, 3, 100), "n": (1, 64), "k": (1, 16, 100)}, fails,
                      budget=Budget(60))
    assert result == {"m": 3, "n": 1, "k": 17}


def test_the_budget_bounds_the_runs_and_keeps_a_failing_shape() -> None:
    seen: list[int] = []

    def fails(dims: Mapping[str, int]) -> bool:
        seen.append(dims["n"])
        return dims["n"] >= 500

    result = minimize({"n": 1000}, {"n": (1, 1000)}, fails, budget=Budget(3))
    assert len(seen) == 3
    assert fails(result)


def test_no_dim_goes_below_its_smallest_listed_value() -> None:
    seen: list[int] = []

    def fails(dims: Mapping[str, int]) -> bool:
        seen.append(dims["n"])
        return True  # fails everywhere: the search would go down to 1

    result = minimize({"n": 100}, {"n": (8, 33, 100)}, fails, budget=Budget(40))
    assert result == {"n": 8}
    assert min(seen) == 8


def test_a_shape_that_cannot_be_judged_stops_the_search_and_keeps_the_failure() -> None:
    def fails(dims: Mapping[str, int]) -> bool:
        if dims["n"] < 40:
            raise Stop(f"the reference raised at n={dims['n']}")
        return True

    found = search({"m": 50, "n": 100}, {"m": (1, 50), "n": (1, 100)}, fails,
                   budget=Budget(40))  # fmt: skip
    # m shrank to 1 before n's first try stopped the search; n keeps its failing value
    assert found.dims == {"m": 1, "n": 100}
    assert found.stopped == "the reference raised at n=1"


def test_a_spent_budget_is_said() -> None:
    found = search({"n": 1000}, {"n": (1, 1000)}, lambda dims: dims["n"] >= 500,
                   budget=Budget(3))  # fmt: skip
    assert found.stopped is not None and "budget" in found.stopped
    assert found.dims["n"] >= 500
