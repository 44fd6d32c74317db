"""The spec's expression language: parsed into a small tree, never evaluated as Python.

Grammar (precedence from low to high)::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '//' | '%') unary)*
    unary  := '-' unary | atom
    atom   := INT | FLOAT | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'

Functions: ``cdiv(a, b)``, ``next_pow2(x)``, ``min(a, ...)``, ``max(a, ...)``.
Names resolve to dims, scalars and (numeric) consts, listed before or after:
the spec evaluates them in dependency order. Sizes are bounded so that a
hostile spec can neither exhaust memory nor recurse the parser to death.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kcert.certify.errors import ExprError

MAX_LENGTH = 512
MAX_DEPTH = 32
#: Values past this magnitude are refused: no launch or shape needs them.
MAX_MAGNITUDE = 1 << 62

Number = int | float

_FUNCTIONS = {"cdiv": 2, "next_pow2": 1, "min": -1, "max": -1}
_TOKEN = re.compile(
    r"\s*(?:(?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*%(),]))"
)


@dataclass(frozen=True, slots=True)
class Const:
    value: Number


@dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Node


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Node, ...]


Node = Const | Name | Neg | BinOp | Call


@dataclass(frozen=True, slots=True)
class Expr:
    """A parsed expression and the text it came from."""

    text: str
    root: Node

    def names(self) -> frozenset[str]:
        return _names(self.root)

    def evaluate(self, env: Mapping[str, Number]) -> Number:
        value = _evaluate(self.root, env)
        _check_magnitude(value)
        return value

    def evaluate_int(self, env: Mapping[str, Number]) -> int:
        value = self.evaluate(env)
        if not isinstance(value, int):
            raise ExprError(f"'{self.text}' must give an integer, got {value!r}")
        return value

    def __str__(self) -> str:
        return self.text


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if match is None or match.end() == pos:
            bad = stripped[pos:].lstrip()[:1]
            raise ExprError(f"unexpected character {bad!r} in '{text}'")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] == value:
            self.pos += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.take(value):
            tok = self.peek()
            found = "the end" if tok is None else repr(tok[1])
            raise ExprError(f"expected {value!r} but found {found} in '{self.text}'")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"'{self.text[:40]}...' nests deeper than {MAX_DEPTH} levels")

    def parse(self) -> Node:
        if not self.tokens:
            raise ExprError("empty expression")
        node = self.expr()
        tok = self.peek()
        if tok is not None:
            raise ExprError(f"unexpected {tok[1]!r} in '{self.text}'")
        return node

    def expr(self) -> Node:
        self.enter()
        node = self.term()
        while (tok := self.peek()) in (("op", "+"), ("op", "-")):
            assert tok is not None
            self.pos += 1
            node = BinOp(tok[1], node, self.term())
        self.depth -= 1
        return node

    def term(self) -> Node:
        node = self.unary()
        while (tok := self.peek()) is not None and tok[0] == "op" and tok[1] in ("*", "//", "%"):
            self.pos += 1
            node = BinOp(tok[1], node, self.unary())
        return node

    def unary(self) -> Node:
        if self.take("-"):
            self.enter()
            node: Node = Neg(self.unary())
            self.depth -= 1
            return node
        return self.atom()

    def atom(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise ExprError(f"'{self.text}' ends where a value was expected")
        kind, value = tok
        self.pos += 1
        if kind == "int":
            number = int(value)
            _check_magnitude(number)
            return Const(number)
        if kind == "float":
            real = float(value)
            _check_magnitude(real)
            return Const(real)
        if kind == "name":
            if self.take("("):
                return self.call(value)
            return Name(value)
        if value == "(":
            self.enter()
            node = self.expr()
            self.expect(")")
            self.depth -= 1
            return node
        raise ExprError(f"unexpected {value!r} in '{self.text}'")

    def call(self, func: str) -> Node:
        if func not in _FUNCTIONS:
            known = ", ".join(sorted(_FUNCTIONS))
            raise ExprError(f"unknown function {func!r} in '{self.text}'; known: {known}")
        self.enter()
        args = [self.expr()]
        while self.take(","):
            args.append(self.expr())
        self.expect(")")
        self.depth -= 1
        arity = _FUNCTIONS[func]
        if arity >= 0 and len(args) != arity:
            raise ExprError(f"{func}() takes {arity} argument(s), got {len(args)} in '{self.text}'")
        if arity < 0 and len(args) < 2:
            raise ExprError(f"{func}() takes at least 2 arguments in '{self.text}'")
        return Call(func, tuple(args))


def parse_expr(text: object) -> Expr:
    """Parse an expression given as TOML text or a number."""
    if isinstance(text, bool):
        raise ExprError(f"expected an expression, got the boolean {text!r}")
    if isinstance(text, int | float):
        _check_magnitude(text)
        return Expr(str(text), Const(text))
    if not isinstance(text, str):
        raise ExprError(f"expected an expression, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression is {len(text)} characters long; the limit is {MAX_LENGTH}")
    return Expr(text.strip(), _Parser(text).parse())


def next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _check_magnitude(value: Number) -> None:
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            raise ExprError(f"value {value!r} is out of range (finite, magnitude below 2**62)")
    elif abs(value) > MAX_MAGNITUDE:
        raise ExprError("integer value is out of range (magnitude below 2**62)")


def _names(node: Node) -> frozenset[str]:
    match node:
        case Name(name):
            return frozenset({name})
        case Neg(operand):
            return _names(operand)
        case BinOp(_, left, right):
            return _names(left) | _names(right)
        case Call(_, args):
            return frozenset().union(*(_names(a) for a in args))
    return frozenset()


def _as_int(value: Number, what: str) -> int:
    if not isinstance(value, int):
        raise ExprError(f"{what} needs integers, got {value!r}")
    return value


def _evaluate(node: Node, env: Mapping[str, Number]) -> Number:
    match node:
        case Const(value):
            return value
        case Name(name):
            if name not in env:
                known = ", ".join(sorted(env)) or "none"
                raise ExprError(f"unknown name {name!r}; known here: {known}")
            return env[name]
        case Neg(operand):
            return -_evaluate(operand, env)
        case BinOp(op, left, right):
            a, b = _evaluate(left, env), _evaluate(right, env)
            result = _binop(op, a, b)
            _check_magnitude(result)
            return result
        case Call(func, args):
            values = [_evaluate(a, env) for a in args]
            if func == "cdiv":
                n, d = (_as_int(v, "cdiv") for v in values)
                if d == 0:
                    raise ExprError("cdiv by zero")
                return -(-n // d)
            if func == "next_pow2":
                return next_pow2(_as_int(values[0], "next_pow2"))
            return min(values) if func == "min" else max(values)
    raise ExprError(f"cannot evaluate {node!r}")


def _binop(op: str, a: Number, b: Number) -> Number:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise ExprError(f"'{op}' by zero")
    if op == "//":
        return _as_int(a, "//") // _as_int(b, "//")
    return _as_int(a, "%") % _as_int(b, "%")
