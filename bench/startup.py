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
median and best wall time, and the median minus the baseline's (what kcert's
imports and work cost over starting Python). The goal is under 0.5 s.
"""

from __future__ import annotations

import argparse
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


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


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
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():
            _wall(argv)  # warm the file cache and .pyc files
        for _ in range(args.repeat):
            for name, argv in commands.items():  # interleaved: load changes hit all alike
                times[name].append(_wall(argv))
    base = statistics.median(times["python -c pass (baseline)"])
    width = max(map(len, times))
    print(f"{'command':<{width}}  median_s  best_s  over_python_s  under_{GOAL_S}s")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<{width}}  {median:8.3f}  {min(samples):6.3f}  {median - base:13.3f}  "
              f"{'yes' if median < GOAL_S else 'NO'}")  # fmt: skip


if __name__ == "__main__":
    main()
