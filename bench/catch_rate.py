"""Catch rate: kcert against a one-shape ``allclose`` oracle on ported kernels and their mutants.

    python bench/catch_rate.py [--only softmax,matmul] [--originals-only] [--no-oracle]
                               [--executor auto|triton-interpreter|triton] [--json PATH]

The corpus is ``bench/corpus/<kernel>/``: a kernel ported from public Triton
code (its header names the repository, path, commit and licence), its
``kcert.toml`` and NumPy ``reference.py``, and ``mutants.toml``, a list of
single-change mutants. Each mutant is one (search, replace) edit of the
kernel source (or of the spec, ``file = "kcert.toml"``, for launch-grid
bugs); the search text must occur exactly once, so every mutant is provably
one change. The bench copies the kernel's folder into a temporary folder per
variant, applies the edit there, and runs in the same process, per variant:

- **kcert**: :func:`kcert.certify.pipeline.certify` as ``kcert certify`` does
  (sandboxed, fresh seed drawn), without minimization or timing: a mutant is
  caught when the verdict is ``fail`` (or the spec is refused); an original
  that fails is a false alarm. The failing checks are printed.
- **oracle**, KernelBench style: one shape (the largest value of each dim),
  five seeds of ``randn`` for the float inputs (integer inputs are drawn from
  the spec's domain, so that labels stay valid), the kernel run in a child
  process through the Triton interpreter (or on the GPU), and
  ``allclose(out, ref, atol=tol, rtol=tol)`` against the reference rounded to
  the output's dtype, for tol = 1e-2 and 1e-4. A crash counts as caught.

Wall times are per variant and include each side's start-up (kcert's build,
lint and sandboxed worker; the oracle's child process importing torch).
Goals (issue 13): no false alarm on the originals, at least 95% of mutants
caught, kcert within 2x the oracle's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "bench" / "corpus"
ORACLE_SEEDS = 5
ORACLE_TOLERANCES = (1e-2, 1e-4)
ORACLE_DEADLINE_S = 300.0
SPEC = "kcert.toml"
MUTANTS = "mutants.toml"


# ---------------------------------------------------------------------------- the corpus


class CorpusError(Exception):
    """A corpus folder or mutant that cannot be used as written."""


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: str
    description: str
    file: str
    search: str
    replace: str


@dataclass(frozen=True)
class CorpusKernel:
    name: str
    folder: Path
    source: str  # the kernel module's file name, from the spec
    mutants: tuple[Mutant, ...]


def load_corpus(root: Path = CORPUS, only: set[str] | None = None) -> list[CorpusKernel]:
    kernels = []
    for folder in sorted(p for p in root.iterdir() if (p / SPEC).is_file()):
        if only and folder.name not in only:
            continue
        kernels.append(load_kernel(folder))
    return kernels


def load_kernel(folder: Path) -> CorpusKernel:
    spec = tomllib.loads((folder / SPEC).read_text())
    tables = spec.get("kernel", [])
    if len(tables) != 1:
        raise CorpusError(f"{folder / SPEC}: one [[kernel]] per corpus folder, found {len(tables)}")
    source = tables[0]["source"]
    raw = tomllib.loads((folder / MUTANTS).read_text()).get("mutant", [])
    mutants = []
    for entry in raw:
        mutant = Mutant(entry["name"], entry["class"], entry["description"],
                        entry.get("file", source), entry["search"], entry["replace"])  # fmt: skip
        target = folder / mutant.file
        count = target.read_text().count(mutant.search) if target.is_file() else 0
        if count != 1:
            raise CorpusError(f"{folder.name}/{MUTANTS}: mutant '{mutant.name}': the search text "
                              f"occurs {count} times in {mutant.file}, not once")  # fmt: skip
        mutants.append(mutant)
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        raise CorpusError(f"{folder.name}/{MUTANTS}: mutant names repeat")
    return CorpusKernel(folder.name, folder, source, tuple(mutants))


@contextmanager
def materialized(kernel: CorpusKernel, mutant: Mutant | None) -> Iterator[Path]:
    """The kernel's folder copied to a temporary folder, with ``mutant`` applied; its spec path."""
    with tempfile.TemporaryDirectory(prefix=f"kcert-corpus-{kernel.name}-") as tmp:
        folder = Path(tmp) / kernel.name
        shutil.copytree(kernel.folder, folder, ignore=shutil.ignore_patterns(
            MUTANTS, "__pycache__"))  # fmt: skip
        if mutant is not None:
            target = folder / mutant.file
            target.write_text(target.read_text().replace(mutant.search, mutant.replace, 1))
        yield folder / SPEC


