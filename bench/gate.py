"""How fast is the gate? ``GET /v1/gate`` against a bare FastAPI endpoint served the same way.

    python bench/gate.py [--database sqlite|postgres] [--workers 2] [--duration 5]

What it does, all on 127.0.0.1 and bounded in time:

1. Seeds a registry with real certificates (made by :mod:`kcert.attest`,
   stored by :func:`kcert.registry.certificates.store_certificate`, each with
   its audit-log leaf): by default 10,000 certificates of 2,500 kernels over
   100 targets, four hardware classes, 2,500 promotions. Seeding is slow (the
   registry verifies every certificate's signature and predicate schema), so
   the seeded database is cached: a SQLite file under ``--cache-dir``, or a
   PostgreSQL template database; every run works on a fresh copy of it.
2. Serves it the way we recommend for production, ``kcert serve --workers N``
   (:func:`kcert.api.serve.serve`): uvicorn's factory
   ``kcert.api.app:create_app`` with one worker process per CPU and no access
   log, over a listening socket bound with IPPROTO_TCP (the stock ``uvicorn
   --workers N`` loses TCP_NODELAY and adds ~40 ms to every keep-alive
   request, Kludex/uvicorn#3149: ``--stock-uvicorn`` shows it). The bare
   FastAPI endpoint (same route shape, same bearer header, no database) is
   served with exactly the same options.
3. Drives both from a separate process: wrk for saturation throughput when it
   is installed (Debian: ``apt-get install -y wrk``), else
   ``bench/loadgen.py`` in closed loop; then ``bench/loadgen.py`` in open loop
   at 80% of the bare endpoint's saturation rate, for tail latency.
4. Prints requests per second, p50 and p99 for each, the ratios, and whether
   the goals hold (gate >= half the bare throughput, gate p99 < 10 ms at 80%
   load). Exit code 0 when they hold, 1 when not, 2 when the bench could not run.

Gate queries are a fixed mix: 50% promoted kernels on their target (allow),
25% certified kernels on a target they are not promoted to (deny after the
policy runs), 25% kernels on a target with no matching certificate.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from fastapi import FastAPI, Header, HTTPException, Query  # noqa: E402
from gate_seed import Plan, make_gate_token, postgres_database, sqlite_database  # noqa: E402
from loadgen import LoadResult, LoadSpec  # noqa: E402

GATE_GOAL_RATIO = 0.5
P99_GOAL_MS = 10.0
LOAD_FRACTION = 0.8
BARE_TOKEN_ENV = "KCERT_BENCH_BARE_TOKEN"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# ---------------------------------------------------------------------------- the bare endpoint


def bare_app() -> FastAPI:
    """The baseline: FastAPI's own cost for a route shaped like the gate, with no database.

    Same method, path, query parameters and validation, same bearer check (a
    string compare), a JSON answer of the same shape. A plain ``def``, as such a
    route is usually written, so it pays for FastAPI's thread-pool hop; the
    gate route is ``async`` and answers on the event loop without one (an
    ``async`` bare endpoint would be a stricter baseline).
    """
    expected = f"Bearer {os.environ[BARE_TOKEN_ENV]}"
    app = FastAPI(title="bare")

    @app.get("/v1/gate")
    def gate(
        kernel: Annotated[str, Query(max_length=71, pattern=r"^(sha256:)?[0-9a-f]{64}$")],
        target: Annotated[str, Query(max_length=128)],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(status_code=401)
        return {"allow": False, "reasons": [f"bare endpoint for {target}"], "certificate": None}

    return app


# ---------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def uvicorn_command(app: str, port: int, workers: int, *, app_dir: Path | None = None,
                    stock: bool = False) -> list[str]:  # fmt: skip
    """The serving command, for the registry and the baseline alike.

    By default :func:`serve_nodelay` (uvicorn's own workers, over a listening
    socket that keeps TCP_NODELAY); with ``stock`` the plain uvicorn CLI, whose
    ``--workers N`` loses TCP_NODELAY (Kludex/uvicorn#3149) and so adds a
    delayed-ACK wait of about 40 ms to every keep-alive request after the first.
    """
    if not stock:
        return [sys.executable, str(Path(__file__).resolve()), "_serve", app, str(port),
                str(workers), str(app_dir or "")]  # fmt: skip
    cmd = [sys.executable, "-m", "uvicorn", app, "--factory", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--no-access-log",
           "--log-level", "warning"]  # fmt: skip
    if app_dir is not None:
        cmd += ["--app-dir", str(app_dir)]
    return cmd


def serve_nodelay(app: str, port: int, workers: int, app_dir: str) -> None:
    """``uvicorn APP --factory --workers N --no-access-log`` with a TCP_NODELAY-safe socket.

    This is :func:`kcert.api.serve.serve`, the function behind ``kcert serve
    --workers N``, so the bench measures what users run; the bare endpoint is
    served by the same function with the same options.
    """
    from kcert.api.serve import serve

    serve(host="127.0.0.1", port=port, workers=workers, access_log=False, app=app,
          app_dir=app_dir or None, log_level="warning")  # fmt: skip


@contextmanager
def served(cmd: list[str], env: dict[str, str], port: int, log: Path) -> Iterator[int]:
    """Run a server until the block ends; stop its whole process group whatever happens."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield port
    finally:
        _stop(proc)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # workers that outlived their parent
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------- load


def saturate(port: int, paths: Sequence[str], token: str, args: argparse.Namespace,
             work: Path) -> LoadResult:  # fmt: skip
    """Closed-loop saturation: wrk when installed, else the Python generator."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return loadgen(port, paths, token, work, mode="closed", duration=args.duration,
                       connections=args.connections)  # fmt: skip
    script = work / "paths.lua"
    quoted = ",\n".join(json.dumps(p) for p in paths)
    script.write_text(
        "local paths = {\n" + quoted + "\n}\nlocal i = 0\n"
        "request = function()\n  i = i + 1\n  return wrk.format(nil, paths[(i % #paths) + 1])\n"
        "end\n"
    )
    cmd = [wrk, "-t", str(args.wrk_threads), "-c", str(args.connections),
           "-d", f"{max(1, round(args.duration))}s", "--latency", "-s", str(script),
           "-H", f"Authorization: Bearer {token}", f"http://127.0.0.1:{port}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 30)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {(out.stderr or out.stdout).strip()}")
    return parse_wrk(out.stdout, args.duration)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def parse_wrk(text: str, duration: float) -> LoadResult:
    def latency(pct: str) -> float:
        m = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
        if m is None:
            raise RuntimeError(f"no {pct}% line in wrk's output:\n{text}")
        return float(m.group(1)) * _UNITS[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    if rps is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{text}")
    max_ms = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s|m)", text)
    return LoadResult(
        requests=int(total.group(1)),
        errors=sum(int(x) for x in errors.groups()) if errors else 0,
        non_2xx=int(non2xx.group(1)) if non2xx else 0,
        elapsed_s=float(total.group(2)) * _UNITS[total.group(3)] / 1e3,
        rps=float(rps.group(1)), p50_ms=latency("50"), p99_ms=latency("99"),
        max_ms=float(max_ms.group(1)) * _UNITS[max_ms.group(2)] if max_ms else float("nan"),
        offered_rps=0.0,
    )  # fmt: skip


def loadgen(port: int, paths: Sequence[str], token: str, work: Path, *, mode: str,
            duration: float, connections: int, rate: float = 0.0) -> LoadResult:  # fmt: skip
    """Run ``bench/loadgen.py`` in its own process (never in the server's)."""
    spec = LoadSpec(host="127.0.0.1", port=port, paths=list(paths),
                    headers={"Authorization": f"Bearer {token}"}, mode=mode,
                    duration_s=duration, connections=connections, rate_per_s=rate)  # fmt: skip
    spec_file = work / f"load-{port}-{mode}.json"
    spec_file.write_text(json.dumps(asdict(spec)))
    out = subprocess.run([sys.executable, str(BENCH / "loadgen.py"), str(spec_file)],
                         capture_output=True, text=True, timeout=duration + 60)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"the load generator failed: {out.stderr.strip()[-2000:]}")
    return LoadResult(**json.loads(out.stdout))


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True)
class Figures:
    saturation: LoadResult
    at_load: LoadResult
    #: Open loop at 80% of this server's own saturation (its tail when not overloaded).
    at_own_load: LoadResult | None = None


