"""``kcert audit verify`` and ``kcert audit replay N``: audit a registry's log.

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

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from kcert.cli.output import emit_error, emit_json, err_console, out_console
from kcert.errors import UsageError
from kcert.log.cosignature import CosignerKey
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

    from kcert.registry.audit import DatabaseLogSource, log_signer
    from kcert.registry.checkpoints import CheckpointGuard, witness_endpoints
    from kcert.registry.db import engine_for

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
    json_out: JsonOpt = False,
) -> None:
    """Check the current checkpoint's signature, recompute its root from every entry, and
    prove it extends the given checkpoint and the last one audited."""
    witnesses = [_witness_key(text) for text in witness or []]
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
    cosigned = _check_witnesses(result, witnesses)
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


def _check_witnesses(result: AuditResult, keys: list[CosignerKey]) -> list[dict[str, Any]]:
    """Each required witness: does the audited checkpoint carry its valid cosignature?"""
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
    index: Annotated[int, typer.Argument(help="The log entry to replay.", min=0)],
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
    decision comes out (exit 0 same, 1 different)."""
    source, home = open_source(registry)
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
                contents.predicate["certifier"].get("confinement", {}).get("module_code")),
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
    app.add_typer(audit_app)
