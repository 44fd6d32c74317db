"""How fast is the gate? ``GET /v1/gate`` against a bare FastAPI endpoint served the same way.

    python bench/gate.py [--database sqlite|postgres] [--rounds 3] [--duration 5]

What it does, all on 127.0.0.1 and bounded in time:

1. Seeds a registry with real certificates (made by :mod:`kcert.attest`,
   stored by :func:`kcert.registry.certificates.store_certificate`, each with
   its audit-log leaf): by default 10,000 certificates of 2,500 kernels over
   100 targets, four hardware classes, 2,500 promotions. Seeding is slow (the
   registry verifies every certificate's signature and predicate schema), so
   the seeded database is cached: a SQLite file under ``--cache-dir``, or a
   PostgreSQL template database; every run works on a fresh copy of it.
2. Splits the CPUs: the servers run on the first half (``--server-cpus``), the
   load generators on the rest (``--client-cpus``), so the client never takes
   the server's CPU time, which on a small machine otherwise decides every
   figure. PostgreSQL's processes serving the run are pinned to the load
   generators' CPUs by default (``--database-cpus client``: the database on
   its own host, as PostgreSQL at scale runs), or with ``--database-cpus
   server`` to the server's, so that the database's work counts against the
   gate too.
3. Serves both the way the README recommends for production, ``kcert serve
   --workers N`` (:func:`kcert.api.serve.serve`: uvicorn with uvloop and
   h11 capping the request head, one worker per server CPU, no access log, a
   listening socket that keeps TCP_NODELAY). The bare endpoint (same route shape, same bearer
   header, no database) is served with exactly the same options.
4. Drives both from a separate process in alternating rounds, so drift on a
   shared machine hits both alike: wrk for saturation throughput when it is
   installed (Debian: ``apt-get install -y wrk``), else ``bench/loadgen.py`` in
   closed loop; then ``bench/loadgen.py`` in open loop at 25%, 50% and 80% of
   the bare endpoint's saturation rate, for tail latency.
5. Prints requests per second, p50 and p99 for each, the ratios, and whether
   the goals hold (gate >= half the bare throughput, gate p99 < 10 ms at 80% of
   the bare endpoint's saturation). Exit code 0 when they hold, 1 when not, 2
   when the bench could not run.

Two gate mixes. *Repeat*: a fixed set of 2,000 queries, 50% promoted kernels on
their target (allow), 25% certified kernels on a target they are not promoted
to (deny after the policy runs), 25% kernels on a target with no matching
certificate: a fleet's deploys ask the same questions again and again, so
after a warm-up these are answered from the gate's cache after its one
version-and-token query. *Uncached*: every query a (kernel, target) pair the
servers have not seen, so every answer is computed (the kernel's
certificates read, the policy run): the cost after every state change, since
any change empties every cache.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
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

from kcert.api.serve import APP_FACTORY, freeze_startup_heap  # noqa: E402

GATE_GOAL_RATIO = 0.5
P99_GOAL_MS = 10.0
LOAD_FRACTION = 0.8
#: Open-loop loads, as fractions of the bare endpoint's saturation (the goal is at 80%).
LOAD_SWEEP = (0.25, 0.5, LOAD_FRACTION)
BARE_TOKEN_ENV = "KCERT_BENCH_BARE_TOKEN"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# ---------------------------------------------------------------------------- the bare endpoint


def bare_app() -> FastAPI:
    """The baseline: FastAPI's own cost for a route shaped like the gate, with no database.

    Same method, path, query parameters and validation, same bearer check (a
    constant-time compare), a JSON answer of the same shape. ``async``, like the
    gate route, so neither pays for a hop to FastAPI's thread pool: the
    strictest baseline a FastAPI route can offer.
    """
    expected = f"Bearer {os.environ[BARE_TOKEN_ENV]}"
    app = FastAPI(title="bare")

    @app.get("/v1/gate")
    async def gate(
        kernel: Annotated[str, Query(max_length=71, pattern=r"^(sha256:)?[0-9a-f]{64}$")],
        target: Annotated[str, Query(max_length=128)],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(status_code=401)
        return {"allow": False, "reasons": [f"bare endpoint for {target}"], "certificate": None}

    freeze_startup_heap()  # as kcert.api.serve.serving_app does for the registry
    return app


# ---------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])




@dataclass(frozen=True, slots=True)
class CpuSplit:
    """Which CPUs serve and which load; empty ``client`` means no split (one CPU)."""

    server: tuple[int, ...]
    client: tuple[int, ...]

    @classmethod
    def choose(cls, server: str | None, client: str | None) -> CpuSplit:
        available = sorted(os.sched_getaffinity(0))
        if server is None and client is None:
            if len(available) < 2:
                return cls(tuple(available), ())
            half = len(available) // 2
            return cls(tuple(available[:half]), tuple(available[half:]))
        if server is None or client is None:
            raise ValueError("give both --server-cpus and --client-cpus, or neither")
        chosen = cls(_cpu_list(server), _cpu_list(client))
        if set(chosen.server) & set(chosen.client):
            raise ValueError("--server-cpus and --client-cpus overlap")
        missing = set(chosen.server + chosen.client) - set(available)
        if missing:
            raise ValueError(f"CPUs {sorted(missing)} are not available to this process")
        return chosen

    def describe(self) -> str:
        if not self.client:
            return f"server and load generator share CPU {_cpus(self.server)} (one CPU: no split)"
        return f"server on CPUs {_cpus(self.server)}, load generators on CPUs {_cpus(self.client)}"


def _cpu_list(text: str) -> tuple[int, ...]:
    """``0,2-3`` -> (0, 2, 3)."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (for example 0,2-3)")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(cpus)))


