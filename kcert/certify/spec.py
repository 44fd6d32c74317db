"""``kcert.toml`` format version 1, parsed into frozen, typed models.

The spec is data: expressions go through :mod:`kcert.certify.expr`, never
``eval``. Every error names the file, the kernel, the key and what is wrong.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from kcert.certify.errors import SPEC_NAME, ExprError, SpecError
from kcert.certify.expr import Expr, Number, parse_expr
from kcert.certify.sources import (
    SourceBundle,
    SourceFile,
    SourceReadError,
    read_file,
    read_kernel_source,
)
from kcert.digest import Digest, canonical_json
from kcert.errors import UsageError

#: What ``kcert init`` writes where only the user can say; refused until replaced.
PLACEHOLDER = "FILL_IN"
FORMAT_VERSION = 1

DTYPES: tuple[str, ...] = (
    "f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool",
)  # fmt: skip
FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BUFFER = re.compile(r"^(in|out|inout)\s+([a-z0-9]+)\s*\[(.*)\]$", re.S)
_ASSIGN = re.compile(r"^([a-z0-9]+)\s*=\s*(.+)$", re.S)
_DOMAIN = re.compile(r"^(normal|uniform)\s*\(\s*([^,()]+)\s*,\s*([^,()]+)\s*\)$")
#: ``const float = 1e-5``, ``const str = "gelu"``: constexprs that are not integers.
_TYPED_CONST = re.compile(r"^const\s+(float|str)\s*=\s*(.+)$", re.S)
_STRING_CONST = re.compile(r"""^(["'])([A-Za-z0-9_.:+-]{0,64})\1$""")
#: An unused pointer parameter: Triton gets ``None``, CUDA C a null pointer.
NONE_ARG = "none"
_MAX_DIM_VALUES = 64


class Intent(StrEnum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"


@dataclass(frozen=True, slots=True)
class BufferArg:
    name: str
    intent: Intent
    dtype: str
    shape: tuple[Expr, ...]

    @property
    def is_output(self) -> bool:
        return self.intent is not Intent.IN

    def spec_text(self) -> str:
        return f"{self.intent} {self.dtype}[{', '.join(e.text for e in self.shape)}]"


@dataclass(frozen=True, slots=True)
class ScalarArg:
    name: str
    dtype: str
    value: Expr

    def spec_text(self) -> str:
        return f"{self.dtype} = {self.value.text}"


@dataclass(frozen=True, slots=True)
class ConstArg:
    """A Triton ``tl.constexpr`` parameter: an integer, a float or a string."""

    name: str
    value: Expr | str
    kind: Literal["int", "float", "str"] = "int"

    def spec_text(self) -> str:
        if isinstance(self.value, str):
            return f'const str = "{self.value}"'
        head = "const" if self.kind == "int" else f"const {self.kind}"
        return f"{head} = {self.value.text}"

    def names(self) -> frozenset[str]:
        return frozenset() if isinstance(self.value, str) else self.value.names()


@dataclass(frozen=True, slots=True)
class NoneArg:
    """A pointer parameter the kernel does not use: Triton gets ``None``, CUDA C a null pointer."""

    name: str

    def spec_text(self) -> str:
        return NONE_ARG


Arg = BufferArg | ScalarArg | ConstArg | NoneArg
#: A constexpr's value as the kernel and the reference get it.
ConstValue = int | float | str


@dataclass(frozen=True, slots=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True, slots=True)
class ValueDomain:
    """Where probe inputs for one buffer are drawn from."""

    kind: Literal["auto", "normal", "uniform"]
    a: float = 0.0
    b: float = 0.0
    #: Bounds that depend on the dims, scalars or consts (``uniform(-1, n)``): evaluated
    #: for each probe by :meth:`KernelSpec.bind`; ``a`` and ``b`` are then unused.
    bounds: tuple[Expr, Expr] | None = None

    def spec_text(self) -> str:
        if self.bounds is not None:
            return f"{self.kind}({self.bounds[0].text}, {self.bounds[1].text})"
        return "auto" if self.kind == "auto" else f"{self.kind}({self.a!r}, {self.b!r})"


@dataclass(frozen=True, slots=True)
class ArtifactLimits:
    max_registers: int | None = None
    max_spills: int | None = None
    max_local_bytes: int | None = None
    max_shared_bytes: int | None = None
    required: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """Caps on the probe set: how many probes and how large any one may be."""

    max_probes: int = 48
    fresh: int = 4
    max_elements: int = 1 << 24
    #: Per dim: the largest size fresh probes may draw, or None for the listed values only
    #: (``probes.draw_up_to``; a dim not named gets :mod:`kcert.certify.sizes`' default).
    draw_up_to: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Callable_:
    """A ``file.py:function`` reference, resolved against the spec's folder.

    ``code`` holds the file's bytes as read once when the spec was loaded.
    """

    path: Path
    function: str
    text: str
    code: SourceFile


@dataclass(frozen=True, slots=True)
class Launch:
    """A kernel's launch and arguments bound to one assignment of its dims."""

    dims: Mapping[str, int]
    scalars: Mapping[str, Number]
    consts: Mapping[str, ConstValue]
    shapes: Mapping[str, tuple[int, ...]]
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_mem: int
    #: Value domains whose bounds depend on this launch, evaluated (buffer -> domain).
    domains: Mapping[str, ValueDomain] = field(default_factory=dict)

    def elements(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())


@dataclass(frozen=True, slots=True)
class KernelSpec:
    name: str
    spec_path: Path
    source: Path
    language: Literal["cuda", "triton"]
    entry: str
    reference: Callable_
    baseline: Callable_ | None
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared_mem: Expr
    dims: Mapping[str, tuple[int, ...]]
    args: tuple[Arg, ...]
    tolerance: Mapping[str, Tolerance]
    values: Mapping[str, ValueDomain]
    artifact: ArtifactLimits
    probes: ProbeSettings
    #: The source's bytes (and its local headers), read once when the spec was loaded:
    #: builds, workers and the certificate use these, never the file on disk.
    code: SourceBundle
    build_options: tuple[str, ...] = ()
    num_warps: int | None = None
    #: Non-finite values (``nan``, ``inf``, ``-inf``) an input buffer's probes may hold.
    nonfinite: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Scalars and consts in the order they can be evaluated (each after what it names);
    #: empty: the order they are listed in.
    order: tuple[str, ...] = ()

    @property
    def buffers(self) -> tuple[BufferArg, ...]:
        return tuple(a for a in self.args if isinstance(a, BufferArg))

    @property
    def outputs(self) -> tuple[BufferArg, ...]:
        return tuple(a for a in self.buffers if a.is_output)

    def normalized(self) -> dict[str, Any]:
        """The spec as canonical data: what the spec digest is taken over."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "source": self.source.name,
            "language": self.language,
            "entry": self.entry,
            "reference": self.reference.text,
            "baseline": self.baseline.text if self.baseline else None,
            "grid": [e.text for e in self.grid],
            "block": [e.text for e in self.block],
            "shared_mem": self.shared_mem.text,
            "dims": {k: list(v) for k, v in self.dims.items()},
            "args": [[a.name, a.spec_text()] for a in self.args],
            "tolerance": {k: {"atol": repr(t.atol), "rtol": repr(t.rtol)}
                          for k, t in sorted(self.tolerance.items())},
            "values": {k: v.spec_text() for k, v in sorted(self.values.items())},
            "artifact": {
                "max_registers": self.artifact.max_registers,
                "max_spills": self.artifact.max_spills,
                "max_local_bytes": self.artifact.max_local_bytes,
                "max_shared_bytes": self.artifact.max_shared_bytes,
                "required": list(self.artifact.required),
                "forbidden": list(self.artifact.forbidden),
            },
            "probes": {"max_probes": self.probes.max_probes, "fresh": self.probes.fresh,
                       "max_elements": self.probes.max_elements,
                       # only when set, so that the digests of older specs stay what they were
                       **({"draw_up_to": {k: "listed" if v is None else v for k, v in
                                          sorted(self.probes.draw_up_to.items())}}
                          if self.probes.draw_up_to else {})},
            "build_options": list(self.build_options),
            "num_warps": self.num_warps,
            # only when set, so that specs without it keep their digests
            **({"nonfinite": {k: list(v) for k, v in sorted(self.nonfinite.items())}}
               if self.nonfinite else {}),
        }  # fmt: skip

    @property
    def digest(self) -> Digest:
        """Digest of the normalized spec (whitespace, comments and key order don't count)."""
        return Digest.of_bytes(canonical_json(self.normalized()))

    def bind(self, dims: Mapping[str, int]) -> Launch:
        """Evaluate scalars, consts, shapes and the launch for one assignment of dims."""
        missing = set(self.dims) - set(dims)
        if missing:
            raise self.error("dims", f"no value for dim(s) {', '.join(sorted(missing))}")
        env: dict[str, Number] = dict(dims)
        scalars: dict[str, Number] = {}
        consts: dict[str, ConstValue] = {}
        by_name = {a.name: a for a in self.args}
        order = self.order or tuple(a.name for a in self.args
                                    if isinstance(a, ScalarArg | ConstArg))  # fmt: skip
        key = "args"  # the arg being evaluated, named in the error if it fails
        try:
            for name in order:
                arg, key = by_name[name], f"args.{name}"
                if isinstance(arg, ScalarArg):
                    value = arg.value.evaluate(env)
                    if arg.dtype not in FLOAT_DTYPES and not isinstance(value, int):
                        raise self.error(f"args.{arg.name}", f"{arg.dtype} scalar got {value!r}")
                    scalars[arg.name] = float(value) if arg.dtype in FLOAT_DTYPES else value
                    env[arg.name] = scalars[arg.name]
                elif isinstance(arg, ConstArg):
                    consts[arg.name] = self._const_value(arg, env)
                    if not isinstance(consts[arg.name], str):
                        env[arg.name] = consts[arg.name]  # type: ignore[assignment]
            key = "args"
            shapes = {b.name: tuple(e.evaluate_int(env) for e in b.shape) for b in self.buffers}
            grid = tuple(e.evaluate_int(env) for e in self.grid)
            block = tuple(e.evaluate_int(env) for e in self.block)
            shared_mem = self.shared_mem.evaluate_int(env)
        except ExprError as exc:
            raise self.error(key, f"with dims {dict(dims)}: {exc.diagnostics()}") from exc
        for name, shape in shapes.items():
            if any(extent < 0 for extent in shape):
                raise self.error(f"args.{name}", f"negative extent {shape} with dims {dict(dims)}")
        if any(g < 1 for g in grid):
            raise self.error("grid", f"grid {grid} has an empty axis with dims {dict(dims)}")
        domains = {name: self._bound_domain(name, domain, env, dims)
                   for name, domain in self.values.items() if domain.bounds is not None}
        return Launch(dict(dims), scalars, consts, shapes, grid, block, shared_mem, domains)

    def _const_value(self, arg: ConstArg, env: Mapping[str, Number]) -> ConstValue:
        if isinstance(arg.value, str):
            return arg.value
        if arg.kind == "float":
            return float(arg.value.evaluate(env))
        value = arg.value.evaluate(env)
        if not isinstance(value, int):
            raise ExprError(f"'{arg.value.text}' must give an integer, got {value!r} (a float "
                            f"constexpr is written {arg.name} = \"const float = ...\")")
        return value

    def _bound_domain(self, name: str, domain: ValueDomain, env: Mapping[str, Number],
                      dims: Mapping[str, int]) -> ValueDomain:  # fmt: skip
        """A domain with bounds over the launch (``uniform(-1, n)``), evaluated for it."""
        assert domain.bounds is not None
        try:
            a, b = (float(e.evaluate(env)) for e in domain.bounds)
        except ExprError as exc:
            raise self.error(f"values.{name}", f"with dims {dict(dims)}: "
                             f"{exc.diagnostics()}") from exc  # fmt: skip
        problem = _domain_problem(domain.kind, a, b)
        if problem is not None:
            raise self.error(f"values.{name}", f"{domain.spec_text()} with dims {dict(dims)} "
                             f"gives ({a!r}, {b!r}): {problem}")  # fmt: skip
        return ValueDomain(domain.kind, a, b)

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(message, file=self.spec_path, kernel=self.name, key=key)


@dataclass(frozen=True, slots=True)
class SpecFile:
    path: Path
    kernels: tuple[KernelSpec, ...]

    def kernel(self, name: str | None = None, *, source: Path | None = None) -> KernelSpec:
        """Pick one kernel by name, by source file, or the only one there is."""
        candidates = list(self.kernels)
        if source is not None:
            resolved = source.resolve()
            candidates = [k for k in candidates if k.source.resolve() == resolved]
            if not candidates:
                raise SpecError(f"no [[kernel]] has source = '{source.name}'", file=self.path)
        if name is not None:
            named = [k for k in candidates if k.name == name]
            if not named:
                known = ", ".join(k.name for k in candidates)
                raise SpecError(f"no kernel named '{name}' here (known: {known})", file=self.path)
            return named[0]
        if len(candidates) > 1:
            known = ", ".join(k.name for k in candidates)
            raise SpecError(f"several kernels match; pick one with --kernel ({known})",
                            file=self.path)  # fmt: skip
        return candidates[0]


# ---------------------------------------------------------------------------- loading


def find_spec(source: Path) -> Path:
    """The ``kcert.toml`` beside ``source`` or in the nearest parent folder."""
    folder = source.resolve().parent
    for candidate in (folder, *folder.parents):
        path = candidate / SPEC_NAME
        if path.is_file():
            return path
    raise SpecError(
        f"no {SPEC_NAME} beside {source} or in any parent folder; "
        f"run 'kcert init {source}' to scaffold one"
    )


def resolve_kernel(path: Path, kernel: str | None = None) -> KernelSpec:
    """Resolve a CLI argument (a spec file or a kernel source) to one kernel."""
    if not path.exists():
        raise SpecError(f"{path} does not exist", file=path)
    if path.suffix == ".toml":
        return load_spec(path).kernel(kernel)
    spec = load_spec(find_spec(path))
    return spec.kernel(kernel, source=path)


def resolve_kernels(path: Path, kernel: str | None = None) -> tuple[KernelSpec, ...]:
    """Every kernel a CLI argument names: a spec (or its folder) holds, or one source has.

    With ``kernel``, only that one. A source file stands for each ``[[kernel]]`` built
    from it.
    """
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    if path.is_dir():
        path = path / SPEC_NAME
        if not path.is_file():
            raise UsageError(f"{path.parent} has no {SPEC_NAME}; name a spec or a kernel source")
    if path.suffix == ".toml":
        spec = load_spec(path)
        return (spec.kernel(kernel),) if kernel else spec.kernels
    if path.suffix not in (".cu", ".py"):
        raise UsageError(f"{path} is neither a {SPEC_NAME} nor a kernel source (.cu or .py)")
    spec = load_spec(find_spec(path))
    if kernel:
        return (spec.kernel(kernel, source=path),)
    resolved = path.resolve()
    found = tuple(k for k in spec.kernels if k.source.resolve() == resolved)
    return found or (spec.kernel(source=path),)  # the latter raises, naming the spec


def load_spec(path: Path) -> SpecFile:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}", file=path) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError("is not UTF-8 text", file=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"is not valid TOML: {exc}", file=path) from exc
    return parse_spec(data, path)


def parse_spec(data: Mapping[str, Any], path: Path) -> SpecFile:
    _only_keys(data, {"version", "kernel"}, path, None, "")
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise SpecError(f"format version {version!r} is not supported (only 1)", file=path,
                        key="version")  # fmt: skip
    tables = data.get("kernel")
    if not isinstance(tables, list) or not tables:
        raise SpecError("has no [[kernel]] tables", file=path, key="kernel")
    kernels: list[KernelSpec] = []
    seen: set[str] = set()
    files: dict[Path, SourceFile] = {}
    for index, table in enumerate(tables):
        if not isinstance(table, dict):
            raise SpecError("must be a table", file=path, key=f"kernel[{index}]")
        kernel = _Table(table, path, index, files).parse()
        if kernel.name in seen:
            raise SpecError("appears twice in this file", file=path, kernel=kernel.name,
                            key="name")  # fmt: skip
        seen.add(kernel.name)
        kernels.append(kernel)
    return SpecFile(path, tuple(kernels))


def _only_keys(
    table: Mapping[str, Any], allowed: set[str], path: Path, kernel: str | None, prefix: str
) -> None:
    for key in table:
        if key not in allowed:
            hint = ", ".join(sorted(allowed))
            raise SpecError(f"unknown key (allowed: {hint})", file=path, kernel=kernel,
                            key=f"{prefix}{key}")  # fmt: skip


_KERNEL_KEYS = {
    "name", "source", "entry", "reference", "baseline", "grid", "block", "shared_mem", "dims",
    "args", "tolerance", "values", "nonfinite", "artifact", "probes", "build", "num_warps",
}  # fmt: skip


class _Table:
    """One ``[[kernel]]`` table being parsed; knows how to locate its errors."""

    def __init__(
        self, table: Mapping[str, Any], path: Path, index: int, files: dict[Path, SourceFile]
    ) -> None:
        self.t, self.path = table, path
        #: Files already read for this spec: a reference and a baseline module are one read.
        self.files = files
        name = table.get("name")
        self.name = name if isinstance(name, str) and name else f"#{index + 1}"

    def fail(self, key: str, message: str) -> SpecError:
        return SpecError(message, file=self.path, kernel=self.name, key=key)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.t:
            if default is ...:
                raise self.fail(key, "is required")
            return default
        value = self.t[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise self.fail(key, f"must be {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def expr(self, key: str, value: Any, allowed: set[str]) -> Expr:
        try:
            parsed = parse_expr(value)
        except ExprError as exc:
            raise self.fail(key, exc.diagnostics()) from exc
        unknown = parsed.names() - allowed
        if PLACEHOLDER in unknown:
            raise self.fail(key, _PLACEHOLDER_HINT)
        if unknown:
            raise self.fail(key, f"unknown name(s) {', '.join(sorted(unknown))} in '{parsed}'; "
                            f"known: {', '.join(sorted(allowed)) or 'none'}")  # fmt: skip
        return parsed

    def parse(self) -> KernelSpec:
        _only_keys(self.t, _KERNEL_KEYS, self.path, self.name, "")
        name = self.get("name", str)
        if not _IDENT.match(name.replace("-", "_")):
            raise self.fail("name", f"'{name}' must be letters, digits, '_' or '-'")
        source_text = self.get("source", str)
        source = (self.path.parent / source_text).resolve()
        if source.suffix not in (".cu", ".py"):
            raise self.fail("source", f"'{source_text}' must end in .cu (CUDA C) or .py (Triton)")
        if not source.is_file():
            raise self.fail("source", f"file '{source_text}' not found beside the spec")
        language: Literal["cuda", "triton"] = "cuda" if source.suffix == ".cu" else "triton"
        try:
            code = read_kernel_source(source, language)
        except SourceReadError as exc:
            raise self.fail("source", str(exc)) from exc
        entry = self.get("entry", str)
        if not _IDENT.match(entry):
            raise self.fail("entry", f"'{entry}' is not a function name")
        reference = self.callable("reference", required=True)
        assert reference is not None
        baseline = self.callable("baseline", required=False)
        dims = self.dims()
        args = self.args(set(dims))
        names = set(dims) | _numeric_names(args)
        grid = self.launch_axes("grid", names)
        if language == "cuda":
            block = self.launch_axes("block", names)
        elif "block" in self.t:
            raise self.fail("block", "is CUDA-only; a Triton kernel's block size is a const arg")
        else:
            block = ()
        shared_mem = self.expr("shared_mem", self.get("shared_mem", (int, str), 0), names)
        if language == "triton" and "shared_mem" in self.t:
            raise self.fail("shared_mem", "is CUDA-only")
        num_warps = self.get("num_warps", int, None)
        if num_warps is not None and (language != "triton" or num_warps not in (1, 2, 4, 8, 16)):
            raise self.fail("num_warps", "is for Triton only, and one of 1, 2, 4, 8, 16")
        build = self.t.get("build", {})
        if not isinstance(build, dict):
            raise self.fail("build", "must be a table")
        _only_keys(build, {"options"}, self.path, self.name, "build.")
        options = build.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise self.fail("build.options", "must be a list of strings (NVRTC options)")
        buffers = {a.name: a for a in args if isinstance(a, BufferArg)}
        return KernelSpec(
            name=name, spec_path=self.path, source=source, language=language, entry=entry,
            reference=reference, baseline=baseline, grid=grid, block=block,
            shared_mem=shared_mem, dims=dims, args=args, tolerance=self.tolerance(),
            values=self.values(buffers, names), nonfinite=self.nonfinite(buffers),
            artifact=self.artifact(), probes=self.probe_settings(), code=code,
            build_options=tuple(options), num_warps=num_warps,
            order=self.evaluation_order(args),
        )  # fmt: skip

    def callable(self, key: str, *, required: bool) -> Callable_ | None:
        text = self.get(key, str, ... if required else None)
        if text is None:
            return None
        file, sep, function = text.rpartition(":")
        if not sep or not file.endswith(".py") or not _IDENT.match(function):
            raise self.fail(key, f"'{text}' must look like 'file.py:function'")
        path = (self.path.parent / file).resolve()
        if not path.is_file():
            raise self.fail(key, f"file '{file}' not found beside the spec")
        code = self.files.get(path)
        if code is None:
            try:
                code = self.files[path] = read_file(path)
            except SourceReadError as exc:
                raise self.fail(key, str(exc)) from exc
        return Callable_(path, function, text, code)

    def dims(self) -> dict[str, tuple[int, ...]]:
        table = self.get("dims", dict)
        if not table:
            raise self.fail("dims", "must name at least one dim, e.g. dims = { n = [1, 33, 1000] }")
        dims: dict[str, tuple[int, ...]] = {}
        for dim, values in table.items():
            key = f"dims.{dim}"
            if not _IDENT.match(dim):
                raise self.fail(key, "is not a valid name")
            if values == PLACEHOLDER:
                raise self.fail(key, "still holds the placeholder from 'kcert init': fill in "
                                "the sizes to probe, e.g. [1, 31, 32, 33, 1000]")  # fmt: skip
            if not isinstance(values, list) or not values:
                raise self.fail(key, "must be a non-empty list of sizes")
            if len(values) > _MAX_DIM_VALUES:
                raise self.fail(key, f"has {len(values)} values; at most {_MAX_DIM_VALUES}")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 31:
                    raise self.fail(key, f"{v!r} is not a size between 1 and 2**31")
            dims[dim] = tuple(dict.fromkeys(values))
        return dims

    def args(self, dims: set[str]) -> tuple[Arg, ...]:
        table = self.get("args", dict)
        if not table:
            raise self.fail("args", "must list every kernel parameter in order")
        args: list[Arg] = []
        # a scalar or const may name any other one, listed before or after it: the
        # parameters are in the kernel's order, which need not be the order they are computed in
        known = set(dims) | {name for name, text in table.items()
                             if isinstance(text, str) and _numeric_text(text.strip())}
        for arg_name, text in table.items():
            key = f"args.{arg_name}"
            if not _IDENT.match(arg_name):
                raise self.fail(key, "is not a valid parameter name")
            if not isinstance(text, str):
                raise self.fail(key, "must be a string such as \"in f32[n]\" or \"i32 = n\"")
            args.append(self.arg(key, arg_name, text.strip(), known))
        scalar_names = set(dims) | _numeric_names(args)
        for arg in args:
            if isinstance(arg, BufferArg):
                for e in arg.shape:
                    unknown = e.names() - scalar_names
                    if PLACEHOLDER in unknown:
                        raise self.fail(f"args.{arg.name}", _PLACEHOLDER_HINT)
                    if unknown:
                        names = ", ".join(sorted(unknown))
                        raise self.fail(f"args.{arg.name}", f"unknown name(s) {names} in shape")
        if not any(isinstance(a, BufferArg) and a.is_output for a in args):
            raise self.fail("args", "needs at least one 'out' or 'inout' buffer to check")
        return tuple(args)

    def arg(self, key: str, name: str, text: str, known: set[str]) -> Arg:
        if match := _BUFFER.match(text):
            intent, dtype, shape_text = match.groups()
            self.dtype(key, dtype)
            parts = _split_extents(shape_text) if shape_text.strip() else []
            if not parts or len(parts) > 8:
                raise self.fail(key, "a buffer needs 1 to 8 extents, e.g. f32[m, n]")
            shape = []
            for part in parts:
                try:
                    shape.append(parse_expr(part))
                except ExprError as exc:
                    raise self.fail(key, exc.diagnostics()) from exc
            return BufferArg(name, Intent(intent), dtype, tuple(shape))
        if text == NONE_ARG:
            return NoneArg(name)
        if match := _TYPED_CONST.match(text):
            kind, value = match.groups()
            if kind == "float":
                return ConstArg(name, self.expr(key, value, known), "float")
            literal = _STRING_CONST.match(value.strip())
            if literal is None:
                raise self.fail(key, f"{value.strip()!r} must be a quoted string of at most 64 "
                                "letters, digits or _ . : + - (e.g. const str = \"gelu\")")
            return ConstArg(name, literal.group(2), "str")
        if match := _ASSIGN.match(text):
            head, value = match.groups()
            if head == "const":
                return ConstArg(name, self.expr(key, value, known))
            self.dtype(key, head)
            return ScalarArg(name, head, self.expr(key, value, known))
        raise self.fail(key, f"'{text}' is neither a buffer ('in|out|inout dtype[shape]'), "
                        "a scalar ('dtype = expr'), a const ('const = expr', 'const float = "
                        "expr', 'const str = \"text\"') nor an unused pointer ('none')")

    def dtype(self, key: str, dtype: str) -> None:
        if dtype not in DTYPES:
            raise self.fail(key, f"unknown dtype '{dtype}' (known: {' '.join(DTYPES)})")

    def launch_axes(self, key: str, names: set[str]) -> tuple[Expr, ...]:
        value = self.get(key, list)
        if not 1 <= len(value) <= 3:
            raise self.fail(key, "must have 1 to 3 axes")
        return tuple(self.expr(f"{key}[{i}]", v, names) for i, v in enumerate(value))

    def tolerance(self) -> dict[str, Tolerance]:
        table = self.get("tolerance", dict, {})
        result: dict[str, Tolerance] = {}
        for dtype, entry in table.items():
            key = f"tolerance.{dtype}"
            self.dtype(key, dtype)
            if not isinstance(entry, dict):
                raise self.fail(key, "must be a table like { atol = 1e-5, rtol = 1e-6 }")
            _only_keys(entry, {"atol", "rtol"}, self.path, self.name, f"{key}.")
            bounds = []
            for bound in ("atol", "rtol"):
                v = entry.get(bound, 0.0)
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e30:
                    raise self.fail(f"{key}.{bound}", f"{v!r} must be a non-negative number")
                bounds.append(float(v))
            result[dtype] = Tolerance(*bounds)
        return result

    def evaluation_order(self, args: tuple[Arg, ...]) -> tuple[str, ...]:
        """Scalars and consts, each after the ones its expression names; a cycle is an error."""
        computed = [a for a in args if isinstance(a, ScalarArg | ConstArg)]
        index = {a.name: i for i, a in enumerate(computed)}
        dims = set(self.t.get("dims", {}))
        # ``n = "i32 = n"``: a name that is a dim too means the dim, unless the arg of that
        # name is listed earlier (as it always did)
        deps = {a.name: {d for d in (a.value.names() if isinstance(a, ScalarArg) else a.names())
                         if d in index and (d not in dims or index[d] < index[a.name])}
                for a in computed}  # fmt: skip
        order: list[str] = []
        state: dict[str, int] = {}  # 1: being visited, 2: done

        def visit(name: str, path: tuple[str, ...]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = " -> ".join((*path[path.index(name):], name))
                raise self.fail(f"args.{name}", f"refers to itself through {cycle}")
            state[name] = 1
            for dep in sorted(deps[name]):
                visit(dep, (*path, name))
            state[name] = 2
            order.append(name)

        for name in deps:
            visit(name, ())
        return tuple(order)

    def values(self, buffers: Mapping[str, BufferArg],
               names: set[str] | None = None) -> dict[str, ValueDomain]:  # fmt: skip
        table = self.get("values", dict, {})
        result: dict[str, ValueDomain] = {}
        for arg_name, text in table.items():
            key = f"values.{arg_name}"
            if arg_name not in buffers:
                raise self.fail(key, "names no buffer argument")
            if buffers[arg_name].intent is Intent.OUT:
                raise self.fail(key, "an 'out' buffer has no input values")
            if text == "auto":
                result[arg_name] = ValueDomain("auto")
                continue
            match = _DOMAIN.match(text) if isinstance(text, str) else None
            if match is None and isinstance(text, str) and names is not None:
                over = self.domain_over(key, text.strip(), names)
                if over is not None:
                    result[arg_name] = over
                    continue
            if match is None:
                raise self.fail(key, f"{text!r} must be normal(mu, sigma), uniform(lo, hi) or auto")
            try:
                a, b = float(match.group(2)), float(match.group(3))
            except ValueError as exc:
                if names is None or not _NAME_IN.search(match.group(2) + match.group(3)):
                    raise self.fail(key, f"{text!r} has a bound that is not a number") from exc
                # bounds over the dims, scalars or consts: evaluated for each probe
                bounds = (self.expr(key, match.group(2), names),
                          self.expr(key, match.group(3), names))  # fmt: skip
                result[arg_name] = ValueDomain(match.group(1), bounds=bounds)  # type: ignore[arg-type]
                continue
            kind = match.group(1)
            problem = _domain_problem(kind, a, b)
            if problem is not None:
                raise self.fail(key, problem)
            result[arg_name] = ValueDomain(kind, a, b)  # type: ignore[arg-type]
        return result

    def domain_over(self, key: str, text: str, names: set[str]) -> ValueDomain | None:
        """``uniform(0, cdiv(n, 2))``: bounds with calls in them, which _DOMAIN cannot split."""
        call = _DOMAIN_CALL.match(text)
        if call is None:
            return None
        parts = _split_extents(call.group(2))
        if len(parts) != 2:
            raise self.fail(key, f"{text!r} needs two bounds")
        bounds = (self.expr(key, parts[0], names), self.expr(key, parts[1], names))
        return ValueDomain(call.group(1), bounds=bounds)  # type: ignore[arg-type]

    def nonfinite(self, buffers: Mapping[str, BufferArg]) -> dict[str, tuple[str, ...]]:
        """``[kernel.nonfinite]``: ``x = ["nan", "-inf"]`` (or ``true`` for all three)."""
        table = self.get("nonfinite", dict, {})
        kinds = ("nan", "inf", "-inf")
        result: dict[str, tuple[str, ...]] = {}
        for arg_name, value in table.items():
            key = f"nonfinite.{arg_name}"
            buf = buffers.get(arg_name)
            if buf is None or buf.intent is Intent.OUT:
                raise self.fail(key, "names no input buffer")
            if buf.dtype not in FLOAT_DTYPES:
                raise self.fail(key, f"'{arg_name}' is {buf.dtype}: only floats hold NaN/Inf")
            if value is True:
                result[arg_name] = kinds
                continue
            if (not isinstance(value, list) or not value
                    or not all(isinstance(v, str) and v in kinds for v in value)):
                raise self.fail(key, 'must be true or a list of "nan", "inf", "-inf"')
            result[arg_name] = tuple(k for k in kinds if k in value)
        return result

    def artifact(self) -> ArtifactLimits:
        table = self.get("artifact", dict, {})
        keys = {"max_registers", "max_spills", "max_local_bytes", "max_shared_bytes",
                "required", "forbidden"}  # fmt: skip
        _only_keys(table, keys, self.path, self.name, "artifact.")
        limits: dict[str, Any] = {}
        for key in sorted(keys):
            if key not in table:
                continue
            value = table[key]
            if key in ("required", "forbidden"):
                if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                    raise self.fail(f"artifact.{key}", "must be a list of non-empty strings")
                limits[key] = tuple(value)
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self.fail(f"artifact.{key}", f"{value!r} must be a non-negative integer")
            else:
                limits[key] = value
        return ArtifactLimits(**limits)

    def probe_settings(self) -> ProbeSettings:
        table = self.get("probes", dict, {})
        _only_keys(table, {"max_probes", "fresh", "max_elements", "draw_up_to"}, self.path,
                   self.name, "probes.")  # fmt: skip
        ranges = {"max_probes": (1, 4096), "fresh": (0, 256), "max_elements": (1, 1 << 31)}
        values: dict[str, int] = {}
        for key, (lo, hi) in ranges.items():
            if key in table:
                v = table[key]
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise self.fail(f"probes.{key}", f"{v!r} must be an integer in [{lo}, {hi}]")
                values[key] = v
        return ProbeSettings(**values, draw_up_to=self.draw_up_to(table.get("draw_up_to", {})))

    def draw_up_to(self, caps: Any) -> dict[str, int | None]:
        """``probes.draw_up_to``: per dim, an integer cap on drawn sizes, or "listed"."""
        key = "probes.draw_up_to"
        if not isinstance(caps, dict):
            raise self.fail(key, 'must be a table of dim = cap (an integer) or dim = "listed"')
        dims = self.dims()
        result: dict[str, int | None] = {}
        for name, cap in caps.items():
            if name not in dims:
                raise self.fail(f"{key}.{name}", f"'{name}' is not a dim (dims: "
                                f"{', '.join(dims) or 'none'})")  # fmt: skip
            if cap == "listed":
                result[name] = None
            elif isinstance(cap, bool) or not isinstance(cap, int) or not (
                    max(dims[name]) <= cap <= 1 << 31):
                raise self.fail(f"{key}.{name}", f"{cap!r} must be \"listed\" or an integer from "
                                f"the largest listed value ({max(dims[name])}) to 2**31")
            else:
                result[name] = cap
        return result


_NAME_IN = re.compile(r"[A-Za-z_]")
_DOMAIN_CALL = re.compile(r"^(normal|uniform)\s*\((.*)\)$", re.S)


def _domain_problem(kind: str, a: float, b: float) -> str | None:
    if not all(abs(v) < 1e300 for v in (a, b)):
        return "bounds must be finite"
    if kind == "normal" and b < 0 or kind == "uniform" and not a < b:
        return "needs sigma >= 0" if kind == "normal" else "needs lo < hi"
    return None


def _numeric_text(text: str) -> bool:
    """An arg's text declares a number an expression may name (a scalar, an int or float const)."""
    if _BUFFER.match(text) or text == NONE_ARG:
        return False
    typed = _TYPED_CONST.match(text)
    return typed is None or typed.group(1) == "float"


def _numeric_names(args: tuple[Arg, ...] | list[Arg]) -> set[str]:
    """Names expressions may use: scalars, and int or float consts (not strings, not none)."""
    return {a.name for a in args
            if isinstance(a, ScalarArg) or isinstance(a, ConstArg) and a.kind != "str"}


def _split_extents(text: str) -> list[str]:
    """Split a shape at its top-level commas, so that ``f32[cdiv(n, 4), m]`` has two extents."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


_PLACEHOLDER_HINT = (
    f"still holds the placeholder {PLACEHOLDER} from 'kcert init': replace it with an "
    "expression over the dims (e.g. f32[m, n] for a shape, cdiv(n, 256) for a grid)"
)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {
        str: "a string", int: "an integer", list: "a list", dict: "a table", bool: "true/false",
    }  # fmt: skip
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)
