"""Where does certification time go? Per kernel: build, probes, reference, runs, checks, signing.

    python bench/certify.py [--spec examples/triton/kcert.toml] [--only saxpy,softmax]
                            [--executor auto|triton-interpreter|triton|cuda] [--max-probes N]

Each kernel of the spec is certified in this process exactly as ``kcert
certify --key`` does it (:func:`kcert.certify.pipeline.certify`, then
:func:`kcert.attest.certificate.sign_report`), with timers wrapped around the
pipeline's steps. Timers nest and count *exclusive* time, so the columns add
up to the wall time. Columns:

- ``env``: reading the environment (driver, versions, CPU model);
- ``build``: compile and lint (NVRTC / Triton); the interpreter lints for a GPU arch too;
- ``probes``: building probe dims, inputs and run jobs (padding, poison);
- ``ref``: loading and calling the NumPy reference, ``tol`` the tolerance bounds around it;
- ``worker``: taking (or starting) the sandboxed worker process, waiting for it to
  import torch/Triton or CuPy and load the kernel, and closing it; every
  certification here shares one :class:`~kcert.certify.spares.WorkerPool` that
  keeps a warm worker ahead (as ``kcert certify`` does for several kernels), so
  after the first kernel the worker imported while the previous kernel ran, and
  mostly the first kernel pays here;
- ``runs``: the kernel's own runs, from job sent to answer received (worker side);
- ``xfer``: moving buffers to and from the worker;
- ``checks``: the host-side checks and the anchors (SHA-256 of every array);
- ``timing``, ``min``: timing against the baseline (GPU only) and failure minimization;
- ``sign``: signing the report into a DSSE certificate; ``other``: everything else.

The last column is the share of wall time spent outside the kernel's own
runs. A last table gives the sandbox's cost: every kernel certified again,
in alternating batches (two each), with and without the sandbox
(:mod:`kcert.certify.jail`), and the ratio of their wall times measured in
this one run (``--no-sandbox-cost`` skips it). On a machine without a GPU
the Triton examples run through the Triton interpreter (``--executor auto``
picks it); with a GPU, ``auto`` picks the GPU.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COLUMNS = ("env", "build", "probes", "ref", "tol", "worker", "runs", "xfer", "checks", "timing",
           "min", "sign", "other")  # fmt: skip
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Frame:
    category: str
    children_s: float = 0.0


@dataclass
class Clock:
    """Exclusive time per category: a nested timer's time is taken out of its parent's."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stack: list[_Frame] = field(default_factory=list)

    def wrap(self, category: str, fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = _Frame(category)
            self.stack.append(frame)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.stack.pop()
                self.totals[category] += elapsed - frame.children_s
                if self.stack:
                    self.stack[-1].children_s += elapsed

        return timed  # type: ignore[return-value]

    def add(self, category: str, seconds: float) -> None:
        """Move ``seconds`` measured inside the current frame into ``category``."""
        self.totals[category] += seconds
        if self.stack:
            self.stack[-1].children_s += seconds


@contextmanager
def instrumented(clock: Clock) -> Iterator[None]:
    """Wrap the pipeline's steps with ``clock``'s timers; undo it afterwards."""
    from kcert.attest import certificate as attest
    from kcert.certify import environment, pipeline, reference, sandbox

    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, category: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            # The pipeline was refactored under us: say so, and let "other" absorb that step.
            print(f"note: {owner.__name__}.{name} is gone; its time counts as other",
                  file=sys.stderr)  # fmt: skip
            return
        patches.append((owner, name, original))
        setattr(owner, name, clock.wrap(category, original))

    patch(environment, "collect_environment", "env")
    patch(pipeline._Certifier, "_build", "build")
    for name in ("fixed_probes", "fresh_probes", "make_inputs", "make_probe", "make_job"):
        patch(pipeline, name, "probes")
    patch(reference.Reference, "__init__", "ref")
    patch(reference.Reference, "__call__", "ref")
    patch(pipeline, "allowances", "tol")
    for name in ("evaluate", "anchor"):
        patch(pipeline, name, "checks")
    patch(pipeline, "minimize", "min")
    patch(sandbox.Sandbox, "_spawn", "worker")
    patch(sandbox.Sandbox, "_start", "worker")
    patch(sandbox.Sandbox, "close", "worker")
    patch(sandbox.Sandbox, "time", "timing")
    patch(attest, "sign_report", "sign")

    run = sandbox.Sandbox.run

    @functools.wraps(run)
    def timed_run(self: Any, job: Any) -> Any:
        outcome = run(self, job)
        # The worker's answer time is the kernel's own run; the rest of run() is transfer.
        clock.add("runs", outcome.elapsed_s)
        return outcome

    patches.append((sandbox.Sandbox, "run", run))
    sandbox.Sandbox.run = clock.wrap("xfer", timed_run)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


@dataclass(frozen=True)
class KernelCost:
    name: str
    verdict: str
    probes: int
    wall_s: float
    seconds: dict[str, float]

    @property
    def outside_runs(self) -> float:
        return 1.0 - self.seconds.get("runs", 0.0) / self.wall_s if self.wall_s else 0.0


def measure(spec: Any, executor: str, max_probes: int | None, key: Any, pool: Any,
            sandbox: bool = True) -> KernelCost:  # fmt: skip
    import kcert.attest.certificate as attest
    from kcert.certify.pipeline import CertifyOptions, certify

    clock = Clock()
    options = CertifyOptions(executor=executor, max_probes=max_probes, sandbox=sandbox)
    with instrumented(clock):
        start = time.perf_counter()
        report = clock.wrap("other", certify)(spec, options, pool=pool)
        # Looked up through the module at call time, so the timed one runs.
        attest.sign_report(report, key)
        wall = time.perf_counter() - start
    seconds = dict(clock.totals)
    return KernelCost(spec.name, str(report.verdict), len(report.probes), wall, seconds)


def print_table(costs: list[KernelCost], executor: str) -> None:
    print(f"certification cost per kernel (seconds), executor {executor}")
    print(f"{'kernel':10}{'verdict':>8}{'probes':>7}{'wall':>7}"
          + "".join(f"{c:>7}" for c in COLUMNS) + f"{'outside':>9}")  # fmt: skip
    for c in costs:
        print(f"{c.name:10}{c.verdict:>8}{c.probes:>7}{c.wall_s:7.2f}"
              + "".join(f"{c.seconds.get(k, 0.0):7.2f}" for k in COLUMNS)
              + f"{c.outside_runs:9.0%}")  # fmt: skip
    wall = sum(c.wall_s for c in costs)
    if not wall:
        return
    totals = {k: sum(c.seconds.get(k, 0.0) for c in costs) for k in COLUMNS}
    print(f"{'all':10}{'':>8}{sum(c.probes for c in costs):7d}{wall:7.2f}"
          + "".join(f"{totals[k]:7.2f}" for k in COLUMNS)
          + f"{1 - totals['runs'] / wall:9.0%}")  # fmt: skip
    top = sorted(((v, k) for k, v in totals.items() if k != "runs"), reverse=True)[:3]
    print("largest costs outside the kernel's own runs: "
          + ", ".join(f"{k} {v / wall:.0%}" for v, k in top))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "triton" / "kcert.toml")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--max-probes", type=int, default=None)
    parser.add_argument("--no-sandbox-cost", dest="sandbox_cost", action="store_false",
                        help="skip the with/without-sandbox comparison")  # fmt: skip
    args = parser.parse_args(argv)

    from kcert.attest.keys import generate_private_key
    from kcert.certify.spares import WorkerPool

    with WorkerPool(spares=1) as pool:
        return run(args, pool, generate_private_key())


