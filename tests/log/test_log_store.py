"""The log in a registry database: appends, proofs, their cost, and a total order."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest
from log_db import apply_log_migration
from sqlalchemy import Engine, event, text

from kcert.log import merkle
from kcert.log.errors import LogError, LogRangeError
from kcert.log.leaf import parse_leaf
from kcert.log.merkle import CompactRange, MemoryTree
from kcert.log.note import open_checkpoint
from kcert.log.proofs import verify_consistency, verify_inclusion
from kcert.registry import audit
from kcert.registry.db import make_engine, read_session, write_session


def _append(engine: Engine, n: int, *, batch: int = 1, kind: str = "key.trusted") -> None:
    done = 0
    while done < n:
        k = min(batch, n - done)
        with write_session(engine) as session:
            audit.record_events(session, [(kind, {"i": done + j}) for j in range(k)])
            session.commit()
        done += k


def _memory_tree(engine: Engine) -> tuple[MemoryTree, list[bytes]]:
    with read_session(engine) as session:
        size = audit.log_size(session)
        leaves: list[bytes] = []
        while len(leaves) < size:
            leaves += [r.leaf for r in audit.read_entries(session, len(leaves), size)]
    tree = MemoryTree()
    for position, leaf in enumerate(leaves):
        parse_leaf(position, leaf)
        tree.append(merkle.leaf_hash(leaf))
    return tree, leaves


def test_record_event_writes_a_leaf_and_returns_its_index(sqlite_engine: Engine) -> None:
    with write_session(sqlite_engine) as session:
        assert audit.record_event(session, "key.trusted", {"keyid": "a"}) == 0
        assert audit.record_event(session, "key.revoked", {"keyid": "a", "reason": "x"}) == 1
        session.commit()
    with read_session(sqlite_engine) as session:
        entries = audit.read_entries(session, 0, 10)
    leaf = parse_leaf(1, entries[1].leaf)
    assert (leaf.kind, dict(leaf.payload)) == ("key.revoked", {"keyid": "a", "reason": "x"})


def test_a_rolled_back_change_leaves_no_leaf(sqlite_engine: Engine) -> None:
    with write_session(sqlite_engine) as session:
        audit.record_event(session, "key.trusted", {"keyid": "a"})
        session.rollback()
    with write_session(sqlite_engine) as session:
        assert audit.record_event(session, "key.trusted", {"keyid": "b"}) == 0
        session.commit()
    with read_session(sqlite_engine) as session:
        assert audit.log_size(session) == 1


def test_bad_events_are_refused(sqlite_engine: Engine) -> None:
    with write_session(sqlite_engine) as session:
        with pytest.raises(ValueError):
            audit.record_event(session, "Not A Kind", {})
        with pytest.raises(TypeError):
            audit.record_event(session, "key.trusted", ["not", "an", "object"])  # type: ignore[arg-type]


def test_proofs_and_checkpoints_from_the_database_verify(
    sqlite_engine: Engine, tmp_path: object
) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    _append(sqlite_engine, 23, batch=1)
    _append(sqlite_engine, 50, batch=9)
    tree, leaves = _memory_tree(sqlite_engine)
    signer = audit.log_signer(tmp_path)
    with read_session(sqlite_engine) as session:
        cp = open_checkpoint(audit.signed_checkpoint(session, signer), signer.verifier)
        assert (cp.size, cp.root) == (73, tree.root())
        for size in (1, 2, 23, 24, 64, 73):
            root = tree.root(size)
            assert audit.root_hash(session, size) == root
            for index in range(0, size, 5):
                proof = audit.inclusion_proof(session, index, size)
                verify_inclusion(index, size, merkle.leaf_hash(leaves[index]), proof, root)
            for first in range(1, size + 1, 4):
                proof = audit.consistency_proof(session, first, size)
                verify_consistency(first, size, tree.root(first), root, proof)


def test_bad_ranges_are_range_errors(sqlite_engine: Engine) -> None:
    _append(sqlite_engine, 5)
    with read_session(sqlite_engine) as session:
        for start, end in ((-1, 3), (3, 3), (5, 9), (4, 2)):
            with pytest.raises(LogRangeError):
                audit.read_entries(session, start, end)
        assert [r.index for r in audit.read_entries(session, 3, 99)] == [3, 4]
        for index, size in ((0, 6), (5, 5), (-1, 5), (0, 0)):
            with pytest.raises(LogRangeError):
                audit.inclusion_proof(session, index, size)
        for first, second in ((0, 5), (3, 6), (4, 3)):
            with pytest.raises(LogRangeError):
                audit.consistency_proof(session, first, second)


def test_entries_are_paged(sqlite_engine: Engine) -> None:
    _append(sqlite_engine, audit.MAX_ENTRIES_PAGE + 10, batch=500)
    with read_session(sqlite_engine) as session:
        page = audit.read_entries(session, 5, 10**9)
    assert len(page) == audit.MAX_ENTRIES_PAGE and page[0].index == 5


@pytest.fixture
def statements(sqlite_engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(sqlite_engine, "before_cursor_execute", count)
    yield seen
    event.remove(sqlite_engine, "before_cursor_execute", count)


def test_an_append_costs_a_constant_number_of_statements(
    sqlite_engine: Engine, statements: list[str]
) -> None:
    costs = []
    for target in (2, 100, 1000, 3000):
        with write_session(sqlite_engine) as session:
            have = audit.log_size(session)
            if target - 1 > have:
                audit.record_events(
                    session, [("key.trusted", {"i": i}) for i in range(target - 1 - have)]
                )
            session.commit()
        statements.clear()
        with write_session(sqlite_engine) as session:
            audit.record_event(session, "key.trusted", {"i": target})
            session.commit()
        costs.append(len([s for s in statements if not s.startswith(("BEGIN", "COMMIT"))]))
    # UPDATE ... RETURNING, one SELECT of the right edge, two INSERTs: whatever the size.
    assert costs == [4, 4, 4, 4]
    # And the right edge it reads is one node per set bit of the size.
    assert max(len(CompactRange.edge_keys(n)) for n in range(1, 1 << 12)) == 12


def test_a_proof_reads_logarithmically_many_nodes(sqlite_engine: Engine) -> None:
    _append(sqlite_engine, 3000, batch=1000)
    with read_session(sqlite_engine) as session:
        worst_nodes, worst_queries = 0, 0
        for size in (1000, 2047, 2048, 3000):
            for index in range(0, size, 37):
                store = audit.NodeStore(session.connection())
                merkle.inclusion_proof(index, size, store)
                merkle.consistency_proof(index + 1, size, store)
                worst_nodes = max(worst_nodes, store.reads)
                worst_queries = max(worst_queries, store.queries)
    depth = (3000).bit_length()
    assert worst_queries == 2  # one query per proof
    assert worst_nodes <= 2 * (2 * depth + 1)


def test_a_missing_node_is_reported_as_damage(sqlite_engine: Engine) -> None:
    _append(sqlite_engine, 8)
    with sqlite_engine.begin() as conn:
        conn.execute(text("DELETE FROM log_node WHERE level = 3"))
    with read_session(sqlite_engine) as session, pytest.raises(LogError, match="damaged"):
        audit.root_hash(session)


def test_migration_downgrades_cleanly(sqlite_engine: Engine) -> None:
    apply_log_migration(sqlite_engine, "downgrade")
    with sqlite_engine.connect() as conn:
        names = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master"))}
    assert not {"log_state", "log_entry", "log_node"} & names


def test_sqlite_threads_append_in_a_total_order(sqlite_engine: Engine) -> None:
    _concurrent_threads(sqlite_engine, threads=4, each=15)


def _concurrent_threads(engine: Engine, *, threads: int, each: int) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(each):
                with write_session(engine) as session:
                    audit.record_event(session, "key.trusted", {"worker": worker, "i": i})
                    session.commit()
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    _assert_total_order(engine, threads * each)


def _assert_total_order(engine: Engine, expected: int) -> None:
    tree, leaves = _memory_tree(engine)  # parses every leaf: index == position
    assert tree.size == expected
    with read_session(engine) as session:
        assert audit.root_hash(session) == tree.root()
    payloads = {(parse_leaf(i, leaf).payload["worker"], parse_leaf(i, leaf).payload["i"])
                for i, leaf in enumerate(leaves)}  # fmt: skip
    assert len(payloads) == expected


def _process_worker(url: str, worker: int, each: int) -> None:
    engine = make_engine(url)
    try:
        for i in range(each):
            with write_session(engine) as session:
                audit.record_event(session, "key.trusted", {"worker": worker, "i": i})
                session.commit()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_threads_append_in_a_total_order(postgres_engine: Engine) -> None:
    _concurrent_threads(postgres_engine, threads=6, each=20)


@pytest.mark.postgres
def test_postgres_processes_append_in_a_total_order(postgres_engine: Engine) -> None:
    url = postgres_engine.url.render_as_string(hide_password=False)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_worker, args=(url, w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    _assert_total_order(postgres_engine, 45)


@pytest.mark.postgres
def test_postgres_proofs_verify(postgres_engine: Engine) -> None:
    _append(postgres_engine, 40, batch=7)
    tree, leaves = _memory_tree(postgres_engine)
    with read_session(postgres_engine) as session:
        for size in (1, 17, 40):
            root = audit.root_hash(session, size)
            assert root == tree.root(size)
            for index in range(size):
                proof = audit.inclusion_proof(session, index, size)
                verify_inclusion(index, size, merkle.leaf_hash(leaves[index]), proof, root)
            for first in range(1, size + 1):
                proof = audit.consistency_proof(session, first, size)
                verify_consistency(first, size, tree.root(first), root, proof)