# ---------------------------------------------------------------------------- kcert's side


@dataclass
class KcertOutcome:
    verdict: str  # "pass", "fail" or "refused" (the spec or the reference could not be used)
    failed: list[str] = field(default_factory=list)  # failing required checks
    message: str = ""  # the first failing check's message, or why it was refused
    wall_s: float = 0.0

    @property
    def caught(self) -> bool:
        return self.verdict != "pass"


def run_kcert(spec_path: Path, executor: str, *, max_probes: int | None = None,
              fresh_seed: int | None = None, pool: Any = None) -> KcertOutcome:  # fmt: skip
    """Certify the spec's kernel; tests fix ``fresh_seed`` and cap ``max_probes``.

    ``pool`` (a :class:`~kcert.certify.spares.WorkerPool`) is shared by a whole run,
    so that each kernel finds a warm sandbox worker.
    """
    from kcert.certify.pipeline import CertifyOptions, certify
    from kcert.certify.report import Status
    from kcert.certify.spec import load_spec
    from kcert.errors import KcertError

    start = time.perf_counter()
    try:
        kernel = load_spec(spec_path).kernels[0]
        options = CertifyOptions(executor=executor, max_probes=max_probes, fresh_seed=fresh_seed,
                                 minimize=False, timing=False)  # fmt: skip
        report = certify(kernel, options, pool=pool)
    except KcertError as exc:
        return KcertOutcome("refused", ["spec"], exc.diagnostics(), time.perf_counter() - start)
    wall = time.perf_counter() - start
    failing = [c for c in report.checks if c.status is Status.FAIL and c.required]
    message = f"{failing[0].name}: {failing[0].message}" if failing else ""
    return KcertOutcome(str(report.verdict), [c.name for c in failing], message, wall)


# ---------------------------------------------------------------------------- the oracle


@dataclass
class OracleOutcome:
    mismatched: dict[str, bool]  # per tolerance ("1e-02"): some seed was not allclose
    message: str = ""
    wall_s: float = 0.0

    @property
    def ran(self) -> bool:
        """False when the kernel could not be launched at all (its spec is refused)."""
        return not self.message.startswith("not run")

    def caught(self, tol: float) -> bool:
        return self.ran and self.mismatched[_tol_key(tol)]


def _tol_key(tol: float) -> str:
    return f"{tol:.0e}"


