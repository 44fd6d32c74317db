"""The one-shape ``allclose`` oracle that ``catch_rate.py`` measures kcert against.

KernelBench style: one shape (the largest value of each dim), five seeds of
``randn`` for the float inputs (integer inputs are drawn from the spec's
domain, so that labels stay valid), the kernel run in a child process through
the Triton interpreter (or on the GPU), and ``allclose(out, ref, atol=tol,
rtol=tol)`` against the reference rounded to the output's dtype, for tol =
1e-2 and 1e-4. A crash or a timeout counts as caught. The child is this file
run as ``python catch_oracle.py --oracle-child JOB_DIR``: it imports the
kernel module (untrusted code, so never in the process that drives the bench)
and writes the outputs of each seed to the job folder. On the interpreter the
child computes bfloat16 arithmetic as kcert's worker does
(:mod:`kcert.certify.executors.interpreter_numerics`), so that both run the same
kernel and the comparison is between the checks, not between interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ORACLE_SEEDS = 5
ORACLE_TOLERANCES = (1e-2, 1e-4)
ORACLE_DEADLINE_S = 300.0
CHILD_FLAG = "--oracle-child"


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
        return self.ran and self.mismatched[tol_key(tol)]


def tol_key(tol: float) -> str:
    return f"{tol:.0e}"


def run_oracle(spec_path: Path, executor: str) -> OracleOutcome:
    """One shape, five seeds of randn, allclose at each tolerance; the kernel runs in a child."""
    from kcert.certify.executors.base import host_dtype
    from kcert.certify.reference import Reference
    from kcert.certify.spec import BufferArg, ConstArg, Intent, load_spec
    from kcert.errors import KcertError

    start = time.perf_counter()
    keys = [tol_key(t) for t in ORACLE_TOLERANCES]
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
                lo, hi = (
                    (int(np.ceil(domain.a)), int(np.ceil(domain.b)))
                    if (domain is not None and domain.kind == "uniform")
                    else (0, 64)
                )
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
                [sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, str(job)],
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

    if os.environ.get("TRITON_INTERPRET") == "1":
        from kcert.certify.executors import interpreter_numerics

        interpreter_numerics.install()
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
        np.savez(
            job_dir / f"out{i}.npz",
            **{k: v.detach().to("cpu", torch.float64).numpy() for k, v in outputs.items()},
        )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != [CHILD_FLAG] or len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} {CHILD_FLAG} JOB_DIR (run by catch_rate.py)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(oracle_child(Path(sys.argv[2])))
