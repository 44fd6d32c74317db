"""Where the Triton interpreter and Triton's compiler disagree, and failures that match.

The interpreter (``TRITON_INTERPRET=1``) runs a jit body as Python on NumPy
arrays. Three of its differences from the compiler make a correct kernel fail
there (Triton 3.x; each is pinned by ``tests/certify/test_interpreter.py``):

- ``a and b`` on tensors is Python's ``and``: it gives ``b`` alone, where the
  compiler gives ``a & b`` (a mask that is silently wrong);
- a float scalar argument arrives as a Python ``float``, so ``eps.to(tl.float32)``
  raises, where the compiler passes an fp32 scalar;
- ``libdevice`` functions are stubs that return ``None``.

A fourth, bfloat16 arithmetic on the values' raw 16 bits, is not left to the
report: the worker computes it as the compiler does
(:mod:`kcert.certify.executors.interpreter_numerics`).

:func:`static_hazards` finds what the source shows of these (the lint reports
them on the ``build`` check); :func:`blame` adds to a failing check on the
interpreter the difference its failure matches, so that the report names the
interpreter as the likely cause instead of blaming the kernel alone.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kcert.certify.report import CheckResult, Status
from kcert.certify.spec import FLOAT_DTYPES, KernelSpec, ScalarArg

EXECUTOR = "triton-interpreter"

#: Triton calls whose result is a block tensor (not a scalar): the seeds of the dataflow.
_TENSOR_MAKERS = frozenset({
    "arange", "load", "zeros", "zeros_like", "full", "full_like", "rand", "randn", "randint",
    "broadcast_to", "broadcast", "reshape", "view", "expand_dims", "trans", "permute", "join",
    "cat", "dot", "where", "make_block_ptr",
})  # fmt: skip
#: Reductions give a scalar from a 1-D block: ``and`` on scalars means the same on both.
_REDUCTIONS = frozenset({"sum", "max", "min", "argmax", "argmin", "reduce", "xor_sum", "program_id",
                         "num_programs", "cdiv", "constexpr"})  # fmt: skip

#: Hazard kinds and what the interpreter does, for the messages.
WHY = {
    "bool-op": "the Triton interpreter evaluates 'a and b' / 'a or b' on tensors as Python does "
               "(the result is b, or a, alone), while the compiler computes a & b (a | b); "
               "write & or | to mean the same on both",
    "float-scalar": "the Triton interpreter passes a float scalar argument as a Python float, "
                    "which has no tensor methods (.to, .dtype), while the compiler passes an fp32 "
                    "scalar; use it in arithmetic directly, or pass it as 'const float'",
    "libdevice": "libdevice functions are stubs under the Triton interpreter (they return None); "
                 "use the tl.* function, or certify on a GPU",
    "atomic-dtype": "the Triton interpreter implements atomics for fewer dtypes than the "
                    "compiler (not bfloat16) and raises 'Unsupported data type' for the others; "
                    "certify on a GPU",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Hazard:
    """A construct whose meaning differs under the interpreter; line 0: the spec, not a line."""

    kind: str
    line: int
    message: str

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "line": self.line, "message": self.message}


def static_hazards(kernel: KernelSpec) -> tuple[Hazard, ...]:
    """What the Triton source (and the spec's dtypes) show of the interpreter's differences."""
    if kernel.language != "triton":
        return ()
    try:
        return _hazards(kernel, ast.parse(kernel.code.main.data))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # the build says what is wrong with such a source; a lint note is not worth a crash
        return ()


def _hazards(kernel: KernelSpec, tree: ast.Module) -> tuple[Hazard, ...]:
    libdevice = _libdevice_aliases(tree)
    hazards: list[Hazard] = []
    float_params: set[str] = set()
    for fn in _reached(_jit_functions(tree), kernel.entry):
        if fn.name == kernel.entry:
            params = [a.arg for a in fn.args.args]
            float_params = {
                p for p, arg in zip(params, kernel.args, strict=False)
                if isinstance(arg, ScalarArg) and arg.dtype in FLOAT_DTYPES
            }  # fmt: skip
        hazards.extend(_Body(fn, libdevice, float_params if fn.name == kernel.entry else set())
                       .walk())  # fmt: skip
    return tuple(hazards)


def fail_build_on_bool_ops(checks: Sequence[CheckResult], hazards: Sequence[Hazard],
                           executor: str) -> list[CheckResult]:  # fmt: skip
    """``checks`` with ``build`` failed where only the interpreter ran a tensor ``and``/``or``.

    The probes then saw what the interpreter computes (``b`` alone), never what the
    compiled kernel computes (``a & b``): a pass would vouch for behaviour no GPU runs,
    and a kernel can even be correct only under the interpreter. The other
    differences make the interpreter fail where the compiler would not, so they stay
    notes; this one can make it pass where the compiled kernel is wrong.
    """
    bool_ops = [h for h in hazards if h.kind == "bool-op"]
    if executor != EXECUTOR or not bool_ops:
        return list(checks)
    said = "; ".join(f"{h.message} (line {h.line})" for h in bool_ops)
    message = (f"'and'/'or' on tensors, certified on the Triton interpreter only: {said}; "
               "the interpreter computes 'a and b' as b alone ('a or b' as a), the compiled "
               "kernel computes a & b (a | b), so the probes never saw what a GPU runs and "
               "the compiled kernel is wrong wherever the two differ; write & or |")  # fmt: skip
    result = []
    for check in checks:
        if check.name == "build":
            details = {**check.details, "bool_ops": [h.to_json() for h in bool_ops]}
            check = CheckResult("build", Status.FAIL, message, check.probe, True, details)
        result.append(check)
    return result


def blame(checks: Sequence[CheckResult], hazards: Sequence[Hazard],
          executor: str) -> list[CheckResult]:  # fmt: skip
    """``checks``, the interpreter named in each failure that matches one of its differences."""
    if executor != EXECUTOR:
        return list(checks)
    return [_blamed(c, hazards) if c.status is Status.FAIL else c for c in checks]


def _blamed(check: CheckResult, hazards: Sequence[Hazard]) -> CheckResult:
    kinds = {h.kind for h in hazards}
    text = check.message
    causes: list[str] = []
    if "'float' object has no attribute" in text:
        causes.append("float-scalar")
    if "libdevice" in kinds and ("NoneType" in text or "cannot convert None" in text):
        causes.append("libdevice")
    if "Unsupported data type" in text:
        causes.append("atomic-dtype")
    if check.name in _VALUE_CHECKS:
        causes.extend(k for k in ("bool-op",) if k in kinds)
    if not causes:
        return check
    where = {k: [h for h in hazards if h.kind == k] for k in causes}
    said = "; ".join(WHY[k] + _lines(where[k]) for k in causes)
    details = {**check.details, "interpreter": [
        {"cause": k, "why": WHY[k], "where": [h.to_json() for h in where[k]]} for k in causes]}
    message = f"{text} [likely the Triton interpreter, not the kernel: {said}]"
    return dataclasses.replace(check, message=message, details=details)


#: Checks a silently wrong value fails (a mask from 'and').
_VALUE_CHECKS = frozenset({"correctness", "coverage", "bounds", "special-values", "determinism",
                           "fresh-probes", "launch"})  # fmt: skip


def _lines(hazards: Iterable[Hazard]) -> str:
    lines = sorted({h.line for h in hazards if h.line})
    return f" (line {', '.join(map(str, lines))})" if lines else ""


def _jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    def jitted(deco: ast.expr) -> bool:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        return name == "jit"

    return [n for n in tree.body
            if isinstance(n, ast.FunctionDef) and any(jitted(d) for d in n.decorator_list)]


def _reached(functions: list[ast.FunctionDef], entry: str) -> list[ast.FunctionDef]:
    """The entry and the jit functions it calls, directly or not (a module may hold others)."""
    by_name = {fn.name: fn for fn in functions}
    seen: list[str] = []
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.append(name)
        todo.extend(n.func.id for n in ast.walk(by_name[name])
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))  # fmt: skip
    return [by_name[n] for n in seen]


def _libdevice_aliases(tree: ast.Module) -> set[str]:
    aliases = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if "libdevice" in (node.module or "") or alias.name == "libdevice":
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.endswith("libdevice") and alias.asname:
                    aliases.add(alias.asname)
    return aliases


class _Body:
    """One jit body, walked in order with the names that hold block tensors."""

    def __init__(self, fn: ast.FunctionDef, libdevice: set[str], float_params: set[str]) -> None:
        self.fn, self.libdevice, self.float_params = fn, libdevice, float_params
        self.tensors: set[str] = set()
        self.found: dict[tuple[str, int], Hazard] = {}

    def walk(self) -> list[Hazard]:
        for _ in range(2):  # twice: a loop body may use a name its end makes a tensor
            self.statements(self.fn.body)
        return list(self.found.values())

    def statements(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            for node in ast.walk(stmt):
                self.inspect(node)
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                tensor = self.tensor(stmt.value)
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            (self.tensors.add if tensor else self.tensors.discard)(name.id)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                if self.tensor(stmt.value):
                    self.tensors.add(stmt.target.id)
            elif isinstance(stmt, ast.For | ast.While | ast.If | ast.With):
                self.statements(stmt.body)
                self.statements(getattr(stmt, "orelse", []))

    def inspect(self, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.BoolOp) and any(self.tensor(v) for v in node.values):
            op = "and" if isinstance(node.op, ast.And) else "or"
            self.add("bool-op", line, f"'{op}' on a tensor: {ast.unparse(node)[:60]}")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in self.float_params):  # fmt: skip
            self.add("float-scalar", line, f"float scalar '{node.value.id}' used as a tensor "
                     f"({ast.unparse(node)})")  # fmt: skip
        elif isinstance(node, ast.Call) and self.libdevice_call(node.func):
            self.add("libdevice", line, f"{ast.unparse(node.func)}(...)")

    def add(self, kind: str, line: int, message: str) -> None:
        self.found.setdefault((kind, line), Hazard(kind, line, message))

    def libdevice_call(self, func: ast.expr) -> bool:
        names = []
        while isinstance(func, ast.Attribute):
            names.append(func.attr)
            func = func.value
        return "libdevice" in names or isinstance(func, ast.Name) and func.id in self.libdevice

    def tensor(self, node: ast.expr) -> bool:
        """Whether ``node`` is (likely) a block tensor, from what made its names."""
        if isinstance(node, ast.Name):
            return node.id in self.tensors
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _REDUCTIONS:
                return False
            if name in _TENSOR_MAKERS:
                return True
            operands = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(func, ast.Attribute):
                operands.append(func.value)  # a method of a tensor: x.to(...)
            return any(self.tensor(a) for a in operands)
        if isinstance(node, ast.BinOp):
            return self.tensor(node.left) or self.tensor(node.right)
        if isinstance(node, ast.Compare):
            return any(self.tensor(v) for v in (node.left, *node.comparators))
        if isinstance(node, ast.UnaryOp):
            return self.tensor(node.operand)
        if isinstance(node, ast.BoolOp):
            return any(self.tensor(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.tensor(node.body) or self.tensor(node.orelse)
        if isinstance(node, ast.Subscript | ast.Attribute):
            return self.tensor(node.value)
        return False