def run_oracle(spec_path: Path, executor: str) -> OracleOutcome:
    """One shape, five seeds of randn, allclose at each tolerance; the kernel runs in a child."""
    from kcert.certify.executors.base import host_dtype
    from kcert.certify.reference import Reference
    from kcert.certify.spec import BufferArg, ConstArg, Intent, load_spec
    from kcert.errors import KcertError

    start = time.perf_counter()
    keys = [_tol_key(t) for t in ORACLE_TOLERANCES]
    try:
        kernel = load_spec(spec_path).kernels[0]
        dims = {name: max(values) for name, values in kernel.dims.items()}
        launch = kernel.bind(dims)
        reference = Reference(kernel)
    except KcertError as exc:
        return OracleOutcome(dict.fromkeys(keys, False), f"not run: {exc.diagnostics()}",
                             time.perf_counter() - start)  # fmt: skip
    seeds: list[dict[str, np.ndarray[Any, Any]]] = []
    for seed in range(ORACLE_SEEDS):
        rng = np.random.default_rng(seed)
        inputs: dict[str, np.ndarray[Any, Any]] = {}
        for buf in kernel.buffers:
            if buf.intent is Intent.OUT:
                continue
            shape = launch.shapes[buf.name]
            if buf.dtype in ("f16", "bf16", "f32", "f64"):
                inputs[buf.name] = rng.standard_normal(shape).astype(host_dtype(buf.dtype))
            else:
                domain = launch.domains.get(buf.name, kernel.values.get(buf.name))
                lo, hi = (int(np.ceil(domain.a)), int(np.ceil(domain.b))) if (
                    domain is not None and domain.kind == "uniform") else (0, 64)
                inputs[buf.name] = rng.integers(lo, hi, shape).astype(host_dtype(buf.dtype))
        seeds.append(inputs)
    args: list[dict[str, Any]] = []
    for arg in kernel.args:
        if isinstance(arg, BufferArg):
            args.append({"name": arg.name, "kind": "buffer", "dtype": arg.dtype,
                         "shape": list(launch.shapes[arg.name]),
                         "intent": str(arg.intent)})  # fmt: skip
        elif isinstance(arg, ConstArg):
            args.append({"name": arg.name, "kind": "const", "value": launch.consts[arg.name]})
        else:
            args.append({"name": arg.name, "kind": "scalar", "value": launch.scalars[arg.name]})
    with tempfile.TemporaryDirectory(prefix="kcert-oracle-") as tmp:
        job = Path(tmp)
        for i, inputs in enumerate(seeds):
            stored: dict[str, Any] = {k: _storable(v) for k, v in inputs.items()}
            np.savez(job / f"in{i}.npz", **stored)
        (job / "job.json").write_text(json.dumps({
            "source": str(kernel.source), "entry": kernel.entry, "args": args,
            "grid": list(launch.grid), "seeds": len(seeds), "num_warps": kernel.num_warps,
        }))  # fmt: skip
        env = dict(os.environ)
        if executor == "triton-interpreter":
            env["TRITON_INTERPRET"] = "1"
        try:
            child = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--oracle-child", str(job)],
                env=env, capture_output=True, text=True, timeout=ORACLE_DEADLINE_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return OracleOutcome(dict.fromkeys(keys, True), "the kernel timed out",
                                 time.perf_counter() - start)  # fmt: skip
        if child.returncode != 0:
            tail = (child.stderr.strip().splitlines() or ["(no output)"])[-1]
            return OracleOutcome(dict.fromkeys(keys, True), f"the kernel crashed: {tail[:200]}",
                                 time.perf_counter() - start)  # fmt: skip
        mismatched = dict.fromkeys(keys, False)
        notes: list[str] = []
        for i, inputs in enumerate(seeds):
            expected = reference(inputs, launch, probe=f"oracle-{i}")
            with np.load(job / f"out{i}.npz") as got:
                for out in kernel.outputs:
                    want = np.asarray(expected[out.name]).astype(host_dtype(out.dtype))
                    have = got[out.name].astype(np.float64)
                    for tol, key in zip(ORACLE_TOLERANCES, keys, strict=True):
                        if not np.allclose(have, want.astype(np.float64), atol=tol, rtol=tol):
                            if not mismatched[key]:
                                notes.append(f"{out.name} differs at tol {key} (seed {i})")
                            mismatched[key] = True
    return OracleOutcome(mismatched, "; ".join(notes), time.perf_counter() - start)