def _cpus(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus))


def serve_command(app: str, port: int, workers: int, cpus: Sequence[int], *,
                  app_dir: Path | None = None, stock: bool = False) -> list[str]:  # fmt: skip
    """The serving command, for the registry and the baseline alike, pinned to ``cpus``.

    By default :func:`serve_pinned` (:func:`kcert.api.serve.serve`, what
    ``kcert serve`` runs); with ``stock`` the plain uvicorn CLI, whose
    ``--workers N`` (N > 1) loses TCP_NODELAY (Kludex/uvicorn#3149) and so adds
    a delayed-ACK wait of about 40 ms to every keep-alive request after the first.
    """
    if not stock:
        return [sys.executable, str(Path(__file__).resolve()), "_serve", app, str(port),
                str(workers), str(app_dir or ""), _cpus(cpus)]  # fmt: skip
    cmd = ["taskset", "-c", _cpus(cpus), sys.executable, "-m", "uvicorn", app, "--factory",
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
           "--no-access-log", "--log-level", "warning"]  # fmt: skip
    if app_dir is not None:
        cmd += ["--app-dir", str(app_dir)]
    return cmd


def serve_pinned(app: str, port: int, workers: int, app_dir: str, cpus: str) -> None:
    """``kcert serve --workers N`` for ``app`` on ``cpus`` (worker processes inherit them)."""
    from kcert.api.serve import serve

    os.sched_setaffinity(0, _cpu_list(cpus))
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


def pin_database(url: str, cpus: Sequence[int], where: str) -> str:
    """Pin the PostgreSQL processes serving the run's database to ``cpus``; say what happened.

    The servers' connections are open by now (the warm-up made them), so their
    backends are exactly the ones with the run's database name.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            pids = [int(r[0]) for r in conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = :n"),
                {"n": target.database})]  # fmt: skip
    finally:
        admin.dispose()
    pinned = 0
    for pid in pids:
        try:
            os.sched_setaffinity(pid, cpus)
            pinned += 1
        except OSError:
            pass
    if pids and pinned == len(pids):
        return f"PostgreSQL: its {pinned} processes serving the run pinned to the {where}'s CPUs"
    return (f"PostgreSQL: pinned {pinned} of its {len(pids)} processes serving the run to the "
            f"{where}'s CPUs (the rest run anywhere: pinning another user's processes needs "
            "root)")  # fmt: skip


# ---------------------------------------------------------------------------- load


def saturate(port: int, paths: Sequence[str], token: str, args: argparse.Namespace,
             work: Path) -> LoadResult:  # fmt: skip
    """Closed-loop saturation: wrk when installed, else the Python generator."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return loadgen(port, paths, token, work, mode="closed", duration=args.duration,
                       connections=args.connections)  # fmt: skip
    script = work / f"paths-{port}-{len(paths)}.lua"
    if not script.exists():
        quoted = ",\n".join(json.dumps(p) for p in paths)
        script.write_text(
            "local paths = {\n" + quoted + "\n}\nlocal i = 0\n"
            "request = function()\n  i = i + 1\n"
            "  return wrk.format(nil, paths[((i - 1) % #paths) + 1])\nend\n"
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


@dataclass(slots=True)
class Phase:
    """One measured load, repeated once per round."""

    name: str
    runs: list[LoadResult] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in self.runs))

    @property
    def failed(self) -> int:
        return sum(r.errors + r.non_2xx for r in self.runs)


