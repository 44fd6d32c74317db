"""How long do the quick commands take to start? Wall time against a bare interpreter.

    python bench/startup.py [--repeat 7] [--cert CERT --pub KEY.pub]

Each command runs as its own process, the way a deploy script runs it, and
``python -c pass`` runs interleaved with them as the baseline of this machine
right now (a busy machine slows both). The commands: ``kcert --version``,
``kcert gate --help``, ``kcert verify --help``, ``kcert verify CERT --key PUB``
(a real certificate; without ``--cert`` one is made first by certifying the
Triton saxpy example on the CPU, which needs Triton), and ``kcert gate``
against a server address where none listens (the client starts, connects and
exits 2: everything but the network round trip). Printed per command: the
median and best wall time, its ratio to the baseline's, and the median CPU
time (user + system) with its ratio: on a busy machine the wall time is mostly
waiting for a core, the CPU time what the command itself needs. The goal is a
wall time under 0.5 s on an idle machine.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What the ``kcert`` console script runs.
KCERT = [sys.executable, "-c",
         "import sys; from kcert.cli import main; sys.argv[0] = 'kcert'; main()"]  # fmt: skip
GOAL_S = 0.5


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the child: on a busy machine the
    wall time mostly measures the queue for a core, the CPU time what the command needs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _certificate(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "bench.key", folder / "saxpy.cert.json"
    subprocess.run([*KCERT, "keys", "generate", "--out", str(key)], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([*KCERT, "certify", str(REPO / "examples/triton/kcert.toml"), "--kernel",
                    "saxpy", "--executor", "triton-interpreter", "--hw", "cpu", "--max-probes",
                    "2", "--key", str(key), "--out", str(cert)], check=True,
                   capture_output=True)  # fmt: skip
    return cert, Path(f"{key}.pub")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cert", type=Path, help="A certificate to verify (default: make one).")
    parser.add_argument("--pub", type=Path, help="Its signer's public key.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.cert is None:
            print("making a certificate (kcert certify saxpy on the CPU) ...", file=sys.stderr)
            cert, pub = _certificate(Path(tmp))
        else:
            cert, pub = args.cert, args.pub
        commands = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "kcert --version": [*KCERT, "--version"],
            "kcert gate --help": [*KCERT, "gate", "--help"],
            "kcert verify --help": [*KCERT, "verify", "--help"],
            "kcert verify CERT --key PUB": [*KCERT, "verify", str(cert), "--key", str(pub)],
            "kcert gate --registry (nobody listening)": [
                *KCERT, "gate", "--kernel", "sha256:" + "0" * 64, "--target", "t",
                "--registry", "http://127.0.0.1:9"],
        }  # fmt: skip
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():
            _run(argv)  # warm the file cache and .pyc files
        for _ in range(args.repeat):
            for name, argv in commands.items():  # interleaved: load changes hit all alike
                wall, cpu = _run(argv)
                walls[name].append(wall)
                cpus[name].append(cpu)
    base = statistics.median(walls["python -c pass (baseline)"])
    base_cpu = statistics.median(cpus["python -c pass (baseline)"])
    width = max(map(len, walls))
    print(f"{'command':<{width}}  wall_med  wall_best  wall/python  cpu_med  cpu/python  "
          f"under_{GOAL_S}s")  # fmt: skip
    for name in commands:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:<{width}}  {wall:8.3f}  {min(walls[name]):9.3f}  {wall / base:11.1f}  "
              f"{cpu:7.3f}  {cpu / base_cpu:10.1f}  "
              f"{'yes' if wall < GOAL_S else 'NO'}")  # fmt: skip


if __name__ == "__main__":
    main()
