"""Property tests for the spec's expression language (kcert.certify.expr).

Two independent oracles: expression trees built together with their value,
and Python's own integer arithmetic over the same text (Python shares the
grammar's precedence for ``+ - * // %`` and unary minus). Hostile input of
every kind must raise ExprError and nothing else, and never hang.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcert.certify.errors import ExprError
from kcert.certify.expr import MAX_DEPTH, MAX_LENGTH, MAX_MAGNITUDE, parse_expr
from kcert.errors import KcertError

ENV = {"n": 1000, "m": 33, "k": 1, "BLOCK": 256, "x_1": -7}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


@dataclass(frozen=True)
class Case:
    text: str
    value: int
    #: False when some intermediate value leaves the allowed range.
    in_range: bool


def _ok(value: int) -> bool:
    return abs(value) <= MAX_MAGNITUDE


leaves = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(lambda v: Case(str(v), v, True)),
    st.sampled_from(sorted(ENV)).map(lambda name: Case(name, ENV[name], True)),
)


def _extend(children: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    def binop(op: str, a: Case, b: Case) -> Case:
        ok = a.in_range and b.in_range
        if op == "+":
            v = a.value + b.value
        elif op == "-":
            v = a.value - b.value
        elif op == "*":
            v = a.value * b.value
        elif op == "//":
            v = a.value // b.value
        else:
            v = a.value % b.value
        return Case(f"({a.text} {op} {b.text})", v, ok and _ok(v))

    nonzero = children.filter(lambda c: c.value != 0)
    return st.one_of(
        st.builds(binop, st.sampled_from(["+", "-", "*"]), children, children),
        st.builds(binop, st.sampled_from(["//", "%"]), children, nonzero),
        children.map(lambda c: Case(f"-{c.text}", -c.value, c.in_range)),
        children.map(lambda c: Case(f"( {c.text} )", c.value, c.in_range)),
        st.builds(
            lambda a, b: Case(f"cdiv({a.text}, {b.text})", _cdiv(a.value, b.value),
                              a.in_range and b.in_range),
            children, nonzero,
        ),  # fmt: skip
        children.map(
            lambda c: Case(f"next_pow2({c.text})", _next_pow2(c.value),
                           c.in_range and _ok(_next_pow2(c.value)))
        ),  # fmt: skip
        st.builds(
            lambda f, cs: Case(f"{f}({', '.join(c.text for c in cs)})",
                               (min if f == "min" else max)(c.value for c in cs),
                               all(c.in_range for c in cs)),
            st.sampled_from(["min", "max"]), st.lists(children, min_size=2, max_size=4),
        ),  # fmt: skip
    )


cases = st.recursive(leaves, _extend, max_leaves=12).filter(
    lambda c: len(c.text) <= MAX_LENGTH and c.text.count("(") < MAX_DEPTH
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.filter_too_much])
@given(cases)
def test_tree_oracle(case: Case) -> None:
    expr = parse_expr(case.text)
    if case.in_range and _ok(case.value):
        assert expr.evaluate(ENV) == case.value
        assert expr.evaluate_int(ENV) == case.value
        assert expr.names() <= set(ENV)
    else:
        with pytest.raises(ExprError):
            expr.evaluate(ENV)


_FLAT_TOKENS = st.sampled_from(["+", "-", "*", "//", "%"])


@st.composite
def flat_expressions(draw: st.DrawFn) -> str:
    """Unparenthesised chains, so that precedence and associativity decide the value."""
    operands = draw(st.lists(st.integers(min_value=1, max_value=999), min_size=1, max_size=8))
    parts = [("-" if draw(st.booleans()) else "") + str(operands[0])]
    for value in operands[1:]:
        parts += [draw(_FLAT_TOKENS), ("-" if draw(st.booleans()) else "") + str(value)]
    return " ".join(parts)


@settings(max_examples=300)
@given(flat_expressions())
def test_precedence_matches_python_integers(text: str) -> None:
    # Python's integer grammar is the oracle here: same operators, same precedence.
    expected = eval(text, {"__builtins__": {}})  # noqa: S307 - integers and operators only
    assert parse_expr(text).evaluate({}) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("cdiv(n, 256)", 4), ("cdiv(1, 256)", 1), ("next_pow2(1000)", 1024),
        ("next_pow2(1)", 1), ("next_pow2(0)", 1), ("min(n, m, 5)", 5), ("max(-n, m)", 33),
        ("-7 // 2", -4), ("-7 % 3", 2), ("2 * -3", -6), ("1.5 * 2", 3.0), ("  n  ", 1000),
        ("n - m - k", 966), ("n // m // 2", 15),
    ],
)  # fmt: skip
def test_known_values(text: str, value: float) -> None:
    assert parse_expr(text).evaluate(ENV) == value


def test_numbers_are_expressions() -> None:
    assert parse_expr(7).evaluate({}) == 7
    assert parse_expr(2.5).evaluate({}) == 2.5


HOSTILE = [
    "__import__('os')", "__import__('os').system('true')", "n.__class__", "n.real",
    "lambda: 1", "(lambda x: x)(1)", "'abc'", '"n"', "[1, 2]", "{1: 2}", "n if m else k",
    "n ** 2", "n / 2", "n and m", "not n", "n < m", "n == m", "n & m", "n | m", "n ^ m",
    "~n", "n << 2", "f'{n}'", "exec('1')", "eval('1')", "open('x')", "getattr(n, 'x')",
    "sum([1])", "abs(n)", "cdiv(n)", "cdiv(n, 2, 3)", "next_pow2(n, 2)", "min(n)", "max()",
    "cdiv(n, 0)", "n // 0", "n % 0", "n // 1.5", "1.5 % 2", "cdiv(1.5, 2)", "next_pow2(0.5)",
    "", "   ", "(", ")", "(n", "n)", "n m", "n +", "* n", "n,", ",", "1e999", "1e400 * 0",
    "9" * 40, "2" + "*4611686018427387904" * 2, "4611686018427387904 * 4611686018427387904",
    "n\x00", "n;import os", "n # comment", "\\n", "n\\", "$n", "@n", "n!", "unknown_name",
    "cdiv(n, unknown)", "min(n, __builtins__)",
]  # fmt: skip


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_input_raises_expr_error(text: str) -> None:
    with pytest.raises(ExprError):
        parse_expr(text).evaluate(ENV)


@pytest.mark.parametrize(
    "text",
    [
        "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1),
        "-" * (MAX_DEPTH + 5) + "1",
        "cdiv(" * (MAX_DEPTH + 1) + "1" + ", 1)" * (MAX_DEPTH + 1),
        "(" * 250 + "1" + ")" * 250,
        "-" * (MAX_LENGTH - 1) + "1",
        "1" + "+1" * (MAX_LENGTH // 2),
        "n" * (MAX_LENGTH + 1),
        "(" * 100_000,
        "1+" * 200_000 + "1",
    ],
)
def test_deep_or_long_input_is_refused(text: str) -> None:
    with pytest.raises(ExprError):
        parse_expr(text).evaluate(ENV)


def test_long_flat_chain_within_limits_evaluates() -> None:
    # A left-deep chain as long as the length limit allows must not hit Python's recursion.
    text = "+".join(["1"] * ((MAX_LENGTH + 1) // 2))
    assert parse_expr(text).evaluate({}) == (MAX_LENGTH + 1) // 2


@pytest.mark.parametrize("value", [None, True, False, [1], {"a": 1}, b"n", object()])
def test_non_text_values_raise_expr_error(value: object) -> None:
    with pytest.raises(ExprError):
        parse_expr(value)


def test_unknown_name_error_lists_known_names() -> None:
    with pytest.raises(ExprError) as info:
        parse_expr("n + q").evaluate({"n": 1})
    assert "'q'" in info.value.diagnostics()
    assert "n" in info.value.diagnostics()


def test_evaluate_int_refuses_floats() -> None:
    with pytest.raises(ExprError, match="integer"):
        parse_expr("n * 0.5").evaluate_int({"n": 3})


_ALPHABET = string.ascii_letters[:8] + string.digits + "_+-*/%(),. eE'\"[]{}:;!@#$^&|~<>=?\\\n\t"


@settings(max_examples=500, deadline=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(alphabet=_ALPHABET, max_size=80), st.text(max_size=40)))
def test_fuzz_only_expr_errors(text: str) -> None:
    try:
        expr = parse_expr(text)
    except ExprError:
        return
    try:
        value = expr.evaluate({"a": 3, "b": -2, "c": 7, "e": 1, "E": 2})
    except ExprError:
        return
    assert isinstance(value, int | float)
    assert abs(value) <= MAX_MAGNITUDE


def test_expr_error_is_a_kcert_error() -> None:
    assert issubclass(ExprError, KcertError)
