"""``kcert audit verify``, ``kcert audit replay N|--all`` and ``kcert audit state``.

``verify`` and ``replay`` audit a registry's log, remote or embedded;
``replay --all`` proves every leaf against the log's signed checkpoints (the
current one under the pinned key, the last one audited, the server's own file
for the embedded registry), folds every entry in order and checks each decision
against the history before it (:mod:`kcert.registry.history`). What it could
not check (no key to prove the leaves with, a fingerprint taken from an entry
because the envelope could not be read) is *unverified*: exit 1 unless
``--allow-unverified``. ``state`` is the operator's check on a registry's own
database: its leaves against the log's checkpoints and its tables against what
the leaves fold to (:mod:`kcert.registry.consistency`); exit 0 consistent, 1
differences, 2 bad usage or an unreachable database.

Key pinning: ``verify`` trusts a checkpoint only under a pinned log key, kept
per registry in ``KCERT_HOME/audit/<registry>/log.vkey``. With none pinned it
refuses (exit 2) unless the user names the key (``--key FILE``, the C2SP
verifier key the operator published; it is pinned) or explicitly accepts the
key the registry serves now (``--trust-on-first-use``; it is pinned and
printed). A ``--key`` that differs from the pinned one is refused: rotating a
log key is a deliberate act (delete the pin file). After a successful audit the
checkpoint and its leaf hashes are saved beside the pin, and the next audit
proves the log still extends them.

Exit codes: 0 all holds, 1 something differs (the first bad index is named),
2 bad input or an unreachable log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer

from kcert.cli.output import emit_error, emit_json, err_console, out_console
from kcert.errors import UsageError
from kcert.log.cosignature import CosignerKey
from kcert.log.errors import LogError, LogRangeError, NoteError, SignatureError
from kcert.log.leaf import Leaf, LeafError, parse_leaf
from kcert.log.merkle import leaf_hash
from kcert.log.monitor import AuditResult, AuditState, Finding, audit_log, state_dir_name
from kcert.log.note import Checkpoint, Verifier, open_checkpoint
from kcert.log.proofs import verify_inclusion
from kcert.log.source import HttpLogSource, LogSource
from kcert.registry.errors import ReplayError
from kcert.registry.replay import (
    MISMATCH_KIND,
    AnchorDifference,
    DecisionReplay,
    EnvelopeFetcher,
    check_candidates,
    compare_anchors,
    replay_decision,
)

if TYPE_CHECKING:
    from kcert.registry.consistency import Commitments
    from kcert.registry.history import FingerprintOf

#: Entries asked for at once when reading the whole log (a server's page limit).
MAX_ENTRIES_PAGE = 1000

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

audit_app = typer.Typer(
    name="audit",
    help="Audit a registry's log: verify its checkpoints and entries, replay its decisions.",
    no_args_is_help=True,
)

RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry", help="Registry URL (default: KCERT_REGISTRY, else the embedded one)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def open_source(registry: str | None) -> tuple[LogSource, Path]:
    """The log to audit and ``KCERT_HOME``: a remote registry, or the embedded database."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.config import Settings

    settings = Settings()
    url = registry or settings.registry
    if url:
        token = settings.token.get_secret_value() if settings.token else None
        return HttpLogSource(url, token=token), settings.home
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from sqlalchemy.engine import make_url

    from kcert.registry.audit import log_signer
    from kcert.registry.checkpoints import CheckpointGuard, witness_endpoints
    from kcert.registry.db import engine_for
    from kcert.registry.log_source import DatabaseLogSource

    db_url = settings.resolved_database_url()
    parsed = make_url(db_url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise UsageError(
            f"no embedded registry at {parsed.database}; name one with --registry URL "
            "or KCERT_REGISTRY, or set KCERT_HOME"
        )
    # The embedded registry signs its checkpoints here: through the same guard as a server,
    # and submitted to the same witnesses (KCERT_WITNESSES).
    guard = CheckpointGuard(
        settings.home, log_signer(settings.home),
        witnesses=witness_endpoints(settings.witnesses), witness_timeout=settings.witness_timeout,
    )  # fmt: skip
    return DatabaseLogSource(engine_for(db_url), settings.home, guard=guard), settings.home


def resolve_key(
    state: AuditState, source: LogSource, key: Path | None, tofu: bool
) -> tuple[Verifier, str | None]:
    """The verifier to trust, and a note when it was pinned by this run."""
    pinned = state.pinned()
    if key is not None:
        try:
            given = Verifier.from_vkey(key.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read the log key {key}: {exc.strerror}") from exc
        if pinned is not None and pinned != given:
            raise UsageError(
                f"{key} is not the log key pinned for {source.label} ({pinned.vkey()}); "
                f"if the registry really rotated its key, delete {state.key_file} and run again"
            )
        if pinned is None:
            state.pin(given)
            return given, f"pinned the log key from {key}"
        return given, None
    if pinned is not None:
        return pinned, None
    if not tofu:
        raise UsageError(
            f"no log key is pinned for {source.label}. Pass --key FILE with the verifier key "
            "its operator published, or --trust-on-first-use to pin the key it serves now"
        )
    served = Verifier.from_vkey(source.verifier_key())
    state.pin(served)
    return served, f"trusting on first use and pinning the key served now: {served.vkey()}"


def _previous(state: AuditState, checkpoint: Path | None) -> list[tuple[str, str]]:
    previous: list[tuple[str, str]] = []
    if checkpoint is not None:
        try:
            previous.append((f"checkpoint {checkpoint}", checkpoint.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the checkpoint file {checkpoint}") from exc
    last = state.last_checkpoint()
    if last is not None:
        previous.append(("the last audited checkpoint", last))
    return previous


def verify(
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="A checkpoint (signed note) the log must still extend."),
    ] = None,
    registry: RegistryOpt = None,
    key: Annotated[
        Path | None, typer.Option("--key", help="The log's C2SP verifier key file (pins it).")
    ] = None,
    trust_on_first_use: Annotated[
        bool,
        typer.Option(
            "--trust-on-first-use", help="Pin the key the log serves when none is pinned."
        ),
    ] = False,
    witness: Annotated[
        list[str] | None,
        typer.Option(
            "--witness",
            help="A witness's cosignature/v1 verifier key (or a file holding one) whose valid "
            "cosignature the checkpoint must carry; repeat to require several.",
        ),
    ] = None,
    witness_max_age: Annotated[
        int | None,
        typer.Option(
            "--witness-max-age",
            min=1,
            metavar="SECONDS",
            help="Each required witness's cosignature must be at most this old (its "
            "timestamp): an old cosigned checkpoint replayed to this auditor fails.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the current checkpoint's signature, recompute its root from every entry, and
    prove it extends the given checkpoint and the last one audited."""
    witnesses = [_witness_key(text) for text in witness or []]
    if witness_max_age is not None and not witnesses:
        raise UsageError("--witness-max-age needs at least one --witness")
    source, home = open_source(registry)
    state = AuditState(home / "audit" / state_dir_name(source.label))
    verifier, pin_note = resolve_key(state, source, key, trust_on_first_use)
    if pin_note and not json_out:
        err_console.print(f"[yellow]{pin_note}[/]", markup=True, soft_wrap=True)
    previous = _previous(state, checkpoint)
    known = state.leaf_hashes()

    def progress(done: int, total: int) -> None:
        if total >= 10_000 and (done == total or done % 50_000 < 1000):
            err_console.print(f"read {done}/{total} entries", soft_wrap=True)

    result = audit_log(
        source, verifier, previous=previous, known_leaf_hashes=known, progress=progress
    )
    cosigned = _check_witnesses(result, witnesses, witness_max_age)
    ok = result.ok and all(w["ok"] for w in cosigned)
    if ok:
        # Only a witnessed checkpoint is remembered when witnesses are required: an
        # unwitnessed one may be a view shown to this auditor alone.
        state.save(result)
    _show_verify(result, verifier, json_out, pin_note, cosigned)
    raise typer.Exit(EXIT_OK if ok else EXIT_FAIL)


def _witness_key(text: str) -> CosignerKey:
    path = Path(text)
    try:
        value = path.read_text(encoding="utf-8") if path.is_file() else text
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--witness: cannot read {path}") from exc
    try:
        return CosignerKey.from_vkey(value)
    except LogError as exc:
        raise UsageError(f"--witness: {exc}") from exc


def _check_witnesses(
    result: AuditResult, keys: list[CosignerKey], max_age: int | None = None
) -> list[dict[str, Any]]:
    """Each required witness: does the audited checkpoint carry its valid (fresh) cosignature?"""
    now = int(time.time())
    checked: list[dict[str, Any]] = []
    for key in keys:
        entry: dict[str, Any] = {"name": key.name, "vkey": key.vkey()}
        if result.note is None or result.checkpoint is None:
            entry.update(ok=False, message="no checkpoint to check")
        else:
            try:
                entry.update(ok=True, timestamp=key.verify(result.note))
            except LogError as exc:
                entry.update(ok=False, message=str(exc))
            else:
                age = now - entry["timestamp"]
                if max_age is not None and age > max_age:
                    entry.update(ok=False, message=(
                        f"the cosignature by witness {key.name!r} is {age} s old, older than "
                        f"--witness-max-age {max_age}: the checkpoint may be an old one replayed"
                    ))  # fmt: skip
        checked.append(entry)
    return checked


def _show_verify(
    result: AuditResult, verifier: Verifier, json_out: bool, pin: str | None,
    witnesses: list[dict[str, Any]],
) -> None:  # fmt: skip
    if json_out:
        value: dict[str, Any] = result.to_json()
        value["key"] = verifier.vkey()
        value["pinned_now"] = pin is not None
        value["witnesses"] = witnesses
        value["ok"] = value["ok"] and all(w["ok"] for w in witnesses)
        emit_json(value)
        return
    cp = result.checkpoint
    missing = [w for w in witnesses if not w["ok"]]
    if result.ok and cp is not None and not missing:
        out_console.print(f"log {result.source}: OK, {cp.size} entries, origin {cp.origin}")
        for label in result.consistent_with:
            out_console.print(f"  extends {label}")
        for w in witnesses:
            out_console.print(f"  cosigned by witness {w['name']} (time {w['timestamp']})",
                              markup=False)  # fmt: skip
        return
    if result.ok and cp is not None:
        out_console.print(
            f"log {result.source}: FAILED, the checkpoint of {cp.size} entries is not "
            "cosigned by every required witness", soft_wrap=True, markup=False,
        )  # fmt: skip
        for w in missing:
            out_console.print(f"  - {w['message']}", soft_wrap=True, markup=False)
        return
    bad = result.first_bad_index
    where = f"first bad index {bad}" if bad is not None else "the checkpoint does not verify"
    out_console.print(f"log {result.source}: FAILED, {where}", soft_wrap=True)
    for finding in result.findings:
        out_console.print(f"  - {finding.message}", soft_wrap=True, markup=False)


def _authenticate(state: AuditState, source: LogSource, leaf: bytes, index: int) -> bool | None:
    """Is entry ``index`` in the tree the pinned key signed? ``None`` when no key is pinned."""
    verifier = state.pinned()
    if verifier is None:
        return None
    try:
        cp = open_checkpoint(source.checkpoint(), verifier)
        proof = source.inclusion_proof(index, cp.size)
        verify_inclusion(index, cp.size, leaf_hash(leaf), proof, cp.root)
    except LogError:
        return False
    return True


def _fetcher(source: LogSource) -> EnvelopeFetcher:
    """How to get the certificates an entry names: both kinds of source can serve them."""
    fetch = getattr(source, "certificate_envelope", None)
    if fetch is None:
        return lambda cid: None
    return cast(EnvelopeFetcher, fetch)


def replay(
    index: Annotated[int | None, typer.Argument(help="The log entry to replay.", min=0)] = None,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Replay every entry in order: each decision must follow from the "
            "entries before it.",
        ),
    ] = False,
    registry: RegistryOpt = None,
    rerun: Annotated[
        bool,
        typer.Option("--rerun", help="Also re-certify the kernel on the recorded probes."),
    ] = False,
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="With --rerun, or for a runtime mismatch: the kernel's "
                     "kcert.toml or source file (a mismatch's evidence is re-checked with its "
                     "reference)."),
    ] = None,
    kernel: Annotated[
        str | None, typer.Option("--kernel", help="With --rerun: the [[kernel]] name.")
    ] = None,
    allow_unverified: Annotated[
        bool,
        typer.Option(
            "--allow-unverified",
            help="With --all: exit 0 although some inputs could not be checked (leaves not "
            "proved against a signed checkpoint, fingerprints taken from the entries "
            "because the envelopes could not be read).",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Re-decide log entry N from the inputs it recorded, and show whether the same
    decision comes out (exit 0 same, 1 different). With --all, fold every entry in
    order and check each decision's recorded inputs against the log's own history."""
    if every == (index is not None):
        raise UsageError("name one entry to replay, or --all (not both)")
    if every and (rerun or spec or kernel):
        raise UsageError("--rerun, --spec and --kernel replay one entry; drop --all")
    if allow_unverified and not every:
        raise UsageError("--allow-unverified goes with --all")
    source, home = open_source(registry)
    try:
        _replay_one(source, home, index, rerun=rerun, spec=spec, kernel=kernel,
                    json_out=json_out, allow_unverified=allow_unverified)  # fmt: skip
    finally:
        close = getattr(source, "close", None)
        if close is not None:  # an HTTP source holds a connection pool
            close()


def _replay_one(
    source: LogSource, home: Path, index: int | None, *, rerun: bool,
    spec: Path | None, kernel: str | None, json_out: bool, allow_unverified: bool,
) -> None:  # fmt: skip
    if index is None:
        _replay_all(source, home, json_out, allow_unverified)
    try:
        ((served, data),) = source.entries(index, index + 1)
    except (LogRangeError, ValueError) as exc:
        raise UsageError(f"the log has no entry {index}") from exc
    try:
        if served != index:
            raise LeafError(f"the log served entry {served} when asked for entry {index}")
        leaf = parse_leaf(index, data)
    except LeafError as exc:
        # A log that serves a damaged entry is a finding (exit 1), not bad input.
        emit_error(ReplayError(f"entry {index} cannot be replayed: {exc}"), as_json=json_out)
        raise typer.Exit(EXIT_FAIL) from None
    state = AuditState(home / "audit" / state_dir_name(source.label))
    included = _authenticate(state, source, data, index)
    decision = replay_decision(leaf)
    fetch = _fetcher(source)
    objects = check_candidates(leaf, fetch)
    recheck: dict[str, Any] | None = None
    anchors = None
    if leaf.kind == MISMATCH_KIND:
        if rerun or spec is not None:
            recheck = _recheck_mismatch(leaf, source, spec, kernel)
    elif rerun:
        anchors = _rerun(leaf, decision, fetch, spec, kernel)
    same = (
        decision.same
        and included is not False
        and all(o.status != "differs" for o in objects)
        and not anchors
        and (recheck is None or recheck["same"])
    )
    result: dict[str, Any] = {
        "index": index,
        "kind": leaf.kind,
        "same": same,
        "included": included,
        "recorded": dict(decision.recorded),
        "replayed": dict(decision.replayed),
        "differences": list(decision.differences),
        "objects": [o.to_json() for o in objects],
        "rerun": None if anchors is None else [a.to_json() for a in anchors],
        "recheck": recheck,
    }
    if json_out:
        emit_json(result)
    else:
        _show_replay(result)
    raise typer.Exit(EXIT_OK if same else EXIT_FAIL)


def _all_entries(source: LogSource, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Every entry in order (the first ``end`` when given)."""
    start = 0
    while end is None or start < end:
        stop = start + MAX_ENTRIES_PAGE if end is None else min(end, start + MAX_ENTRIES_PAGE)
        try:
            batch = source.entries(start, stop)
        except LogRangeError:
            return
        if not batch:
            return
        yield from batch
        start = batch[-1][0] + 1


def _envelope_fingerprints(fetch: EnvelopeFetcher) -> FingerprintOf:
    """Certificates' fingerprints over a target's own drift fields, from served envelopes."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.digest import canonical_json
    from kcert.registry.history import envelope_fingerprints

    def read(cid: str) -> bytes | None:
        envelope = fetch(cid)
        return None if envelope is None else canonical_json(dict(envelope))

    return envelope_fingerprints(read)


class _ProvedLog:
    """The leaves ``replay --all`` folds, hashed as they pass, then proved."""

    def __init__(self, source: LogSource, home: Path) -> None:
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.log.merkle import MemoryTree

        self.source = source
        self.home = home
        self.state = AuditState(home / "audit" / state_dir_name(source.label))
        self.tree = MemoryTree()
        self.findings: list[Finding] = []
        self.proved: list[str] = []
        #: Why the leaves are not proved at all, when they are not.
        self.unproved: str | None = None
        self.checkpoint: Checkpoint | None = None
        self._verifier = self._key()
        if self._verifier is None:
            self.unproved = (
                f"the leaves were not proved against a signed checkpoint: no log key is pinned "
                f"for {source.label} (run kcert audit verify with --key FILE or "
                "--trust-on-first-use)"
            )
            return
        try:
            self.checkpoint = open_checkpoint(source.checkpoint(), self._verifier)
        except (SignatureError, NoteError) as exc:
            self.findings.append(Finding(None, f"the log's current checkpoint: {exc}"))

    def _key(self) -> Verifier | None:
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.registry.audit import LOG_KEY_FILE
        from kcert.registry.log_source import DatabaseLogSource

        pinned = self.state.pinned()
        if pinned is not None or not isinstance(self.source, DatabaseLogSource):
            return pinned
        key_file = self.home / LOG_KEY_FILE  # the embedded registry: its own log key
        if not key_file.exists():
            return None
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.log.note import load_or_create_signer

        return load_or_create_signer(key_file).verifier

    def entries(self) -> Iterator[tuple[int, bytes]]:
        end = self.checkpoint.size if self.checkpoint is not None else None
        for index, leaf in _all_entries(self.source, end):
            self.tree.append(leaf_hash(leaf))
            yield index, leaf

    def prove(self) -> None:
        """Hold the leaves read against the current checkpoint and every earlier one known."""
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.log.monitor import prove_leaves
        from kcert.registry.log_source import DatabaseLogSource

        if self.checkpoint is None or self._verifier is None:
            return
        checkpoints = [("the log's signed checkpoint", self.checkpoint)]
        notes = _server_checkpoint(self.home) if isinstance(self.source, DatabaseLogSource) else []
        last = self.state.last_checkpoint()
        if last is not None:
            notes.append(("the last audited checkpoint", last))
        for label, text in notes:
            try:
                checkpoints.append((label, open_checkpoint(text, self._verifier)))
            except (SignatureError, NoteError) as exc:
                self.findings.append(Finding(None, f"{label}: {exc}"))
        for label, checkpoint in checkpoints:
            found = prove_leaves(self.tree, [(label, checkpoint)], self.source)
            self.findings.extend(found)
            if not found:
                self.proved.append(f"{label} (size {checkpoint.size})")
        known = self.state.leaf_hashes()
        for position, hashed in enumerate(known[: self.tree.size]):
            if self.tree.leaf_hash_at(position) != hashed:
                self.findings.append(
                    Finding(position, f"entry {position} changed since the last audit")
                )
                break


def _replay_all(source: LogSource, home: Path, json_out: bool, allow_unverified: bool) -> NoReturn:
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.history import replay_history

    log = _ProvedLog(source, home)
    try:
        result = replay_history(
            log.entries(), fingerprint_of=_envelope_fingerprints(_fetcher(source))
        )
    except LeafError as exc:
        emit_error(ReplayError(f"the log cannot be replayed in order: {exc}"), as_json=json_out)
        raise typer.Exit(EXIT_FAIL) from None
    log.prove()
    unverified = [d.to_json() for d in result.unverified]
    if log.unproved is not None:
        unverified.insert(0, {"index": None, "kind": "log", "message": log.unproved})
    same = result.same and not log.findings
    ok = same and (allow_unverified or not unverified)
    if json_out:
        emit_json(
            {
                "same": same,
                "decisions": result.decisions,
                "differences": [d.to_json() for d in result.differences],
                "log": [f.to_json() for f in log.findings],
                "proved_against": log.proved,
                "unverified": unverified,
            }
        )
    else:
        verdict = "SAME decisions" if same else "DIFFERENT"
        if same and unverified:
            verdict += f" as far as checked, {len(unverified)} unverified"
        out_console.print(
            f"log {source.label}: {result.decisions} decisions replayed in order: {verdict}",
            markup=False, soft_wrap=True,
        )  # fmt: skip
        for label in log.proved:
            out_console.print(f"  leaves proved against {label}", markup=False, soft_wrap=True)
        for finding in log.findings:
            out_console.print(f"  - log: {finding.message}", markup=False, soft_wrap=True)
        for difference in result.differences:
            out_console.print(f"  - {difference}", markup=False, soft_wrap=True)
        for item in unverified:
            where = "" if item["index"] is None else f"entry {item['index']} ({item['kind']}): "
            out_console.print(
                f"  - unverified: {where}{item['message']}", markup=False, soft_wrap=True
            )
        if unverified and not allow_unverified:
            out_console.print(
                "  unverified inputs fail the replay; --allow-unverified accepts them",
                markup=False, soft_wrap=True,
            )  # fmt: skip
    raise typer.Exit(EXIT_OK if ok else EXIT_FAIL)


def _read_note(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}") from exc


def _server_checkpoint(home: Path) -> list[tuple[str, str]]:
    """The server's last signed checkpoint (``KCERT_HOME/log-checkpoint``), when there is one."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.checkpoints import CHECKPOINT_FILE

    path = home / CHECKPOINT_FILE
    if not path.exists():
        return []
    return [(f"the server's last signed checkpoint ({path})", _read_note(path, "the checkpoint"))]


def _state_commitments(home: Path, label: str, checkpoint: Path | None) -> Commitments | None:
    """What ``audit state`` proves the leaves against: the log key in ``home`` signs the
    current tree; the server's last checkpoint, the last one audited and ``checkpoint``
    must be extended. ``None`` when there is no log key to open them with."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.audit import LOG_KEY_FILE
    from kcert.registry.consistency import Commitments

    state = AuditState(home / "audit" / state_dir_name(label))
    notes = _server_checkpoint(home)
    last = state.last_checkpoint()
    if last is not None:
        notes.append(("the last audited checkpoint", last))
    if checkpoint is not None:
        notes.append((f"checkpoint {checkpoint}", _read_note(checkpoint, "the checkpoint file")))
    key_file = home / LOG_KEY_FILE
    if key_file.exists():
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.log.note import load_or_create_signer

        signer = load_or_create_signer(key_file)  # it exists: loaded, never made here
        return Commitments(signer.verifier, signer, notes)
    pinned = state.pinned()
    if pinned is None:
        if notes:
            raise UsageError(
                f"no log key in {home} and none pinned to open {notes[0][0]} with; "
                "run kcert audit verify first, or point KCERT_HOME at the server's home"
            )
        return None
    return Commitments(pinned, None, notes)


def state(
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            help="The registry's database URL (default: KCERT_DATABASE_URL, "
            "else the embedded registry in KCERT_HOME).",
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint", help="A checkpoint (signed note) the log's leaves must still extend."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Prove every leaf of the registry's log against its signed checkpoints, then check
    that the registry's state (trusted keys, certificates and revocations, target
    fingerprints, promotions, stale marks, API tokens) is exactly what those leaves fold
    to, and name each difference (exit 0 consistent, 1 differences, 2 unreachable)."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from kcert.registry.config import Settings
    from kcert.registry.consistency import check_state
    from kcert.registry.db import make_engine, read_session
    from kcert.registry.errors import LogUnexplained, RegistryUnavailable

    settings = Settings()
    url = database or settings.resolved_database_url()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise UsageError(f"no registry database at {parsed.database}; name one with --database")
    engine = make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    try:
        commitments = _state_commitments(settings.home, f"embedded registry {shown}", checkpoint)
        with read_session(engine) as session:
            result = check_state(session=session, commitments=commitments)
    except LogUnexplained as exc:
        emit_error(exc, as_json=json_out)
        raise typer.Exit(EXIT_FAIL) from None
    except SQLAlchemyError as exc:
        raise RegistryUnavailable(
            f"cannot read the registry database {shown}: {exc.__class__.__name__}"
        ) from exc
    finally:
        engine.dispose()
    if json_out:
        emit_json({"database": shown, **result.to_json()})
    else:
        count = len(result.differences)
        verdict = "consistent" if not count else f"{count} difference{'s' * (count != 1)}"
        out_console.print(
            f"registry {shown}: {result.entries} entries folded, state {verdict}",
            markup=False, soft_wrap=True,
        )  # fmt: skip
        for label in result.proved_against:
            out_console.print(f"  leaves proved against {label}", markup=False, soft_wrap=True)
        if commitments is None or commitments.signer is None:
            out_console.print(
                "  note: no log key in KCERT_HOME; the leaves were held against the tree the "
                "database's own nodes store, not a signed checkpoint",
                markup=False, soft_wrap=True,
            )  # fmt: skip
        for difference in result.differences:
            out_console.print(
                f"  - {difference.kind}: {difference.message}", markup=False, soft_wrap=True
            )
    raise typer.Exit(EXIT_OK if result.consistent else EXIT_FAIL)


def _rerun(
    leaf: Leaf, decision: DecisionReplay, fetch: EnvelopeFetcher, spec: Path | None,
    kernel_name: str | None,
) -> list[AnchorDifference]:  # fmt: skip
    """Certify the kernel again on the recorded probes; every anchor that moved."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.attest.certificate import inspect_envelope, parse_envelope
    from kcert.certify.environment import gpu_status
    from kcert.certify.pipeline import CertifyOptions, certify
    from kcert.certify.spec import resolve_kernel
    from kcert.digest import canonical_json

    recorded = decision.recorded.get("certificate")
    candidates = leaf.payload.get("inputs", {}).get("candidates", [])
    cid = recorded or (candidates[0]["id"] if candidates else None)
    if not cid:
        raise UsageError(f"entry {leaf.index} names no certificate to re-run")
    envelope = fetch(str(cid))
    if envelope is None:
        raise UsageError(f"the registry did not serve certificate {cid} (set KCERT_TOKEN?)")
    contents = inspect_envelope(parse_envelope(canonical_json(dict(envelope))))
    if contents.executor != "triton-interpreter":
        has_gpu, why = gpu_status()
        if not has_gpu:
            raise UsageError(
                f"--rerun needs a GPU: certificate {cid} ran on {contents.hw_class} "
                f"({contents.executor}), and {why}"
            )
    if spec is None:
        raise UsageError("--rerun needs --spec PATH: the kernel's kcert.toml or source file")
    kernel = resolve_kernel(spec, kernel_name)
    if kernel.code.digest != contents.source_digest:
        raise UsageError(
            f"{kernel.source} is not the certified source (certificate {cid} names "
            f"{contents.source_digest})"
        )
    probes = contents.predicate["probes"]
    err_console.print(f"re-certifying {kernel.name} on the recorded probes", soft_wrap=True)
    report = certify(
        kernel,
        CertifyOptions(
            executor=contents.executor,
            hw=None if contents.hw_class == "cpu" else contents.hw_class,
            fresh_seed=int(probes["fresh_seed"]),
            minimize=False,
            timing=False,
            # always sandboxed; module code only where the certificate says it was allowed
            allow_module_code=bool(
                contents.predicate["certifier"].get("confinement", {}).get("module_code")
            ),
        ),  # fmt: skip
        progress=lambda text: err_console.print(text, soft_wrap=True, markup=False),
    )
    return compare_anchors(probes["items"], [p.to_json() for p in report.probes])


def _recheck_mismatch(
    leaf: Leaf, source: LogSource, spec: Path | None, kernel_name: str | None
) -> dict[str, Any]:
    """Run the spec's reference on a mismatch's evidence, fetched and held against the leaf."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.certify.spec import resolve_kernel
    from kcert.registry.evidence import recheck, served_arrays

    if spec is None:
        raise UsageError("re-checking a mismatch needs --spec PATH: the kernel's kcert.toml")
    mismatch = leaf.payload.get("mismatch")
    if not isinstance(mismatch, dict) or not isinstance(mismatch.get("evidence"), dict):
        return {"same": True, "reproduced": None,
                "notes": ["the mismatch came without evidence: nothing to re-check"]}  # fmt: skip
    fetch = getattr(source, "mismatch_evidence", None)
    served = fetch(int(leaf.payload["mismatch_id"])) if fetch is not None else None
    if served is None:
        raise UsageError(f"the registry did not serve the evidence of entry {leaf.index} "
                         "(set KCERT_TOKEN to a token with gate:read)")  # fmt: skip
    arrays, notes = served_arrays(served, mismatch["evidence"])
    outputs = None
    if isinstance(mismatch.get("outputs_evidence"), dict):
        # Held against the manifest the leaf logged, like the inputs.
        outputs, more = served_arrays(served, mismatch["outputs_evidence"], key="outputs")
        notes += more
    kernel = resolve_kernel(spec, kernel_name)
    if str(kernel.code.digest) != leaf.payload.get("kernel"):
        raise UsageError(f"{kernel.source} is not the kernel of entry {leaf.index} "
                         f"({leaf.payload.get('kernel')})")  # fmt: skip
    result = recheck(kernel, mismatch, arrays, outputs)
    return {"same": not notes and result.reproduced is not False and result.same_error
            is not False, **result.to_json(), "notes": [*notes, *result.notes]}  # fmt: skip


def _show_replay(result: dict[str, Any]) -> None:
    verdict = "SAME decision" if result["same"] else "DIFFERENT"
    out_console.print(f"entry {result['index']} ({result['kind']}): {verdict}", markup=False)
    if result["kind"] == MISMATCH_KIND:
        action = "suspend" if result["replayed"].get("suspend") else "record"
        out_console.print(f"  replayed: {action}", markup=False)
        for reason in result["replayed"].get("reasons", []):
            out_console.print(f"    {reason}", markup=False, soft_wrap=True)
    else:
        allow = result["replayed"].get("allow")
        certificate = result["replayed"].get("certificate")
        out_console.print(
            f"  replayed: {'allow' if allow else 'deny'}, "
            + (f"certificate {certificate}" if certificate else "no certificate"),
            markup=False,
        )
    check = result.get("recheck")
    if check is not None:
        state = {True: "the mismatch is reproduced", False: "NOT reproduced",
                 None: "not decided"}[check["reproduced"]]  # fmt: skip
        out_console.print(f"  re-check on the evidence: {state}", markup=False)
        for note in check["notes"]:
            out_console.print(f"    {note}", markup=False, soft_wrap=True)
    if result["included"] is None:
        out_console.print("  not authenticated: no log key is pinned (run kcert audit verify)")
    elif result["included"] is False:
        out_console.print("  NOT in the tree signed by the pinned log key")
    for line in result["differences"]:
        out_console.print(f"  - {line}", markup=False, soft_wrap=True)
    for obj in result["objects"]:
        notes = "; ".join(obj["notes"])
        out_console.print(
            f"  certificate {obj['certificate']}: {obj['status']}"
            + (f" ({notes})" if notes else ""),
            markup=False,
            soft_wrap=True,
        )
    for diff in result["rerun"] or []:
        out_console.print(
            f"  probe {diff['probe']} {diff['role']} {diff['name']}: {diff['cause']}",
            markup=False, soft_wrap=True,
        )  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add this module's commands to app."""
    audit_app.command("verify")(verify)
    audit_app.command("replay")(replay)
    audit_app.command("state")(state)
    app.add_typer(audit_app)