@dataclass(frozen=True, slots=True)
class Server:
    port: int
    token: str


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    split = CpuSplit.choose(args.server_cpus, args.client_cpus)
    workers = args.workers or len(split.server)
    plan = Plan(certificates=args.certificates, targets=args.targets)
    repeat = plan.queries()
    uncached = plan.unseen_queries(args.rounds, per_round=args.uncached_per_round,
                                   seen=repeat)  # fmt: skip
    client = "wrk" if shutil.which("wrk") else "loadgen.py"
    if client == "wrk":
        say(f"saturation load: wrk at {shutil.which('wrk')}")
    else:
        say("saturation load: bench/loadgen.py in closed loop (wrk is not installed; "
            "for a lighter client: apt-get install -y wrk)")  # fmt: skip
    say(split.describe())
    with tempfile.TemporaryDirectory(prefix="kcert-bench-gate-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        if args.database == "postgres":
            db = postgres_database(plan, args.postgres_url, say)
        else:
            db = sqlite_database(plan, args.cache_dir, work, say)
        with db as url:
            bare = Server(free_port(), secrets.token_urlsafe(32))
            gate = Server(free_port(), make_gate_token(url))
            env = {**os.environ, "KCERT_HOME": str(home), "KCERT_DATABASE_URL": url,
                   "KCERT_ADMIN_TOKEN": secrets.token_urlsafe(32),
                   BARE_TOKEN_ENV: bare.token}  # fmt: skip
            bare_cmd = serve_command("gate:bare_app", bare.port, workers, split.server,
                                     app_dir=BENCH, stock=args.stock_uvicorn)  # fmt: skip
            gate_cmd = serve_command(APP_FACTORY, gate.port, workers,
                                     split.server, stock=args.stock_uvicorn)  # fmt: skip
            say(f"bare endpoint: {' '.join(bare_cmd)}")
            say(f"registry: {' '.join(gate_cmd)}")
            if split.client:
                # wrk and the load generator inherit this; the servers pin themselves.
                os.sched_setaffinity(0, split.client)
            with (served(bare_cmd, env, bare.port, work / "bare.log"),
                  served(gate_cmd, env, gate.port, work / "gate.log")):  # fmt: skip
                pin = None
                if args.database == "postgres" and split.client:
                    cpus = split.server if args.database_cpus == "server" else split.client
                    pin = (url, cpus, args.database_cpus)
                figures = measure(args, workers, bare, gate, repeat, uncached, work, say, pin)
    report(args, plan, split, workers, client, figures)
    phases = figures.phases
    if any(p.failed for p in phases.values()):
        say("some requests failed or were answered with non-2xx: see the table")
        return 2
    return 0 if figures.ratio("gate") >= GATE_GOAL_RATIO and figures.p99_ok else 1


@dataclass(slots=True)
class Figures:
    phases: dict[str, Phase]
    #: Open-loop rates offered, by fraction of the bare endpoint's saturation.
    rates: dict[float, float]
    notes: list[str]

    def ratios(self, name: str) -> list[float]:
        """Per round: this phase's throughput over the bare endpoint's in the same round."""
        pairs = zip(self.phases[name].runs, self.phases["bare"].runs, strict=True)
        return [r.rps / b.rps if b.rps else 0.0 for r, b in pairs]

    def ratio(self, name: str) -> float:
        return statistics.median(self.ratios(name))

    @property
    def p99_ok(self) -> bool:
        return self.phases[f"gate open {LOAD_FRACTION}"].median("p99_ms") < P99_GOAL_MS


def measure(args: argparse.Namespace, workers: int, bare: Server, gate: Server,
            repeat: Sequence[str], uncached: Sequence[Sequence[str]], work: Path, say: Any,
            pin: tuple[str, Sequence[int], str] | None) -> Figures:  # fmt: skip
    phases = {name: Phase(name) for name in ("bare", "gate", "gate uncached")}
    notes: list[str] = []
    # Warm-up: connection pools, the database's page cache, and the gate's cache for the
    # repeat mix (each worker must have answered each query once; connections are spread
    # over workers by the kernel, so pass over the queries several times per worker).
    loadgen(bare.port, repeat, bare.token, work, mode="closed", duration=1.0, connections=4)
    warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
    for _ in range(max(1, workers)):
        saturate(gate.port, repeat, gate.token, warm, work)
    if pin is not None:
        notes.append(pin_database(*pin))
        say(notes[-1])
    for r in range(args.rounds):
        say(f"round {r + 1}/{args.rounds}: bare, gate (repeat mix), gate (uncached)")
        phases["bare"].runs.append(saturate(bare.port, repeat, bare.token, args, work))
        phases["gate"].runs.append(saturate(gate.port, repeat, gate.token, args, work))
        phases["gate uncached"].runs.append(
            saturate(gate.port, uncached[r], gate.token, args, work))
    rates = {f: f * phases["bare"].median("rps") for f in LOAD_SWEEP}
    for fraction, rate in rates.items():
        say(f"open loop at {rate:.0f}/s ({fraction:.0%} of the bare endpoint's saturation)")
        for _ in range(args.rounds):
            for name, server in (("bare", bare), ("gate", gate)):
                phase = phases.setdefault(f"{name} open {fraction}", Phase(name))
                phase.runs.append(loadgen(server.port, repeat, server.token, work, mode="open",
                                          duration=args.duration, connections=args.connections,
                                          rate=rate))  # fmt: skip
    rate = rates[LOAD_FRACTION]
    delivered = phases[f"bare open {LOAD_FRACTION}"].median("rps")
    if delivered < 0.95 * rate:
        notes.append(f"the load generator delivered only {delivered:.0f}/s of {rate:.0f}/s to "
                     "the bare endpoint: the client, not the server, set that limit")  # fmt: skip
    return Figures(phases, rates, notes)


def report(args: argparse.Namespace, plan: Plan, split: CpuSplit, workers: int, client: str,
           figures: Figures) -> None:  # fmt: skip
    phases = figures.phases
    print(f"gate bench: {args.database}, {plan.certificates} certificates, {plan.targets} "
          f"targets; {split.describe()}; kcert serve --workers {workers}; {client}, "
          f"{args.connections} connections; {args.rounds} rounds of {args.duration:g} s; "
          "medians over the rounds")  # fmt: skip
    rows = [(f"bare, saturated ({client})", phases["bare"]),
            (f"gate, saturated ({client})", phases["gate"]),
            ("gate uncached, saturated", phases["gate uncached"])]  # fmt: skip
    for fraction, rate in figures.rates.items():
        for name in ("bare", "gate"):
            label = f"{name}, open loop {rate:.0f}/s ({fraction:.0%})"
            rows.append((label, phases[f"{name} open {fraction}"]))
    print(f"{'':34}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for label, phase in rows:
        print(f"{label:34}{phase.median('rps'):9.0f}{phase.median('p50_ms'):9.2f}"
              f"{phase.median('p99_ms'):9.2f}{phase.failed:8d}")  # fmt: skip
    print("open loop: requests sent at a fixed rate whatever the server does, each latency "
          "counted from its scheduled time; (n%) of the bare endpoint's saturation")  # fmt: skip
    for name, label in (("gate", "gate/bare throughput"),
                        ("gate uncached", "gate uncached/bare throughput")):  # fmt: skip
        rounds = " ".join(f"{x:.2f}" for x in figures.ratios(name))
        verdict = "met" if figures.ratio(name) >= GATE_GOAL_RATIO else "MISSED"
        print(f"{label}: {figures.ratio(name):.2f} (rounds: {rounds}; goal >= "
              f"{GATE_GOAL_RATIO}): {verdict}")  # fmt: skip
    rate = figures.rates[LOAD_FRACTION]
    gate_open = phases[f"gate open {LOAD_FRACTION}"]
    bare_open = phases[f"bare open {LOAD_FRACTION}"]
    print(f"gate p99 at {LOAD_FRACTION:.0%} of bare saturation ({rate:.0f}/s offered, "
          f"{gate_open.median('rps'):.0f}/s served): {gate_open.median('p99_ms'):.2f} ms "
          f"(bare: {bare_open.median('p99_ms'):.2f} ms; goal < {P99_GOAL_MS:g} ms: "
          f"{'met' if figures.p99_ok else 'MISSED'})")  # fmt: skip
    for note in figures.notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres-url", default=os.environ.get("KCERT_TEST_POSTGRES_URL",
                                                                 PG_DEFAULT))  # fmt: skip
    parser.add_argument("--server-cpus", help="CPUs for the servers, e.g. 0 or 0-3 "
                        "(default: the first half of this process's CPUs)")  # fmt: skip
    parser.add_argument("--client-cpus", help="CPUs for the load generators (default: the rest)")
    parser.add_argument("--database-cpus", choices=["client", "server"], default="client",
                        help="PostgreSQL only: pin the database's processes with the load "
                        "generators (as on a host of its own) or with the servers")  # fmt: skip
    parser.add_argument("--workers", type=int, default=0,
                        help="uvicorn worker processes (default: one per server CPU)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each phase")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of repeat-mix load per worker before measuring")  # fmt: skip
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--certificates", type=int, default=10_000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--uncached-per-round", type=int, default=40_000,
                        help="distinct unasked queries per round for the uncached mix")  # fmt: skip
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "kcert-bench")  # fmt: skip
    parser.add_argument(
        "--stock-uvicorn",
        action="store_true",
        help="serve with the plain uvicorn CLI (with --workers 2+ it shows its TCP_NODELAY bug)",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        serve_pinned(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5])
        return 0
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration <= 0 or args.workers < 0:
        parser.error("--rounds must be at least 1, --duration positive, --workers not negative")
    try:
        return run(args)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"gate bench could not run: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
