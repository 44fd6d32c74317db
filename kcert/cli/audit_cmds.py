"""``kcert audit verify``, ``kcert audit replay N|--all`` and ``kcert audit state``.

``verify`` and ``replay`` audit a registry's log, remote or embedded;
``replay --all`` folds every entry in order and checks each decision against
the history before it (:mod:`kcert.registry.history`). ``state`` is the
operator's check on a registry's own database: its tables against what its log
folds to (:mod:`kcert.registry.consistency`); exit 0 consistent, 1 differences,
2 bad usage or an unreachable database.

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

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer

from kcert.cli.output import emit_error, emit_json, err_console, out_console
from kcert.errors import UsageError
from kcert.log.errors import LogError, LogRangeError
from kcert.log.leaf import Leaf, LeafError, parse_leaf
from kcert.log.merkle import leaf_hash
from kcert.log.monitor import AuditResult, AuditState, audit_log, state_dir_name
from kcert.log.note import Verifier, open_checkpoint
from kcert.log.proofs import verify_inclusion
from kcert.log.replay import (
    AnchorDifference,
    DecisionReplay,
    EnvelopeFetcher,
    ReplayError,
    check_candidates,
    compare_anchors,
    replay_decision,
)
from kcert.log.source import HttpLogSource, LogSource

if TYPE_CHECKING:
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
    from kcert.registry.config import Settings

    settings = Settings()
    url = registry or settings.registry
    if url:
        token = settings.token.get_secret_value() if settings.token else None
        return HttpLogSource(url, token=token), settings.home
    from sqlalchemy.engine import make_url

    from kcert.registry.audit import DatabaseLogSource
    from kcert.registry.db import engine_for

    db_url = settings.resolved_database_url()
    parsed = make_url(db_url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise UsageError(
            f"no embedded registry at {parsed.database}; name one with --registry URL "
            "or KCERT_REGISTRY, or set KCERT_HOME"
        )
    return DatabaseLogSource(engine_for(db_url), settings.home), settings.home


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
    json_out: JsonOpt = False,
) -> None:
    """Check the current checkpoint's signature, recompute its root from every entry, and
    prove it extends the given checkpoint and the last one audited."""
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
    if result.ok:
        state.save(result)
    _show_verify(result, verifier, json_out, pin_note)
    raise typer.Exit(EXIT_OK if result.ok else EXIT_FAIL)


def _show_verify(result: AuditResult, verifier: Verifier, json_out: bool, pin: str | None) -> None:
    if json_out:
        value: dict[str, Any] = result.to_json()
        value["key"] = verifier.vkey()
        value["pinned_now"] = pin is not None
        emit_json(value)
        return
    cp = result.checkpoint
    if result.ok and cp is not None:
        out_console.print(f"log {result.source}: OK, {cp.size} entries, origin {cp.origin}")
        for label in result.consistent_with:
            out_console.print(f"  extends {label}")
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
        typer.Option("--spec", help="With --rerun: the kernel's kcert.toml or source file."),
    ] = None,
    kernel: Annotated[
        str | None, typer.Option("--kernel", help="With --rerun: the [[kernel]] name.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-decide log entry N from the inputs it recorded, and show whether the same
    decision comes out (exit 0 same, 1 different). With --all, fold every entry in
    order and check each decision's recorded inputs against the log's own history."""
    if every == (index is not None):
        raise UsageError("name one entry to replay, or --all (not both)")
    if every and (rerun or spec or kernel):
        raise UsageError("--rerun, --spec and --kernel replay one entry; drop --all")
    source, home = open_source(registry)
    if index is None:
        _replay_all(source, json_out)
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
    anchors = _rerun(leaf, decision, fetch, spec, kernel) if rerun else None
    same = (
        decision.same
        and included is not False
        and all(o.status != "differs" for o in objects)
        and not anchors
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
    }
    if json_out:
        emit_json(result)
    else:
        _show_replay(result)
    raise typer.Exit(EXIT_OK if same else EXIT_FAIL)


def _all_entries(source: LogSource) -> Iterator[tuple[int, bytes]]:
    start = 0
    while True:
        try:
            batch = source.entries(start, start + MAX_ENTRIES_PAGE)
        except LogRangeError:
            return
        if not batch:
            return
        yield from batch
        start = batch[-1][0] + 1


def _envelope_fingerprints(fetch: EnvelopeFetcher) -> FingerprintOf:
    """Certificates' fingerprints over a target's own drift fields, from served envelopes."""
    from kcert.attest.certificate import inspect_envelope, parse_envelope
    from kcert.digest import canonical_json
    from kcert.errors import KcertError
    from kcert.registry.environment import fingerprint_over

    def fingerprint_of(cid: str, drift_fields: Sequence[str]) -> str | None:
        envelope = fetch(cid)
        if envelope is None:
            return None
        try:
            contents = inspect_envelope(parse_envelope(canonical_json(dict(envelope))))
        except KcertError:
            return None
        if str(contents.id) != cid:
            return None
        fields = contents.predicate.get("environment", {}).get("fields", {})
        return fingerprint_over(str(contents.fingerprint), fields, drift_fields)

    return functools.lru_cache(maxsize=4096)(fingerprint_of)


def _replay_all(source: LogSource, json_out: bool) -> NoReturn:
    from kcert.registry.history import replay_history

    try:
        result = replay_history(
            _all_entries(source), fingerprint_of=_envelope_fingerprints(_fetcher(source))
        )
    except LeafError as exc:
        emit_error(ReplayError(f"the log cannot be replayed in order: {exc}"), as_json=json_out)
        raise typer.Exit(EXIT_FAIL) from None
    if json_out:
        emit_json(
            {
                "same": result.same,
                "decisions": result.decisions,
                "differences": [d.to_json() for d in result.differences],
            }
        )
    else:
        verdict = "SAME decisions" if result.same else "DIFFERENT"
        out_console.print(
            f"log {source.label}: {result.decisions} decisions replayed in order: {verdict}",
            markup=False, soft_wrap=True,
        )  # fmt: skip
        for difference in result.differences:
            out_console.print(f"  - {difference}", markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_OK if result.same else EXIT_FAIL)


def state(
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            help="The registry's database URL (default: KCERT_DATABASE_URL, "
            "else the embedded registry in KCERT_HOME).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check that the registry's state (trusted keys, certificates and revocations, target
    fingerprints, promotions, stale marks) is exactly what its log's entries fold to, and
    name each difference (exit 0 consistent, 1 differences, 2 unreachable)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from kcert.registry.config import Settings
    from kcert.registry.consistency import LogUnexplained, check_state
    from kcert.registry.db import make_engine, read_session
    from kcert.registry.errors import RegistryUnavailable

    url = database or Settings().resolved_database_url()
    engine = make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise UsageError(f"no registry database at {parsed.database}; name one with --database")
    try:
        with read_session(engine) as session:
            result = check_state(session=session)
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


def _show_replay(result: dict[str, Any]) -> None:
    verdict = "SAME decision" if result["same"] else "DIFFERENT"
    out_console.print(f"entry {result['index']} ({result['kind']}): {verdict}", markup=False)
    allow = result["replayed"].get("allow")
    out_console.print(
        f"  replayed: {'allow' if allow else 'deny'}, certificate "
        f"{result['replayed'].get('certificate')}",
        markup=False,
    )
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
