"""Benchmark of the audit log: appends per second and proof times at 1,000,000 entries.

Builds the log in a SQLite registry database in a temporary folder through the
registry's own code (``kcert.registry.audit.record_events``, batched inside
transactions), and, in the same run, a *baseline*: the same leaf bytes written
to a plain append-only table with no tree. Batches alternate between the two,
so both see the same machine load, and the figure that matters is their ratio.

Then it times random RFC 9162 inclusion and consistency proofs served from the
database (median and p99 over many), checks each one verifies, and counts the
tree nodes each proof read.

    python bench/log.py                  # 1,000,000 entries
    python bench/log.py --entries 100000 --proofs 500
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import BigInteger, Column, Engine, Integer, LargeBinary, MetaData, Table, insert

from kcert.log import merkle
from kcert.log.leaf import build_leaf
from kcert.log.proofs import verify_consistency, verify_inclusion
from kcert.registry import audit
from kcert.registry.db import make_engine, migrate, read_session, write_session

KIND = "certificate.stored"


def payload(i: int) -> dict[str, object]:
    """A payload shaped like a real certificate.stored event."""
    return {
        "certificate": f"sha256:{i:064x}",
        "keyid": "9f" * 32,
        "kernel_name": "saxpy",
        "subjects": [f"sha256:{i * 7:064x}"],
        "verdict": "pass",
        "hw_class": "H100",
        "fingerprint": "sha256:" + "ab" * 32,
    }


class Plain:
    """The baseline: an append-only table of the same leaf bytes, with no tree."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = Table(
            "plain_leaf", MetaData(),
            # INTEGER PRIMARY KEY on SQLite: the rowid itself, the cheapest table there is.
            Column("leaf_index", BigInteger().with_variant(Integer(), "sqlite"),
                   primary_key=True, autoincrement=False),
            Column("leaf", LargeBinary, nullable=False),
        )  # fmt: skip
        self.table.create(engine)
        self.size = 0

    def append(self, count: int) -> None:
        """The same leaves as the log's, built the same way (canonical JSON with their index)."""
        now = datetime.now(UTC)
        first = self.size
        rows = [
            {"leaf_index": first + j,
             "leaf": build_leaf(index=first + j, kind=KIND, payload=payload(first + j), time=now)}
            for j in range(count)
        ]  # fmt: skip
        with self.engine.begin() as conn:
            conn.execute(insert(self.table), rows)
        self.size += count


def append_tree(engine: Engine, first: int, count: int) -> None:
    with write_session(engine) as session:
        audit.record_events(session, [(KIND, payload(first + j)) for j in range(count)])
        session.commit()


def build_both(engine: Engine, plain: Plain, total: int, batch: int) -> tuple[float, float]:
    """Alternate a batch into the log and the same batch into the baseline, so that both
    see the same machine load; return the seconds each took in all."""
    tree_s = base_s = 0.0
    seg_tree = seg_base = 0.0
    done = 0
    segment = batch * 10
    while done < total:
        k = min(batch, total - done)
        t0 = time.perf_counter()
        append_tree(engine, done, k)
        t1 = time.perf_counter()
        plain.append(k)
        t2 = time.perf_counter()
        tree_s, base_s = tree_s + (t1 - t0), base_s + (t2 - t1)
        seg_tree, seg_base = seg_tree + (t1 - t0), seg_base + (t2 - t1)
        done += k
        if done % segment == 0 or done == total:
            size = done % segment or segment
            sys.stderr.write(
                f"{done:>9,}/{total:,} entries; last {size:,}: log {size / seg_tree:8,.0f}/s, "
                f"baseline {size / seg_base:8,.0f}/s\n"
            )
            sys.stderr.flush()
            seg_tree = seg_base = 0.0
    return tree_s, base_s


def single_appends(engine: Engine, count: int) -> float:
    """``count`` appends, one transaction each (what a registry write does); seconds."""
    started = time.perf_counter()
    for i in range(count):
        with write_session(engine) as session:
            audit.record_event(session, KIND, payload(10**9 + i))
            session.commit()
    return time.perf_counter() - started


def timed(samples: int, one: Callable[[random.Random], int]) -> tuple[list[float], list[int]]:
    rng = random.Random(6962)
    times: list[float] = []
    reads: list[int] = []
    for _ in range(samples):
        start = time.perf_counter()
        reads.append(one(rng))
        times.append(time.perf_counter() - start)
    return times, reads


def report_times(label: str, times: list[float], reads: list[int]) -> None:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"{label:<22} median {statistics.median(ms):7.3f} ms   p99 {p99:7.3f} ms   "
        f"nodes read: mean {statistics.mean(reads):5.1f}, max {max(reads)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--proofs", type=int, default=2_000)
    parser.add_argument("--singles", type=int, default=1_000)
    args = parser.parse_args(argv)
    n = args.entries

    with tempfile.TemporaryDirectory(prefix="kcert-bench-log-") as tmp:
        home = Path(tmp)
        engine = make_engine(f"sqlite:///{home / 'registry.db'}")
        migrate(engine)
        base_engine = make_engine(f"sqlite:///{home / 'baseline.db'}")

        tree_s, base_s = build_both(engine, Plain(base_engine), n, args.batch)
        single_s = single_appends(engine, args.singles)
        size = n + args.singles

        signer = audit.log_signer(home)
        with read_session(engine) as session:
            t0 = time.perf_counter()
            note = audit.signed_checkpoint(session, signer)
            checkpoint_ms = (time.perf_counter() - t0) * 1000
            root = audit.root_hash(session, size)
            conn = session.connection()

            def inclusion(rng: random.Random) -> int:
                index = rng.randrange(size)
                store = audit.NodeStore(conn)
                proof = merkle.inclusion_proof(index, size, store)
                leaf = audit.read_entries(session, index, index + 1)[0].leaf
                verify_inclusion(index, size, merkle.leaf_hash(leaf), proof, root)
                return store.reads

            def consistency(rng: random.Random) -> int:
                first = rng.randrange(1, size)
                store = audit.NodeStore(conn)
                proof = merkle.consistency_proof(first, size, store)
                verify_consistency(first, size, merkle.root(first, store), root, proof)
                return store.reads

            inc_times, inc_reads = timed(args.proofs, inclusion)
            con_times, con_reads = timed(args.proofs, consistency)
        db_mb = (home / "registry.db").stat().st_size / 2**20
        engine.dispose()
        base_engine.dispose()

    print(f"audit log benchmark: {n:,} entries in SQLite (batches of {args.batch:,})")
    print(f"appends, batched        {n / tree_s:10,.0f} /s   ({tree_s:6.1f} s)")
    print(f"baseline, no tree       {n / base_s:10,.0f} /s   ({base_s:6.1f} s)")
    print(f"ratio log / baseline    {base_s / tree_s:10.2f}   (appends/s with the tree ÷ without)")
    print(f"appends, one per transaction at {n:,}: {args.singles / single_s:,.0f} /s")
    print(f"checkpoint (root + sign) at {size:,}: {checkpoint_ms:.2f} ms")
    print(f"database size: {db_mb:,.0f} MiB; checkpoint size line: {note.splitlines()[1]}")
    report_times("inclusion proof", inc_times, inc_reads)
    report_times("consistency proof", con_times, con_reads)
    print("(proof times include serving from the database and verifying; each verified)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
