"""The kcert.toml parser: the args mini-language (property tests) and its error messages.

Every broken spec must raise SpecError whose message names the file, the
kernel and the key; nothing else may escape the parser.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcert.certify.errors import SpecError
from kcert.certify.spec import (
    DTYPES,
    PLACEHOLDER,
    BufferArg,
    ConstArg,
    Intent,
    ScalarArg,
    find_spec,
    load_spec,
    parse_spec,
    resolve_kernel,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec")
    (root / "k.cu").write_text('extern "C" __global__ void k(float* y, int n) {}\n')
    (root / "k.py").write_text("")
    (root / "ref.py").write_text("def k(**kw):\n    return kw['y']\n")
    return root


def base_table() -> dict[str, Any]:
    return {
        "name": "k",
        "source": "k.cu",
        "entry": "k",
        "reference": "ref.py:k",
        "grid": ["cdiv(n, 256)"],
        "block": [256],
        "dims": {"n": [1, 33, 1000]},
        "args": {"x": "in f32[n]", "y": "out f32[n]", "a": "f32 = 2.5", "n": "i32 = n"},
    }


def parse(folder: Path, table: dict[str, Any]) -> Any:
    return parse_spec({"kernel": [table]}, folder / "kcert.toml").kernels[0]


def test_base_table_parses(folder: Path) -> None:
    kernel = parse(folder, base_table())
    assert [a.name for a in kernel.args] == ["x", "y", "a", "n"]
    launch = kernel.bind({"n": 1000})
    assert launch.grid == (4,)
    assert launch.shapes == {"x": (1000,), "y": (1000,)}
    assert launch.scalars == {"a": 2.5, "n": 1000}


# ------------------------------------------------------------- args: property tests

_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
_dtypes = st.sampled_from(DTYPES)
_extent_exprs = st.sampled_from(["n", "m", "n * m", "cdiv(n, 4)", "m + 1", "max(n, m)", "3"])


@st.composite
def buffer_texts(draw: st.DrawFn) -> tuple[str, str, str, list[str]]:
    intent = draw(st.sampled_from(["in", "out", "inout"]))
    dtype = draw(_dtypes)
    shape = draw(st.lists(_extent_exprs, min_size=1, max_size=4))
    pad = draw(st.sampled_from(["", " ", "  "]))
    text = f"{intent} {dtype}{pad}[{(',' + pad).join(shape)}]"
    return text, intent, dtype, shape


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buffer_texts())
def test_buffer_args_round_trip(folder: Path, case: tuple[str, str, str, list[str]]) -> None:
    text, intent, dtype, shape = case
    table = base_table()
    table["dims"] = {"n": [5], "m": [3]}
    table["grid"] = ["1"]
    table["args"] = {"buf": text, "y": "out f32[n]"}
    kernel = parse(folder, table)
    buf = kernel.args[0]
    assert isinstance(buf, BufferArg)
    assert (buf.intent, buf.dtype) == (Intent(intent), dtype)
    assert [e.text for e in buf.shape] == [s.strip() for s in shape]
    expected = tuple(eval(s, {"cdiv": lambda a, b: -(-a // b), "max": max}, {"n": 5, "m": 3})
                     for s in shape)  # fmt: skip
    assert kernel.bind({"n": 5, "m": 3}).shapes["buf"] == expected
    # What the spec digest sees is stable under re-parsing its own text.
    table["args"]["buf"] = buf.spec_text()
    assert parse(folder, table).digest == kernel.digest


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_dtypes, st.integers(min_value=0, max_value=10**6), _names)
def test_scalar_and_const_args(folder: Path, dtype: str, value: int, name: str) -> None:
    table = base_table()
    table["source"] = "k.py"
    table.pop("block")
    table["args"] = {"y": "out f32[n]", "s": f"{dtype} = {value} + n", "c": "const = s * 2"}
    if name in ("y", "s", "c", "n"):
        return
    table["args"][name] = "i32 = 1"
    kernel = parse(folder, table)
    s, c = kernel.args[1], kernel.args[2]
    assert isinstance(s, ScalarArg) and s.dtype == dtype
    assert isinstance(c, ConstArg)
    if dtype in ("f16", "bf16", "f32", "f64"):
        # A const is an integer: one computed from a float scalar is refused at bind time.
        with pytest.raises(SpecError, match="must give an integer"):
            kernel.bind({"n": 33})
        return
    launch = kernel.bind({"n": 33})
    assert launch.scalars["s"] == value + 33
    assert launch.consts["c"] == (value + 33) * 2


_ARG_ALPHABET = "inoutf32i6468[],= +-*()abcnmk_.'\"\\ "


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(alphabet=_ARG_ALPHABET, max_size=40), st.text(max_size=30)))
def test_args_fuzz_only_spec_errors(folder: Path, text: str) -> None:
    table = base_table()
    table["args"] = {"x": text, "y": "out f32[n]", "n": "i32 = n"}
    try:
        kernel = parse(folder, table)
    except SpecError as exc:
        assert "key 'args" in exc.diagnostics()
        return
    try:
        kernel.bind({"n": 33})
    except SpecError as exc:
        assert exc.kernel == "k"


# ------------------------------------------------------------------ error messages


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(table: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = table
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    return apply


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda table: table.pop(key)


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("missing source", _drop("source"), "source"),
    ("missing entry", _drop("entry"), "entry"),
    ("missing reference", _drop("reference"), "reference"),
    ("missing grid", _drop("grid"), "grid"),
    ("missing block", _drop("block"), "block"),
    ("missing dims", _drop("dims"), "dims"),
    ("missing args", _drop("args"), "args"),
    ("unknown key", _set("colour", "red"), "colour"),
    ("bad name", _set("name", "a b"), "name"),
    ("source suffix", _set("source", "k.c"), "source"),
    ("source missing", _set("source", "nope.cu"), "source"),
    ("entry not ident", _set("entry", "k()"), "entry"),
    ("reference shape", _set("reference", "ref.py"), "reference"),
    ("reference file", _set("reference", "nope.py:k"), "reference"),
    ("baseline shape", _set("baseline", "ref:k"), "baseline"),
    ("grid not list", _set("grid", "n"), "grid"),
    ("grid too many", _set("grid", ["1", "1", "1", "1"]), "grid"),
    ("grid unknown name", _set("grid", ["cdiv(q, 2)"]), "grid[0]"),
    ("grid bad expr", _set("grid", ["n +"]), "grid[0]"),
    ("grid python", _set("grid", ["__import__('os')"]), "grid[0]"),
    ("block huge", _set("block", ["9" * 30]), "block[0]"),
    ("dims empty", _set("dims", {}), "dims"),
    ("dims not list", _set("dims", {"n": 5}), "dims.n"),
    ("dims zero", _set("dims", {"n": [0]}), "dims.n"),
    ("dims negative", _set("dims", {"n": [-1]}), "dims.n"),
    ("dims float", _set("dims", {"n": [1.5]}), "dims.n"),
    ("dims bool", _set("dims", {"n": [True]}), "dims.n"),
    ("dims too many", _set("dims", {"n": list(range(1, 100))}), "dims.n"),
    ("dims placeholder", _set("dims", {"n": PLACEHOLDER}), "dims.n"),
    ("arg not string", _set("args.x", 3), "args.x"),
    ("arg bad intent", _set("args.x", "input f32[n]"), "args.x"),
    ("arg bad dtype", _set("args.x", "in f33[n]"), "args.x"),
    ("arg no shape", _set("args.x", "in f32[]"), "args.x"),
    ("arg shape unknown", _set("args.x", "in f32[q]"), "args.x"),
    ("arg shape placeholder", _set("args.x", f"in f32[{PLACEHOLDER}]"), "args.x"),
    ("arg shape python", _set("args.x", "in f32[n.real]"), "args.x"),
    ("scalar unknown", _set("args.a", "f32 = q"), "args.a"),
    ("scalar bad dtype", _set("args.a", "float = 1"), "args.a"),
    ("scalar garbage", _set("args.a", "f32 == 1"), "args.a"),
    ("no outputs", _set("args.y", "in f32[n]"), "args"),
    ("tolerance dtype", _set("tolerance", {"f128": {"atol": 1}}), "tolerance.f128"),
    ("tolerance negative", _set("tolerance", {"f32": {"atol": -1}}), "tolerance.f32.atol"),
    ("tolerance key", _set("tolerance", {"f32": {"abs": 1}}), "tolerance.f32.abs"),
    ("values unknown arg", _set("values", {"q": "auto"}), "values.q"),
    ("values out buffer", _set("values", {"y": "auto"}), "values.y"),
    ("values bad domain", _set("values", {"x": "gauss(0, 1)"}), "values.x"),
    ("values bad bounds", _set("values", {"x": "uniform(2, 1)"}), "values.x"),
    ("artifact key", _set("artifact", {"max_regs": 3}), "artifact.max_regs"),
    ("artifact negative", _set("artifact", {"max_registers": -1}), "artifact.max_registers"),
    ("artifact required", _set("artifact", {"required": "fma"}), "artifact.required"),
    ("probes range", _set("probes", {"max_probes": 0}), "probes.max_probes"),
    ("build options", _set("build", {"options": "-O3"}), "build.options"),
    ("build key", _set("build", {"flags": []}), "build.flags"),
    ("num_warps cuda", _set("num_warps", 4), "num_warps"),
    ("shared_mem expr", _set("shared_mem", "q * 4"), "shared_mem"),
]


@pytest.mark.parametrize(("case", "mutate", "key"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_names_file_kernel_and_key(
    folder: Path, case: str, mutate: Callable[[dict[str, Any]], None], key: str
) -> None:
    table = copy.deepcopy(base_table())
    mutate(table)
    with pytest.raises(SpecError) as info:
        parse(folder, table)
    message = info.value.diagnostics()
    assert str(folder / "kcert.toml") in message
    assert f"kernel '{table['name']}'" in message
    assert f"key '{key}'" in message, message


def test_placeholder_messages_say_to_fill_in(folder: Path) -> None:
    table = base_table()
    table["dims"] = {"n": PLACEHOLDER}
    with pytest.raises(SpecError, match="fill in the sizes"):
        parse(folder, table)
    table = base_table()
    table["grid"] = [PLACEHOLDER]
    with pytest.raises(SpecError, match=f"placeholder {PLACEHOLDER}"):
        parse(folder, table)


def test_duplicate_kernel_names(folder: Path) -> None:
    with pytest.raises(SpecError, match="appears twice") as info:
        parse_spec({"kernel": [base_table(), base_table()]}, folder / "kcert.toml")
    assert "key 'name'" in info.value.diagnostics()


@pytest.mark.parametrize(
    ("data", "key"),
    [({}, "kernel"), ({"kernel": []}, "kernel"), ({"kernel": {}}, "kernel"),
     ({"version": 2, "kernel": []}, "version"), ({"extra": 1}, "extra"),
     ({"kernel": [1]}, "kernel[0]")],
)  # fmt: skip
def test_file_level_errors(folder: Path, data: dict[str, Any], key: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data, folder / "kcert.toml")
    assert f"key '{key}'" in info.value.diagnostics()


def test_unnamed_kernel_is_located_by_position(folder: Path) -> None:
    table = base_table()
    table.pop("name")
    with pytest.raises(SpecError) as info:
        parse(folder, table)
    assert "kernel '#1'" in info.value.diagnostics()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"[[kernel]\nname = 1", "not valid TOML"), (b"\xff\xfe", "not UTF-8")],
)
def test_unreadable_files(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "kcert.toml"
    path.write_bytes(content)
    with pytest.raises(SpecError, match=fragment) as info:
        load_spec(path)
    assert str(path) in info.value.diagnostics()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "kcert.toml")
    with pytest.raises(SpecError, match="does not exist"):
        resolve_kernel(tmp_path / "nope.cu")


def test_find_spec_walks_up(tmp_path: Path) -> None:
    (tmp_path / "kcert.toml").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_spec(deep / "k.cu") == tmp_path / "kcert.toml"


def test_find_spec_suggests_init(tmp_path: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    if any((p / "kcert.toml").exists() for p in lone.parents):
        pytest.skip("a kcert.toml above the temporary folder")
    with pytest.raises(SpecError, match="kcert init"):
        find_spec(lone / "k.cu")


def test_examples_parse_and_pick_by_source() -> None:
    for language in ("cuda", "triton"):
        spec = load_spec(EXAMPLES / language / "kcert.toml")
        assert {k.name for k in spec.kernels} == {
            "saxpy", "row_sum", "softmax", "matmul", "layernorm", "row_max",
        }  # fmt: skip
        for kernel in spec.kernels:
            assert kernel.language == language
            assert resolve_kernel(kernel.source).name == kernel.name
            for combo in _all_dims(kernel.dims):
                kernel.bind(combo)


def _all_dims(dims: Any) -> list[dict[str, int]]:
    import itertools

    names = list(dims)
    return [dict(zip(names, c, strict=True)) for c in itertools.product(*dims.values())]


def test_spec_digest_ignores_formatting(tmp_path: Path) -> None:
    source = (EXAMPLES / "cuda" / "kcert.toml").read_text()
    data = tomllib.loads(source)
    for name in ("saxpy.cu", "row_sum.cu", "reference.py"):
        (tmp_path / name).write_bytes((EXAMPLES / "cuda" / name).read_bytes())
    data["kernel"] = data["kernel"][:2]
    a = parse_spec(data, tmp_path / "kcert.toml")
    reordered = {"kernel": [dict(reversed(list(t.items()))) for t in data["kernel"]]}
    b = parse_spec(reordered, tmp_path / "kcert.toml")
    assert [k.digest for k in a.kernels] == [k.digest for k in b.kernels]


def test_shape_commas_inside_calls_do_not_split_extents(folder: Path) -> None:
    table = base_table()
    table["args"]["x"] = "in f32[cdiv(n, 4), max(n, 2)]"
    kernel = parse(folder, table)
    assert kernel.bind({"n": 33}).shapes["x"] == (9, 33)


# ------------------------------------------------------------------ constexprs, domains, order


def _args(**extra: str) -> Callable[[dict[str, Any]], None]:
    def apply(table: dict[str, Any]) -> None:
        table["args"].update(extra)

    return apply


FEATURE_ERRORS: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("float const unknown name", _args(a="const float = q"), "args.a", "unknown name"),
    ("string const unquoted", _args(a="const str = gelu"), "args.a", "quoted string"),
    ("string const odd characters", _args(a='const str = "a b"'), "args.a", "quoted string"),
    ("const of unknown kind", _args(a="const bool = 1"), "args.a", "const float"),
    ("scalar cycle", _args(a="f32 = b * 2", b="i32 = a"), "args.a", "a -> b -> a"),
    ("scalar names itself", _args(a="f32 = a + 1"), "args.a", "a -> a"),
    ("string const in an expression", _args(a="f32 = s", s='const str = "relu"'), "args.a",
     "unknown name"),
    ("none in an expression", _args(a="f32 = b", b="none"), "args.a", "unknown name"),
    ("domain over an unknown name", _set("values", {"x": "uniform(0, q)"}), "values.x",
     "unknown name"),
    ("domain over a buffer", _set("values", {"x": "uniform(0, y)"}), "values.x", "unknown name"),
    ("domain not an expression", _set("values", {"x": "uniform(0, n +)"}), "values.x",
     "ends where"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mutate", "key", "fragment"), FEATURE_ERRORS,
                         ids=[f[0] for f in FEATURE_ERRORS])  # fmt: skip
def test_feature_errors_name_the_key(
    folder: Path, case: str, mutate: Callable[[dict[str, Any]], None], key: str, fragment: str
) -> None:
    table = copy.deepcopy(base_table())
    mutate(table)
    with pytest.raises(SpecError) as info:
        parse(folder, table)
    message = info.value.diagnostics()
    assert f"key '{key}'" in message, message
    assert fragment in message, message


def test_float_and_string_consts_and_forward_references(folder: Path) -> None:
    table = base_table()
    table["source"] = "k.py"
    table.pop("block")
    table["grid"] = ["blocks"]
    table["args"] = {
        "y": "out f32[n]", "blocks": "i32 = cdiv(n, BLOCK)", "scale": "f32 = EPS * 2",
        "unused": "none", "EPS": "const float = 1e-5", "ACT": "const str = 'gelu_tanh'",
        "BLOCK": "const = 64",
    }  # fmt: skip
    kernel = parse(folder, table)
    launch = kernel.bind({"n": 1000})
    assert launch.scalars == {"blocks": 16, "scale": 2e-5}
    assert launch.consts == {"EPS": 1e-5, "ACT": "gelu_tanh", "BLOCK": 64}
    assert launch.grid == (16,)
    texts = {a.name: a.spec_text() for a in kernel.args}
    assert texts["EPS"] == "const float = 1e-5" and texts["ACT"] == 'const str = "gelu_tanh"'
    assert texts["unused"] == "none" and texts["BLOCK"] == "const = 64"
    # the spec digest is stable under re-parsing the normalized text
    table["args"] = texts
    assert parse(folder, table).digest == kernel.digest


def test_a_plain_const_still_refuses_a_float_and_says_how_to_write_one(folder: Path) -> None:
    table = base_table()
    table["args"]["c"] = "const = 0.5"
    with pytest.raises(SpecError, match="const float") as info:
        parse(folder, table).bind({"n": 33})
    assert "key 'args.c'" in info.value.diagnostics()  # the const that failed


def test_a_domain_over_the_dims_is_evaluated_per_probe(folder: Path) -> None:
    table = base_table()
    table["args"]["t"] = "in i32[n]"
    table["values"] = {"t": "uniform(-1, n)", "x": "normal(0, 1)"}
    kernel = parse(folder, table)
    assert kernel.values["t"].spec_text() == "uniform(-1, n)"
    assert kernel.values["x"].spec_text() == "normal(0.0, 1.0)"  # constant domains as before
    domain = kernel.bind({"n": 33}).domains["t"]
    assert (domain.kind, domain.a, domain.b, domain.bounds) == ("uniform", -1.0, 33.0, None)
    assert "x" not in kernel.bind({"n": 33}).domains
    table["values"] = {"t": "uniform(0, cdiv(n, 2) + max(n, 3))"}
    assert parse(folder, table).bind({"n": 33}).domains["t"].b == 50.0
    table["values"] = {"t": "uniform(0, cdiv(n, 2), 1)"}
    with pytest.raises(SpecError, match="needs two bounds"):
        parse(folder, table)


def test_a_domain_over_the_dims_that_is_empty_at_some_dims_says_where(folder: Path) -> None:
    table = base_table()
    table["values"] = {"x": "uniform(n - 2, 32)"}
    kernel = parse(folder, table)
    kernel.bind({"n": 1})
    with pytest.raises(SpecError, match=r"with dims \{'n': 1000\}.*needs lo < hi") as info:
        kernel.bind({"n": 1000})
    assert "key 'values.x'" in info.value.diagnostics()


def test_a_scalar_named_like_a_dim_still_means_the_dim(folder: Path) -> None:
    kernel = parse(folder, base_table())  # n = "i32 = n"
    assert kernel.bind({"n": 33}).scalars["n"] == 33
