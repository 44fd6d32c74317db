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
- **oracle** (``catch_oracle.py``), KernelBench style: one shape (the largest value of each dim),
  five seeds of ``randn`` for the float inputs (integer inputs are drawn from
  the spec's domain, so that labels stay valid), the kernel run in a child
  process through the Triton interpreter (or on the GPU), and
  ``allclose(out, ref, atol=tol, rtol=tol)`` against the reference rounded to
  the output's dtype, for tol = 1e-2 and 1e-4. A crash counts as caught.

Wall times are per variant and include each side's start-up (kcert's build,
lint and sandboxed worker; the oracle's child process importing torch).
Goals (issue 13): no false alarm on the originals, at least 95% of mutants
caught, kcert within 2x the oracle's wall time. The records, their JSON and the
tables are ``catch_results.py``'s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from catch_oracle import run_oracle  # noqa: E402
from catch_results import (  # noqa: E402
    KcertOutcome,
    VariantResult,
    load_results,
    print_details,
    print_table,
)

CORPUS = ROOT / "bench" / "corpus"
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


# ---------------------------------------------------------------------------- one variant


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", default="", help="comma-separated kernel folder names")
    parser.add_argument("--mutants", default="", help="comma-separated mutant names")
    parser.add_argument("--originals-only", action="store_true")
    parser.add_argument("--no-oracle", dest="oracle", action="store_false")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--json", type=Path, default=None, help="also write every result here")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="print the tables of results saved by --json, running nothing",
    )
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


if __name__ == "__main__":
    raise SystemExit(main())