def measure(port: int, paths: Sequence[str], token: str, args: argparse.Namespace, work: Path,
            rate: float | None) -> tuple[LoadResult, LoadResult | None]:  # fmt: skip
    # A short warm-up fills the connection pools and the database's page cache.
    loadgen(port, paths, token, work, mode="closed", duration=1.0, connections=4)
    sat = saturate(port, paths, token, args, work)
    if rate is None:
        return sat, None
    opened = loadgen(port, paths, token, work, mode="open", duration=args.duration,
                     connections=args.connections, rate=rate)  # fmt: skip
    return sat, opened


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    plan = Plan(certificates=args.certificates, targets=args.targets)
    paths = plan.queries()
    tool = shutil.which("wrk")
    if tool:
        say(f"saturation load: wrk at {tool}")
    else:
        say("saturation load: bench/loadgen.py in closed loop (wrk is not installed; "
            "for a lighter client: apt-get install -y wrk)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kcert-bench-gate-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        if args.database == "postgres":
            db = postgres_database(plan, args.postgres_url, say)
        else:
            db = sqlite_database(plan, args.cache_dir, work, say)
        with db as url:
            token = make_gate_token(url)
            bare_token = secrets.token_urlsafe(32)
            env = {**os.environ, "KCERT_HOME": str(home), "KCERT_DATABASE_URL": url,
                   "KCERT_ADMIN_TOKEN": secrets.token_urlsafe(32),
                   BARE_TOKEN_ENV: bare_token}  # fmt: skip
            port = free_port()
            cmd = uvicorn_command("gate:bare_app", port, args.workers, app_dir=BENCH,
                                  stock=args.stock_uvicorn)  # fmt: skip
            say(f"bare endpoint: {' '.join(cmd)}")
            with served(cmd, env, port, work / "bare.log"):
                bare_sat, _ = measure(port, paths, bare_token, args, work, None)
                rate = LOAD_FRACTION * bare_sat.rps
                bare_open = loadgen(port, paths, bare_token, work, mode="open",
                                    duration=args.duration, connections=args.connections,
                                    rate=rate)  # fmt: skip
            port = free_port()
            cmd = uvicorn_command("kcert.api.app:create_app", port, args.workers,
                                  stock=args.stock_uvicorn)  # fmt: skip
            say(f"registry: {' '.join(cmd)}")
            with served(cmd, env, port, work / "gate.log"):
                gate_sat, gate_open = measure(port, paths, token, args, work, rate)
                gate_own = loadgen(port, paths, token, work, mode="open",
                                   duration=args.duration, connections=args.connections,
                                   rate=LOAD_FRACTION * gate_sat.rps)  # fmt: skip
            assert gate_open is not None
            problems = [r for r in (bare_sat, gate_sat, bare_open, gate_open, gate_own)
                        if r.errors or r.non_2xx]  # fmt: skip
    report(args, plan, Figures(bare_sat, bare_open), Figures(gate_sat, gate_open, gate_own), rate)
    if problems:
        say("some requests failed or were answered with non-2xx: see the table")
        return 2
    ratio_ok = gate_sat.rps >= GATE_GOAL_RATIO * bare_sat.rps
    p99_ok = gate_open.p99_ms < P99_GOAL_MS
    return 0 if ratio_ok and p99_ok else 1


def report(args: argparse.Namespace, plan: Plan, bare: Figures, gate: Figures,
           rate: float) -> None:  # fmt: skip
    client = "wrk" if shutil.which("wrk") else "loadgen.py"
    print(f"gate bench: {args.database}, {plan.certificates} certificates, {plan.targets} targets,"
          f" uvicorn --workers {args.workers}, {os.cpu_count()} CPUs, "
          f"{args.connections} connections, {args.duration:g} s per phase")  # fmt: skip
    print(f"{'':26}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    rows = [
        (f"bare, saturated ({client})", bare.saturation),
        (f"gate, saturated ({client})", gate.saturation),
        (f"bare, open loop {rate:.0f}/s", bare.at_load),
        (f"gate, open loop {rate:.0f}/s", gate.at_load),
    ]
    if gate.at_own_load is not None:
        own = gate.at_own_load.offered_rps
        rows.append((f"gate, open loop {own:.0f}/s*", gate.at_own_load))
    for name, r in rows:
        print(f"{name:26}{r.rps:10.0f}{r.p50_ms:9.2f}{r.p99_ms:9.2f}{r.errors + r.non_2xx:8d}")
    print("* 80% of the gate's own saturation: its tail latency when it is not overloaded")
    ratio = gate.saturation.rps / bare.saturation.rps if bare.saturation.rps else 0.0
    p50 = gate.saturation.p50_ms / bare.saturation.p50_ms if bare.saturation.p50_ms else 0.0
    p99 = gate.saturation.p99_ms / bare.saturation.p99_ms if bare.saturation.p99_ms else 0.0
    print(
        f"gate/bare: throughput {ratio:.2f} (goal >= {GATE_GOAL_RATIO}), "
        f"p50 {p50:.2f}x, p99 {p99:.2f}x"
    )
    if bare.at_load.rps < 0.95 * rate:
        # The bare endpoint keeps up at 80% of its own saturation; if it did not get the
        # offered rate, the Python load generator (sharing the CPUs) was the limit.
        print(
            f"note: the load generator delivered only {bare.at_load.rps:.0f}/s of {rate:.0f}/s "
            "to the bare endpoint: on this machine the client, not the server, set that limit"
        )
    ok = "met" if gate.at_load.p99_ms < P99_GOAL_MS else "MISSED"
    print(
        f"gate p99 at {LOAD_FRACTION:.0%} of bare saturation ({rate:.0f}/s offered, "
        f"{gate.at_load.rps:.0f}/s served): {gate.at_load.p99_ms:.2f} ms "
        f"(goal < {P99_GOAL_MS:g} ms: {ok})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres-url", default=os.environ.get("KCERT_TEST_POSTGRES_URL",
                                                                 PG_DEFAULT))  # fmt: skip
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="uvicorn worker processes (default: one per CPU)",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--certificates", type=int, default=10_000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "kcert-bench")  # fmt: skip
    parser.add_argument(
        "--stock-uvicorn",
        action="store_true",
        help="serve with the plain uvicorn CLI (shows its TCP_NODELAY bug)",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        serve_nodelay(argv[1], int(argv[2]), int(argv[3]), argv[4])
        return 0
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"gate bench could not run: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
