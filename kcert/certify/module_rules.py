"""What a Triton kernel module may hold, and the walk that finds everything else.

The allowlists below, with what :mod:`kcert.certify.jit_rules` lets a
``@triton.jit`` body name, are the whole policy: :class:`ModuleRules`
walks a module's top level in order, as the importer would run it, and records
a :class:`Finding` for every construct outside them.
:mod:`kcert.certify.module_check` is the entry point (decoding, parsing, the error).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from kcert.certify.jit_rules import (
    API_SUBMODULES,
    api_name,
    chain,
    chain_problem,
    children,
    dunder,
    name_problem,
    subscript_problem,
)
from kcert.certify.jit_rules import short as _short

#: Modules a kernel module may import: what a kernel needs to be written and
#: annotated, none of which does anything on import beyond defining names. Of
#: Triton's own submodules, only the device API ones (``triton.language.math``,
#: ``extra.libdevice``...) are admitted, and only their API names may be imported.
ALLOWED_MODULES = frozenset({"math", "typing", "__future__", *API_SUBMODULES})
#: Names ``from triton import ...`` may bind: the decorators, their config and
#: pure helpers. Host-side subpackages (``runtime``, ``compiler``, ``knobs``...)
#: can launch, compile or reconfigure Triton, so they stay out.
TRITON_NAMES = frozenset(
    {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language"}
)
#: Keyword arguments with plain-data meanings; every other keyword of these
#: calls takes a callable or a path and is refused.
JIT_KEYWORDS = frozenset(
    {"do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"}
)
AUTOTUNE_KEYWORDS = frozenset(
    {"configs", "key", "reset_to_zero", "restore_value", "warmup", "rep", "use_cuda_graph",
     "cache_results"}
)  # fmt: skip
CONFIG_KEYWORDS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})
#: Keywords that hand Triton Python to call around launches or tuning: named
#: in their own message because they are the usual way to smuggle code in.
HOOK_KEYWORDS = frozenset(
    {"pre_hook", "post_hook", "pre_run_hook", "prune_configs_by", "early_config_prune",
     "perf_model", "top_k", "do_bench", "repr", "launch_metadata"}
)  # fmt: skip
#: What a heuristics lambda may call: pure functions of numbers.
HEURISTIC_CALLS = frozenset({"triton.next_power_of_2", "triton.cdiv", "min", "max", "int"})
#: Module attributes a literal expression may name: numbers and dtypes, not code.
LITERAL_ATTRIBUTES = frozenset(
    {f"math.{n}" for n in ("pi", "e", "tau", "inf", "nan")}
    | {f"triton.language.{t}" for t in (
        "float16", "bfloat16", "float32", "float64", "int1", "int8", "int16", "int32",
        "int64", "uint8", "uint16", "uint32", "uint64", "float8e4nv", "float8e5",
    )}
)  # fmt: skip
#: Builtins that read, build or run code, reach the interpreter's internals or
#: talk to the outside; a kernel has no use for any of them.
BANNED_NAMES = frozenset(
    {"__builtins__", "__import__", "eval", "exec", "compile", "open", "getattr", "setattr",
     "delattr", "hasattr", "globals", "locals", "vars", "dir", "breakpoint", "input", "help",
     "exit", "quit", "type", "super", "memoryview",
     # true under the interpreter, decided differently by the compiler: a kernel that asks
     # (isinstance(a, float)) runs one branch on the CPU and another on the GPU
     "isinstance", "issubclass", "callable", "id", "hash"}
)  # fmt: skip
#: The syntax a jit body may use: what Triton's code generator compiles (its ``visit_``
#: methods; ``tests/certify/test_jit_rules.py`` checks this against the installed Triton),
#: and the operator and context nodes inside them. Anything else (``match``, ``try``,
#: ``raise``, ``del``, a lambda, ``*args``) is Python that only the interpreter would run.
JIT_BODY_NODES: tuple[type[ast.AST], ...] = (
    ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Assert, ast.Expr, ast.For, ast.If, ast.While,
    ast.With, ast.withitem, ast.Return, ast.Pass,
    ast.Attribute, ast.BinOp, ast.BoolOp, ast.Call, ast.Compare, ast.Constant, ast.IfExp,
    ast.JoinedStr, ast.FormattedValue, ast.List, ast.ListComp, ast.comprehension, ast.Name,
    ast.NamedExpr, ast.Slice, ast.Subscript, ast.Tuple, ast.UnaryOp, ast.keyword,
    ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
)  # fmt: skip

#: What to do about a finding, unless a more specific fix exists.
ALLOW = "or certify with --allow-module-code (its module code then runs in the sandbox only)"
REMOVE = f"remove it, {ALLOW}"


@dataclass(frozen=True, slots=True)
class Finding:
    """One refused construct: 1-based line, 0-based column, what it is and what to do."""

    line: int
    col: int
    message: str


_STATEMENTS = {
    ast.If: "an if statement", ast.Try: "a try statement", ast.With: "a with statement",
    ast.For: "a for loop", ast.While: "a while loop", ast.Match: "a match statement",
    ast.Global: "a global statement", ast.Nonlocal: "a nonlocal statement",
    ast.Delete: "a del statement", ast.Raise: "a raise statement",
    ast.Assert: "an assert statement",
}  # fmt: skip
_JIT, _AUTOTUNE, _HEURISTICS = "triton.jit", "triton.autotune", "triton.heuristics"
_CONFIG, _CONSTEXPR = "triton.Config", "triton.language.constexpr"
_ANNOTATION_NODES = (
    ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.Constant, ast.BinOp, ast.BitOr,
    ast.Load,
)  # fmt: skip


class ModuleRules:
    """One pass over a module's top level; :attr:`findings` holds what it refused."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> the dotted name it was imported as
        self.constants: set[str] = set()
        self.config_lists: set[str] = set()
        self.kernels: set[str] = set()
        self.locals: set[int] = set()  # the Name nodes of the jit body being walked that are locals

    def add(self, node: ast.AST, what: str, todo: str = REMOVE) -> None:
        line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0)
        self.findings.append(Finding(line, col, f"{what}; {todo}"))

    def qualname(self, node: ast.expr) -> str | None:
        """``tl.extra.libdevice.exp`` -> ``triton.language.extra.libdevice.exp``, via imports."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(parts)])

    # -- the top level -----------------------------------------------------------------

    def module(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                if isinstance(stmt.value.value, str):
                    continue  # the docstring, or a string used as a comment: data
            if isinstance(stmt, ast.Import):
                self.import_(stmt)
            elif isinstance(stmt, ast.ImportFrom):
                self.import_from(stmt)
            elif isinstance(stmt, ast.FunctionDef):
                self.function(stmt)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
                self.assignment(stmt)
            elif not isinstance(stmt, ast.Pass):
                self.add(stmt, f"{_statement(stmt)} runs when the module is imported")

    def import_(self, stmt: ast.Import) -> None:
        for alias in stmt.names:
            if not _module_allowed(alias.name):
                self.add(stmt, _not_allowed(alias.name))
            elif alias.asname:
                self.bind(stmt, alias.asname, alias.name)
            else:
                top = alias.name.split(".")[0]
                self.bind(stmt, top, top)

    def import_from(self, stmt: ast.ImportFrom) -> None:
        module = stmt.module or ""
        if stmt.level:
            dots = "." * stmt.level
            self.add(stmt, f"a relative import (from {dots}{module} import ...) loads code")
            return
        if not _module_allowed(module):
            self.add(stmt, _not_allowed(module))
            return
        for alias in stmt.names:
            if alias.name == "*":
                self.add(stmt, f"a star import (from {module} import *) binds unseen names")
            elif module == "triton" and alias.name not in TRITON_NAMES:
                allowed = ", ".join(sorted(TRITON_NAMES))
                self.add(stmt, f"from triton import {alias.name} (only {allowed} may be)")
            elif module not in ("triton", "typing", "__future__") and not api_name(
                f"{module}.{alias.name}", submodule=True
            ):  # fmt: skip
                self.add(stmt, f"from {module} import {alias.name}, which is not public "
                               f"Triton device API (a function, class or dtype)")  # fmt: skip
            elif module != "__future__":
                self.bind(stmt, alias.asname or alias.name, f"{module}.{alias.name}")

    def bind(self, node: ast.stmt, name: str, target: str | None) -> None:
        """Record a module-level name; rebinding an import or a kernel changes what runs."""
        if name in self.aliases and self.aliases[name] == target:
            return  # import triton; import triton.language
        if name in self.aliases or name in self.kernels:
            what = f"'{name}' is bound again, so code that uses it gets something else"
            self.add(node, what, "rename it")
        elif target is not None:
            self.aliases[name] = target

    def assignment(self, stmt: ast.Assign | ast.AnnAssign | ast.AugAssign) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        parts = [p for t in targets for p in _unpacked(t)]
        for part in parts:
            if not isinstance(part, ast.Name):
                kind = "an attribute" if isinstance(part, ast.Attribute) else "a subscript"
                self.add(part, f"an assignment to {kind} ({_short(part)} = ...) changes a "
                               "function or module when the module is imported")  # fmt: skip
        names = [p.id for p in parts if isinstance(p, ast.Name)]
        if len(names) != len(parts):
            return
        if isinstance(stmt, ast.AnnAssign):
            self.annotation(stmt.annotation)
        value = stmt.value
        if any(dunder(n) and n != "__all__" for n in names):
            self.add(stmt, f"binding a special name ({', '.join(names)}) changes the module")
            return
        if "__all__" in names:
            strings = isinstance(value, ast.List | ast.Tuple) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
            )
            if not strings:
                self.add(stmt, "__all__ that is not a list of strings")
            return
        config = value is not None and self.config_list(value, report=False)
        if value is not None and not config:
            if (
                isinstance(value, ast.Call) and self.qualname(value.func) == _CONSTEXPR
                and len(value.args) == 1 and not value.keywords
            ):  # fmt: skip
                value = value.args[0]
            problem = self.literal(value)
            if problem is not None:
                what = f"a module constant bound to {problem} (not a literal) runs code on import"
                self.add(value, what, f"use literals and earlier constants, {ALLOW}")
                return
        for name in names:
            if name in self.aliases or name in self.kernels:
                self.bind(stmt, name, None)
            (self.config_lists if config else self.constants).add(name)

    # -- literal data --------------------------------------------------------------------

    def literal(self, node: ast.expr, bound: Iterable[str] = ()) -> str | None:
        """None when ``node`` is literal data, else a description of the first part that is not."""
        if isinstance(node, ast.Constant):
            return None if node.value is not Ellipsis else "..."
        if isinstance(node, ast.Tuple | ast.List):
            return next((p for e in node.elts if (p := self.literal(e, bound))), None)
        if isinstance(node, ast.UnaryOp):
            return self.literal(node.operand, bound)
        if isinstance(node, ast.BinOp):
            return self.literal(node.left, bound) or self.literal(node.right, bound)
        if isinstance(node, ast.Name):
            known = node.id in self.constants or node.id in bound
            return None if known else f"the name {node.id}"
        if isinstance(node, ast.Attribute) and self.qualname(node) in LITERAL_ATTRIBUTES:
            return None
        return _describe(node)

    def annotation(self, node: ast.expr) -> None:
        """Annotations are evaluated on import (or by ``typing``): names and subscripts only."""
        for part in ast.walk(node):
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                try:  # a string annotation is code too, for typing.get_type_hints
                    inner = ast.parse(part.value, mode="eval").body
                except SyntaxError:
                    continue
                for sub in ast.walk(inner):
                    ast.copy_location(sub, part)
                self.annotation(inner)
                continue
            bad = (
                not isinstance(part, _ANNOTATION_NODES)
                or isinstance(part, ast.Name) and (dunder(part.id) or part.id in BANNED_NAMES)
                or isinstance(part, ast.Attribute) and self.annotation_chain(part) is not None
            )  # fmt: skip
            if bad:
                what = f"an annotation holding {_describe(part)} runs code when evaluated"
                self.add(part, what, f"annotate with names such as tl.constexpr, {ALLOW}")
                return

    def annotation_chain(self, node: ast.Attribute) -> str | None:
        """``tl.constexpr`` and ``typing.Optional``; other chains as in a kernel body."""
        names, base = chain(node)
        if isinstance(base, ast.Name) and self.aliases.get(base.id) == "typing":
            private = next((n for n in names if n.startswith("_")), None)
            return None if private is None else f"the private attribute {private}"
        return chain_problem(node, self.aliases, as_value=False)

    # -- autotune configs ----------------------------------------------------------------

    def config_list(self, node: ast.expr, *, report: bool = True) -> bool:
        """``[triton.Config({...}, num_warps=4), ...]``, a comprehension of them, or a name."""
        if isinstance(node, ast.Name) and node.id in self.config_lists:
            return True
        if isinstance(node, ast.ListComp) and self.comprehension(node, report=report):
            return True
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            results = [self.config(e, (), report=report) for e in node.elts]  # report each
            return all(results)
        if report:
            self.add(node, f"triton.autotune configs as {_describe(node)}, not a list of "
                           "triton.Config(...) with literal arguments")  # fmt: skip
        return False

    def comprehension(self, node: ast.ListComp, *, report: bool) -> bool:
        bound: set[str] = set()
        for gen in node.generators:
            target = gen.target
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if gen.ifs or gen.is_async or not all(isinstance(n, ast.Name) for n in names):
                return False
            if self.literal(gen.iter, bound) is not None:
                return False
            bound.update(n.id for n in names if isinstance(n, ast.Name))
        return self.config(node.elt, bound, report=report)

    def config(self, node: ast.expr, bound: Iterable[str], *, report: bool) -> bool:
        if not (isinstance(node, ast.Call) and self.qualname(node.func) == _CONFIG):
            if report:
                self.add(node, f"an autotune config that is {_describe(node)}, not triton.Config")
            return False
        meta = node.args[0] if node.args else None
        ok = (
            len(node.args) == 1 and isinstance(meta, ast.Dict)
            and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in meta.keys)
            and not any(self.literal(v, bound) for v in meta.values)
        )  # fmt: skip
        if not ok and report:
            self.add(node, "a triton.Config whose first argument is not a dict of literals")
        return self.keywords(node, CONFIG_KEYWORDS, "triton.Config", bound, report=report) and ok

    def keywords(
        self, call: ast.Call, allowed: frozenset[str], what: str, bound: Iterable[str] = (),
        *, report: bool = True,
    ) -> bool:  # fmt: skip
        """Keyword arguments from ``allowed``, with literal values; hooks named as such."""
        ok = True
        for kw in call.keywords:
            if kw.arg in HOOK_KEYWORDS:
                message = f"{what}(..., {kw.arg}=...) hands Triton Python to call on launches"
            elif kw.arg is None or kw.arg not in allowed:
                message = (f"{what}(..., {kw.arg or '**'}...), a keyword not among "
                           f"{', '.join(sorted(allowed))}")  # fmt: skip
            elif (problem := self.literal(kw.value, bound)) is not None:
                message = f"{what}({kw.arg}=...) bound to {problem}, not a literal"
            else:
                continue
            ok = False
            if report:
                self.add(kw.value, message)
        return ok

    # -- kernels -------------------------------------------------------------------------

    def function(self, fn: ast.FunctionDef) -> None:
        decorators = fn.decorator_list
        jit = decorators[-1] if decorators and self.callee(decorators[-1]) == _JIT else None
        if jit is None:
            what = f"a function without @triton.jit innermost (def {fn.name}) is host Python"
            self.add(fn, what, f"make it a @triton.jit kernel or remove it, {ALLOW}")
        for deco in decorators[:-1] if jit is not None else decorators:
            self.decorator(deco)
        if isinstance(jit, ast.Call):
            if jit.args:
                self.add(jit, "@triton.jit(...) with positional arguments")
            self.keywords(jit, JIT_KEYWORDS, "triton.jit")
        self.signature(fn.args)
        if fn.returns is not None:
            self.annotation(fn.returns)
        if jit is not None:
            self.kernel_body(fn)
        self.bind(fn, fn.name, None)
        self.kernels.add(fn.name)

    def callee(self, deco: ast.expr) -> str | None:
        return self.qualname(deco.func if isinstance(deco, ast.Call) else deco)

    def decorator(self, deco: ast.expr) -> None:
        name = self.callee(deco)
        if name not in (_AUTOTUNE, _HEURISTICS) or not isinstance(deco, ast.Call):
            self.add(deco, f"the decorator @{_short(deco)} (only triton.autotune(...) and "
                           "triton.heuristics(...) may sit above @triton.jit)")  # fmt: skip
        elif name == _AUTOTUNE:
            if len(deco.args) > 2:
                self.add(deco, "triton.autotune with more than configs and key")
            named = dict(zip(("configs", "key"), deco.args, strict=False))
            named |= {k.arg: k.value for k in deco.keywords if k.arg == "configs"}
            if "configs" in named:
                self.config_list(named["configs"])
            rest = [ast.keyword(arg=k, value=v) for k, v in named.items() if k != "configs"]
            rest += [k for k in deco.keywords if k.arg != "configs"]
            call = ast.Call(func=deco.func, args=[], keywords=rest)
            self.keywords(call, AUTOTUNE_KEYWORDS, "triton.autotune")
        else:
            values = deco.args[0] if len(deco.args) == 1 and not deco.keywords else None
            if not isinstance(values, ast.Dict) or not all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) for k in values.keys
            ):  # fmt: skip
                self.add(deco, "triton.heuristics without one dict of names to lambdas")
                return
            for value in values.values:
                self.heuristic(value)

    def heuristic(self, node: ast.expr) -> None:
        args = node.args if isinstance(node, ast.Lambda) else None
        if not isinstance(node, ast.Lambda) or args is None or len(args.args) != 1 or any(
            (args.posonlyargs, args.kwonlyargs, args.vararg, args.kwarg, args.defaults)
        ):  # fmt: skip
            self.add(node, f"a heuristics value that is {_describe(node)}, not a 1-argument lambda")
            return
        problem = self.pure(node.body, args.args[0].arg)
        if problem is not None:
            bad, what = problem
            calls = ", ".join(sorted(HEURISTIC_CALLS))
            self.add(bad, f"{what} inside a heuristics lambda (it may only index its argument, "
                          f"do arithmetic and comparisons and call {calls})")  # fmt: skip

    def pure(self, node: ast.expr, arg: str) -> tuple[ast.expr, str] | None:
        """None when ``node`` is a pure expression over ``arg``, else the part that is not."""
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Name):
            return None if node.id in (arg, *self.constants) else (node, f"the name {node.id}")
        if isinstance(node, ast.Call):
            name = self.qualname(node.func)
            if name is None and isinstance(node.func, ast.Name):
                name = node.func.id if node.func.id not in self.constants else None
            if name not in HEURISTIC_CALLS or node.keywords:
                return node, f"a call to {_short(node)}"
            children: list[ast.expr] = list(node.args)
        elif isinstance(node, ast.Subscript):
            if self.literal(node.slice) is not None:
                return node.slice, f"the index {_short(node.slice)}"
            children = [node.value]
        elif isinstance(node, ast.BinOp | ast.UnaryOp | ast.Compare | ast.BoolOp | ast.IfExp):
            children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
        else:
            return node, _describe(node)
        return next((p for c in children if (p := self.pure(c, arg))), None)

    def signature(self, args: ast.arguments) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            problem = self.literal(default)
            if problem is not None:
                self.add(default, f"a default argument value of {problem} runs on import")
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None and arg.annotation is not None:
                self.annotation(arg.annotation)

    def kernel_body(self, fn: ast.FunctionDef) -> None:
        """What a jit body may not hold, since the interpreter runs it as Python."""
        self.locals = _local_names(fn)
        stack: list[ast.AST] = list(reversed(fn.body))
        while stack:
            node = stack.pop()
            what = self.kernel_problem(node)
            if what is None:
                stack.extend(reversed(children(node, self.aliases)))
            else:  # one finding per construct: x.__class__.__bases__ is not two
                self.add(node, f"{what} in @triton.jit {fn.name} runs as Python in the "
                               "interpreter, or is called by the compiler")  # fmt: skip

    def kernel_problem(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            if dunder(node.id) or node.id in BANNED_NAMES and id(node) not in self.locals:
                return f"a use of {node.id}"
            return name_problem(node, self.aliases)
        if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
            kind = "an attribute" if isinstance(node, ast.Attribute) else "a subscript"
            # it could change Triton's own objects (tl.dtype.FP_TYPES) in the build child
            return f"an assignment to {kind} ({_short(node)} = ...)"
        if isinstance(node, ast.Attribute):
            return chain_problem(node, self.aliases)
        if isinstance(node, ast.Subscript) and (problem := subscript_problem(node, self.aliases)):
            return problem
        if isinstance(node, ast.Import | ast.ImportFrom):
            return f"an import inside a function ({_short(node)})"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            return f"a nested {type(node).__name__.removesuffix('Def').lower()}"
        if isinstance(node, ast.Global | ast.Nonlocal):
            return f"a {type(node).__name__.lower()} statement"
        if not isinstance(node, JIT_BODY_NODES):
            kind = type(node).__name__
            what = f"a {kind.lower()} statement" if isinstance(node, ast.stmt) else _describe(node)
            return f"{what}, which Triton does not compile,"
        return None


def _local_names(fn: ast.FunctionDef) -> set[int]:
    """The ``id`` of each Name node in ``fn``'s body that surely names a local, not a builtin.

    A parameter is a local everywhere. A plain assignment binds its names for the
    statements after it in the same block (and the blocks inside them); a for loop
    binds its target for its body. Anything weaker (a binding in one branch of an
    if, before the loop that may not run, an augmented assignment, a walrus)
    binds nothing here: Triton's code generator resolves a name that its scope
    does not hold yet as a builtin, so ``input = input`` reads the builtin.
    """
    params = fn.args
    args = [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]
    found: set[int] = set()
    _bind_block(fn.body, frozenset(a.arg for a in args if a is not None), found)
    return found


def _bind_block(body: list[ast.stmt], bound: frozenset[str], found: set[int]) -> None:
    for stmt in body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = [p for t in stmt.targets for p in _unpacked(t)]
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        found.update(id(t) for t in targets if isinstance(t, ast.Name))
        if isinstance(stmt, ast.For | ast.If | ast.While | ast.With):
            _bind_compound(stmt, bound, found)
        else:
            found.update(id(n) for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id in bound)
        bound |= names


def _bind_compound(
    stmt: ast.For | ast.If | ast.While | ast.With, bound: frozenset[str], found: set[int]
) -> None:
    """The parts a compound statement runs before its blocks see ``bound``; its blocks recurse."""
    inner = bound
    if isinstance(stmt, ast.For):
        heads: list[ast.AST] = [stmt.iter]
        loop = [p for p in _unpacked(stmt.target) if isinstance(p, ast.Name)]
        found.update(id(p) for p in loop)
        inner = bound | {p.id for p in loop}
    elif isinstance(stmt, ast.If | ast.While):
        heads = [stmt.test]
    else:
        heads = list(stmt.items)
    for head in heads:
        found.update(id(n) for n in ast.walk(head) if isinstance(n, ast.Name) and n.id in bound)
    _bind_block(stmt.body, inner, found)
    _bind_block(getattr(stmt, "orelse", []), bound, found)  # a for's else runs after its loop


def _unpacked(target: ast.expr) -> list[ast.expr]:
    return target.elts if isinstance(target, ast.Tuple | ast.List) else [target]


def _module_allowed(name: str) -> bool:
    return name in ALLOWED_MODULES


def _not_allowed(module: str) -> str:
    return (f"an import of {module} (a kernel module may import only triton, "
            "triton.language and its math, standard and extra.libdevice submodules, "
            "math and typing)")  # fmt: skip


def _statement(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return f"a module-level call ({_short(stmt.value)})"
    if isinstance(stmt, ast.Expr):
        return f"a module-level expression ({_short(stmt.value)})"
    if isinstance(stmt, ast.ClassDef):
        return f"a class definition (class {stmt.name})"
    if isinstance(stmt, ast.AsyncFunctionDef):
        return f"an async function (async def {stmt.name})"
    kind = _STATEMENTS.get(type(stmt), f"a {type(stmt).__name__} statement")
    return f"{kind} at module level ({_short(stmt)})"


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return f"a call ({_short(node)})"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, ast.NamedExpr):
        return f"an assignment expression ({_short(node).removeprefix('(').removesuffix(')')})"
    if isinstance(node, ast.expr):
        return f"{type(node).__name__} ({_short(node)})"
    return type(node).__name__