def _storable(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """bf16 travels as its raw 16 bits (npz cannot name ml_dtypes' type)."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def oracle_child(job_dir: Path) -> int:
    """In the child: import the kernel module, launch it per seed, save the outputs (float64)."""
    import importlib.util

    import torch

    job = json.loads((job_dir / "job.json").read_text())
    spec = importlib.util.spec_from_file_location("corpus_kernel", job["source"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, job["entry"])
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
              "f64": torch.float64, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
              "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}  # fmt: skip
    for i in range(job["seeds"]):
        with np.load(job_dir / f"in{i}.npz") as saved:
            inputs = {k: saved[k] for k in saved.files}
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        outputs: dict[str, Any] = {}
        for arg in job["args"]:
            if arg["kind"] == "buffer":
                dtype = dtypes[arg["dtype"]]
                if arg["intent"] == "out":
                    tensor = torch.empty(arg["shape"], dtype=dtype, device=device)
                elif arg["dtype"] == "bf16":
                    raw = torch.from_numpy(inputs[arg["name"]].view(np.int16))
                    tensor = raw.view(torch.bfloat16).to(device)
                else:
                    tensor = torch.from_numpy(inputs[arg["name"]]).to(device)
                if arg["intent"] != "in":
                    outputs[arg["name"]] = tensor
                positional.append(tensor)
            else:  # scalars and constexprs alike, in the kernel's own order
                positional.append(arg["value"])
        if job["num_warps"] is not None:
            keywords["num_warps"] = job["num_warps"]
        fn[tuple(job["grid"])](*positional, **keywords)
        if device == "cuda":
            torch.cuda.synchronize()
        np.savez(job_dir / f"out{i}.npz",
                 **{k: v.detach().to("cpu", torch.float64).numpy() for k, v in outputs.items()})
    return 0


# ---------------------------------------------------------------------------- one variant


@dataclass
class VariantResult:
    kernel: str
    variant: str  # "original" or the mutant's name
    bug_class: str
    description: str
    kcert: KcertOutcome
    oracle: OracleOutcome | None


def evaluate(kernel: CorpusKernel, mutant: Mutant | None, executor: str,
             oracle: bool = True, pool: Any = None) -> VariantResult:  # fmt: skip
    with materialized(kernel, mutant) as spec_path:
        chosen = executor
        if executor == "auto":
            from kcert.certify.sandbox import default_executor
            from kcert.certify.spec import load_spec
            from kcert.errors import KcertError

            try:
                chosen = default_executor(load_spec(spec_path).kernels[0])
            except KcertError:
                chosen = "triton-interpreter"
        outcome = run_kcert(spec_path, chosen, pool=pool)
        checked = run_oracle(spec_path, chosen) if oracle else None
    if mutant is None:
        return VariantResult(kernel.name, "original", "", "", outcome, checked)
    return VariantResult(kernel.name, mutant.name, mutant.bug_class, mutant.description,
                         outcome, checked)  # fmt: skip


# ---------------------------------------------------------------------------- the table


def _mark(caught: bool, original: bool) -> str:
    if original:
        return "FALSE ALARM" if caught else "pass"
    return "caught" if caught else "MISSED"


def print_details(results: list[VariantResult]) -> None:
    keys = [_tol_key(t) for t in ORACLE_TOLERANCES]
    for r in results:
        original = r.variant == "original"
        line = f"  {r.kernel}/{r.variant}: kcert {_mark(r.kcert.caught, original)}"
        if r.kcert.failed:
            line += f" [{', '.join(r.kcert.failed)}]"
        line += f" ({r.kcert.wall_s:.1f} s)"
        if r.oracle is not None and r.oracle.ran:
            marks = ", ".join(f"{k} {_mark(r.oracle.mismatched[k], original)}" for k in keys)
            line += f"; oracle {marks} ({r.oracle.wall_s:.1f} s)"
        elif r.oracle is not None:
            line += "; oracle not run"
        print(line)
        if not original and r.description:
            print(f"      {r.bug_class}: {r.description}")
        if r.kcert.message and (original or r.kcert.caught):
            print(f"      kcert: {r.kcert.message[:300]}")
        if r.oracle is not None and r.oracle.message and original:
            print(f"      oracle: {r.oracle.message[:300]}")


def _measured(rows: list[VariantResult]) -> list[VariantResult]:
    """Mutants whose verdict says something about the bug: not refused like their original."""
    orig = next((r for r in rows if r.variant == "original"), None)
    refused = orig is not None and orig.kcert.verdict == "refused"
    return [r for r in rows if r.variant != "original"
            and not (refused and r.kcert.verdict == "refused")]  # fmt: skip


def print_table(results: list[VariantResult]) -> None:
    """One row per kernel; then the totals against the goals."""
    keys = [_tol_key(t) for t in ORACLE_TOLERANCES]
    by_kernel: dict[str, list[VariantResult]] = {}
    for r in results:
        by_kernel.setdefault(r.kernel, []).append(r)
    with_oracle = any(r.oracle is not None for r in results)
    head = ["kernel", "original: kcert", "mutants", "kcert caught"]
    if with_oracle:
        head += [f"oracle {k}: original / caught" for k in keys]
    head += ["kcert s"] + (["oracle s"] if with_oracle else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    fa = orig_n = mut_n = caught_n = clean_n = clean_caught = 0
    unmeasured = 0
    kt_all = kt_both = ot_all = 0.0
    o_fa = dict.fromkeys(keys, 0)
    o_caught = dict.fromkeys(keys, 0)
    o_n = o_orig = 0
    for name, rows in by_kernel.items():
        orig = next((r for r in rows if r.variant == "original"), None)
        muts = [r for r in rows if r.variant != "original"]
        measured = _measured(rows)
        status = "-"
        if orig is not None:
            status = "pass" if not orig.kcert.caught else (
                f"**{orig.kcert.verdict}** ({', '.join(orig.kcert.failed)})")  # fmt: skip
        caught = sum(r.kcert.caught for r in measured)
        cells = [name, status, str(len(muts)),
                 f"{caught} of {len(measured)}" if measured else "not measured"]  # fmt: skip
        ran = [r for r in muts if r.oracle is not None and r.oracle.ran]
        if with_oracle:
            orig_ran = orig is not None and orig.oracle is not None and orig.oracle.ran
            for k in keys:
                if not orig_ran and not ran:
                    cells.append("not run")
                    continue
                first = "-"
                if orig is not None and orig.oracle is not None and orig_ran:
                    first = "**false alarm**" if orig.oracle.mismatched[k] else "pass"
                    o_fa[k] += orig.oracle.mismatched[k]
                got = sum(r.oracle.mismatched[k] for r in ran if r.oracle is not None)
                o_caught[k] += got
                cells.append(f"{first} / {got} of {len(ran)}")
            o_n += len(ran)
            o_orig += orig_ran
        kt = sum(r.kcert.wall_s for r in rows)
        ot = sum(r.oracle.wall_s for r in rows if r.oracle is not None and r.oracle.ran)
        cells.append(f"{kt:.0f}")
        if with_oracle:
            cells.append(f"{ot:.0f}" if ot else "-")
        print("| " + " | ".join(cells) + " |")
        orig_n += orig is not None
        fa += bool(orig is not None and orig.kcert.caught)
        mut_n += len(measured)
        unmeasured += len(muts) - len(measured)
        caught_n += caught
        if orig is not None and not orig.kcert.caught:
            clean_n += len(measured)
            clean_caught += caught
        kt_all += kt
        kt_both += sum(r.kcert.wall_s for r in rows if r.oracle is not None and r.oracle.ran)
        ot_all += ot
    print()
    share = f" ({caught_n / mut_n:.0%})" if mut_n else ""
    print(f"kcert: {fa} false alarm(s) on {orig_n} originals; {caught_n} of {mut_n} mutants "
          f"caught{share}" + (f"; {unmeasured} not measured (their spec is refused, as the "
                              f"original's)" if unmeasured else ""))  # fmt: skip
    if clean_n:
        print(f"kcert on the kernels whose original passes: {clean_caught} of {clean_n} mutants "
              f"caught ({clean_caught / clean_n:.0%})")  # fmt: skip
    if with_oracle:
        for k in keys:
            share = f" ({o_caught[k] / o_n:.0%})" if o_n else ""
            print(f"oracle at atol = rtol = {k}: {o_fa[k]} false alarm(s) on {o_orig} "
                  f"originals; {o_caught[k]} of {o_n} mutants caught{share}")  # fmt: skip
        if ot_all:
            print(f"wall time over the variants both ran: kcert {kt_both:.0f} s, oracle "
                  f"{ot_all:.0f} s, ratio {kt_both / ot_all:.1f}x (kcert over all: "
                  f"{kt_all:.0f} s)")  # fmt: skip


def load_results(path: Path) -> list[VariantResult]:
    """Results saved by ``--json``, to print their table again."""
    results = []
    for row in json.loads(path.read_text()):
        oracle = OracleOutcome(**row["oracle"]) if row["oracle"] is not None else None
        results.append(VariantResult(row["kernel"], row["variant"], row["bug_class"],
                                     row["description"], KcertOutcome(**row["kcert"]),
                                     oracle))  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--oracle-child"]:
        return oracle_child(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", default="", help="comma-separated kernel folder names")
    parser.add_argument("--mutants", default="", help="comma-separated mutant names")
    parser.add_argument("--originals-only", action="store_true")
    parser.add_argument("--no-oracle", dest="oracle", action="store_false")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--json", type=Path, default=None, help="also write every result here")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="print the tables of results saved by --json, running nothing")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        saved = load_results(args.from_json)
        print_table(saved)
        print()
        print("per variant:")
        print_details(saved)
        return 0
    from kcert.certify.spares import WorkerPool

    with WorkerPool(spares=1) as pool:
        return run_corpus(args, pool)


def run_corpus(args: argparse.Namespace, pool: Any) -> int:
    from kcert.errors import KcertError

    only = {n for n in args.only.split(",") if n} or None
    wanted = {n for n in args.mutants.split(",") if n}
    try:
        kernels = load_corpus(args.corpus, only)
    except (CorpusError, OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"catch-rate bench: {exc}", file=sys.stderr)
        return 2
    if not kernels:
        print(f"catch-rate bench: no corpus kernel named {sorted(only or [])}", file=sys.stderr)
        return 2
    results: list[VariantResult] = []
    start = time.perf_counter()
    for kernel in kernels:
        variants: list[Mutant | None] = [None]
        if not args.originals_only:
            variants += [m for m in kernel.mutants if not wanted or m.name in wanted]
        for mutant in variants:
            label = "original" if mutant is None else mutant.name
            print(f"{kernel.name}/{label} ...", file=sys.stderr, flush=True)
            try:
                results.append(evaluate(kernel, mutant, args.executor, args.oracle, pool))
            except KcertError as exc:  # the environment, not the kernel: stop here
                print(f"catch-rate bench: {exc.diagnostics()}", file=sys.stderr)
                return 2
    print(f"catch rate, executor {args.executor}, {time.perf_counter() - start:.0f} s in all")
    print()
    print_table(results)
    print()
    print("per variant:")
    print_details(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


def summary(results: list[VariantResult]) -> Mapping[str, Any]:
    """Counts a test can assert on: false alarms and caught mutants per side."""
    originals = [r for r in results if r.variant == "original"]
    mutants = [r for r in results if r.variant != "original"]
    return {
        "false_alarms": [r.kernel for r in originals if r.kcert.caught],
        "missed": [f"{r.kernel}/{r.variant}" for r in mutants if not r.kcert.caught],
    }


if __name__ == "__main__":
    raise SystemExit(main())