def run(args: argparse.Namespace, pool: Any, key: Any) -> int:
    from kcert.certify.sandbox import default_executor
    from kcert.certify.spec import load_spec
    from kcert.errors import KcertError

    try:
        specs = load_spec(args.spec).kernels
    except KcertError as exc:
        print(f"certify bench: {exc.diagnostics()}", file=sys.stderr)
        return 2
    wanted = {n for n in args.only.split(",") if n}
    specs = tuple(s for s in specs if not wanted or s.name in wanted)
    if not specs:
        print(f"certify bench: no kernel named {sorted(wanted)} in {args.spec}", file=sys.stderr)
        return 2
    costs: list[KernelCost] = []
    executor = args.executor
    for spec in specs:
        chosen = default_executor(spec) if executor == "auto" else executor
        print(f"certifying {spec.name} ({chosen}) ...", file=sys.stderr, flush=True)
        try:
            costs.append(measure(spec, chosen, args.max_probes, key, pool))
        except KcertError as exc:
            print(f"  {spec.name}: {exc.diagnostics()}", file=sys.stderr)
            return 2
    print_table(costs, executor)
    if args.sandbox_cost:
        print_sandbox_cost(specs, executor, args.max_probes, key, pool)
    return 0


def print_sandbox_cost(specs: tuple[Any, ...], executor: str, max_probes: int | None,
                       key: Any, pool: Any) -> None:  # fmt: skip
    """Wall time with and without the sandbox, in alternating batches, and their ratio."""
    from kcert.certify.sandbox import default_executor

    walls: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
    for sandbox in (False, True, False, True):
        print(f"sandbox cost: a batch {'with' if sandbox else 'without'} the sandbox ...",
              file=sys.stderr, flush=True)  # fmt: skip
        for spec in specs:
            chosen = default_executor(spec) if executor == "auto" else executor
            walls[sandbox][spec.name].append(measure(spec, chosen, max_probes, key, pool,
                                                     sandbox).wall_s)  # fmt: skip
    print("sandbox cost: wall seconds per kernel (sum of 2 batches each)")
    print(f"{'kernel':10}{'no sandbox':>12}{'sandbox':>10}{'ratio':>8}")
    for spec in specs:
        bare, boxed = sum(walls[False][spec.name]), sum(walls[True][spec.name])
        print(f"{spec.name:10}{bare:12.2f}{boxed:10.2f}{boxed / bare:8.2f}")
    bare = sum(sum(v) for v in walls[False].values())
    boxed = sum(sum(v) for v in walls[True].values())
    print(f"{'all':10}{bare:12.2f}{boxed:10.2f}{boxed / bare:8.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
