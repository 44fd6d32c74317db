"""Registry commands: serve, push, gate, promote, target report, revoke, keys trust/revoke,
token create/revoke.

Each command parses its options, opens a registry (``--registry URL`` or
``KCERT_REGISTRY`` for a server, with ``KCERT_TOKEN``; otherwise the embedded
SQLite registry in ``KCERT_HOME``), calls one method and prints the answer.
Exit codes: 0 stored / allowed / granted, 1 denied or an invalid certificate,
2 bad input or an unreachable registry.

The request models (:mod:`kcert.registry.models`, SQLModel) are imported by the
commands that send them: ``gate`` against a server loads no database code. Nor
certificate code (``push`` and ``keys trust`` import it), nor pydantic-settings
(the server's address and token are read by :mod:`kcert.registry.envvars`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError

from kcert.cli.app import EXIT_FAIL
from kcert.cli.groups import keys_app
from kcert.cli.output import emit_json, err_console, out_console
from kcert.digest import Digest, DigestError
from kcert.errors import UsageError
from kcert.registry.envvars import env_name
from kcert.registry.errors import CertificateRejected, PromotionDenied
from kcert.registry.wire import Scope

if TYPE_CHECKING:
    from kcert.registry.remote import Registry

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry", envvar=env_name("registry"), show_envvar=True,
        help="Registry server URL (token from KCERT_TOKEN); none = the embedded registry.",
    ),
]  # fmt: skip
KernelOption = Annotated[str, typer.Option("--kernel", help="Kernel source digest (sha256:...).")]
TargetOption = Annotated[str, typer.Option("--target", help="Target (fleet) name.")]
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")
_TOKEN_ID = re.compile(r"^tok_[0-9a-f]{1,28}$")

target_app = typer.Typer(name="target", help="Targets (fleets) and their environments.",
                         no_args_is_help=True)  # fmt: skip
token_app = typer.Typer(name="token", help="API tokens of a registry.", no_args_is_help=True)


@contextmanager
def _registry(url: str | None) -> Iterator[Registry]:
    # lazy: httpx (a remote registry's client) costs a quarter of a second to import, which
    # `--help` and every usage error would pay
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.remote import open_registry

    registry = open_registry(url=url)
    try:
        yield registry
    finally:
        registry.close()


def _dump(model: BaseModel) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


def _kernel(text: str) -> Digest:
    try:
        return Digest.parse(text)
    except DigestError as exc:
        raise UsageError(f"--kernel: {exc}") from exc


def serve_command(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8700,
    workers: Annotated[
        int, typer.Option("--workers", min=1, max=256, help="Worker processes (one per CPU is "
                          "a good start).")
    ] = 1,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log",
                           help="Log every request (off: the audit log records every change).")
    ] = False,
) -> None:  # fmt: skip
    """Run the registry API (database KCERT_DATABASE_URL, first admin token KCERT_ADMIN_TOKEN)."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.api.serve import serve
    from kcert.registry.config import Settings
    from kcert.registry.db import dispose_engines, engine_for, migrate

    settings = Settings()
    if settings.admin_token is None:
        err_console.print(
            "warning: KCERT_ADMIN_TOKEN is not set; only tokens already in the database work"
        )
    # Migrate once here, before any worker starts: a bad URL or an unreachable database is
    # a clear error now instead of a traceback in every worker, and workers never race on it.
    migrate(engine_for(settings.resolved_database_url()))
    dispose_engines()
    err_console.print(f"kcert registry on http://{host}:{port} with {workers} worker(s) "
                      "(OpenAPI at /openapi.json)")  # fmt: skip
    serve(host=host, port=port, workers=workers, access_log=access_log, log_level="info")


def push_command(
    cert: Annotated[Path, typer.Argument(help="Certificate file (DSSE envelope).")],
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store a certificate in the registry (it must verify against a trusted key)."""
    # lazy: certificate code (cryptography, the predicate's schema) is no part of `kcert gate`
    from kcert.attest.certificate import load_envelope

    envelope = load_envelope(cert)
    try:
        with _registry(registry) as reg:
            stored = reg.push(envelope)
    except CertificateRejected as exc:
        _fail(exc.diagnostics(), as_json=as_json, kind=exc.kind)
    if as_json:
        emit_json(_dump(stored))
        return
    state = "stored" if stored.created else "already stored"
    out_console.print(f"{state}: {stored.id} ({stored.kernel_name}, verdict {stored.verdict})")
    if not stored.sandboxed:
        err_console.print(
            "note: this certificate does not record that its kernel ran in the sandbox "
            "(--no-sandbox, or an older certifier); the registry's policy will not promote it. "
            "Certify the kernel again without --no-sandbox.",
            markup=False, soft_wrap=True,
        )  # fmt: skip


def gate_command(
    kernel: KernelOption,
    target: TargetOption,
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """May this kernel run on this target now? Exit 0 allow, 1 deny."""
    with _registry(registry) as reg:
        decision = reg.gate(_kernel(kernel), target)
    if as_json:
        emit_json(_dump(decision))
    else:
        out_console.print("allow" if decision.allow else "deny", markup=False)
        for reason in decision.reasons:
            err_console.print(f"  {reason}", markup=False, soft_wrap=True)
    if not decision.allow:
        raise typer.Exit(EXIT_FAIL)


def promote_command(
    kernel: KernelOption,
    target: TargetOption,
    registry: RegistryOption = None,
    replaces: Annotated[
        str | None,
        typer.Option("--replaces", help="The kernel this one replaces on the target (default: "
                     "the target's active kernel of the same name): the target's p99 policy "
                     "holds the canary's latency against it."),
    ] = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """Promote a kernel to a target. Exit 0 granted, 1 denied (with every reason)."""
    try:
        with _registry(registry) as reg:
            old = _kernel(replaces) if replaces is not None else None
            promotion = reg.promote(_kernel(kernel), target, old)
    except PromotionDenied as exc:
        if as_json:
            emit_json({"granted": False, "kernel": kernel, "target": target,
                       "reasons": exc.reasons, "log_index": exc.log_index})  # fmt: skip
        else:
            out_console.print("denied", markup=False)
            for reason in exc.reasons:
                err_console.print(f"  {reason}", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAIL) from None
    if as_json:
        emit_json({"granted": True, **_dump(promotion)})
        return
    out_console.print(f"granted: {promotion.kernel} -> {promotion.target} "
                      f"on {promotion.certificate}", markup=False)  # fmt: skip


@target_app.command("report")
def target_report_command(
    name: Annotated[str, typer.Argument(help="Target name.")],
    hw: Annotated[str, typer.Option("--hw", help="The target's hardware class (e.g. H100).")],
    environment: Annotated[
        Path | None,
        typer.Option("--environment", help="Environment JSON; default: this machine's."),
    ] = None,
    drift_fields: Annotated[
        list[str] | None,
        typer.Option(
            "--drift-field",
            "--drift-fields",
            help="A drift field (repeat for several); default: the standard set.",
        ),
    ] = None,  # fmt: skip
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Report a target's environment; the registry derives its fingerprint and applies drift."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.models import TargetCreate

    fields = _read_environment(environment)
    names = [n.strip() for item in drift_fields or [] for n in item.split(",") if n.strip()]
    try:
        report = TargetCreate(hw_class=hw, environment=fields, drift_fields=names or None)
    except ValidationError as exc:
        raise UsageError(f"cannot report target {name!r}: {_first_error(exc)}") from exc
    with _registry(registry) as reg:
        reported = reg.report_target(name, report)
    if as_json:
        emit_json(_dump(reported))
        return
    what = "created" if reported.created else ("changed" if reported.changed else "unchanged")
    out_console.print(f"target {reported.name}: {what}, fingerprint {reported.fingerprint}",
                      markup=False)  # fmt: skip
    for cid in reported.stale_certificates:
        err_console.print(f"  stale: {cid}", markup=False)
    for kernel in reported.suspended_promotions:
        err_console.print(f"  promotion suspended: {kernel}", markup=False)


def revoke_command(
    cert_id: Annotated[str, typer.Argument(help="Certificate id (sha256:...).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the log).")],
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a certificate; promotions that rested on it alone are suspended."""
    with _registry(registry) as reg:
        cert = reg.revoke_certificate(cert_id, reason)
    if as_json:
        emit_json(_dump(cert))
        return
    out_console.print(f"revoked: {cert.id} ({cert.revoke_reason})", markup=False)


@keys_app.command("trust")
def keys_trust_command(
    public_key: Annotated[str, typer.Argument(help="Public key file (PATH.pub) or its hex.")],
    name: Annotated[str, typer.Option("--name", help="A name for the key's owner.")],
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Trust a signing key in the registry."""
    # Key files need cryptography, which `kcert gate` never loads.
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.attest.keys import load_public_key, public_key_hex
    from kcert.registry.models import TrustedKeyCreate

    hex_key = (
        public_key
        if _HEX_KEY.match(public_key)
        else public_key_hex(load_public_key(Path(public_key)))
    )
    try:
        request = TrustedKeyCreate(name=name, public_key=hex_key)
    except ValidationError as exc:
        raise UsageError(f"cannot trust this key: {_first_error(exc)}") from exc
    with _registry(registry) as reg:
        key = reg.trust_key(request)
    if as_json:
        emit_json(_dump(key))
        return
    out_console.print(f"trusted: {key.keyid} ({key.name})", markup=False)


@keys_app.command("revoke")
def keys_revoke_command(
    keyid: Annotated[str, typer.Argument(help="Key id (hex SHA-256 of the public key).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the log).")] = "revoked",
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a signing key: every certificate it signed stops counting."""
    with _registry(registry) as reg:
        key = reg.revoke_key(keyid, reason)
    if as_json:
        emit_json(_dump(key))
        return
    out_console.print(f"revoked: {key.keyid} ({key.revoke_reason})", markup=False)


@token_app.command("create")
def token_create_command(
    scopes: Annotated[
        list[str], typer.Option("--scope", help="A scope (repeat): " + ", ".join(Scope))
    ],
    description: Annotated[str | None, typer.Option("--description")] = None,
    expires_in: Annotated[
        int | None, typer.Option("--expires-in", help="Lifetime in seconds.")
    ] = None,
    targets: Annotated[
        list[str] | None,
        typer.Option("--target", help="A target this observations:write token may report "
                     "for (repeat). Required for that scope unless --all-targets."),
    ] = None,
    all_targets: Annotated[
        bool, typer.Option("--all-targets", help="Let an observations:write token report for "
                           "every target (say it explicitly: any target's promotion could be "
                           "suspended with it).")
    ] = False,
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make an API token. It is shown once: only its hash is kept."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.models import ApiTokenCreate

    try:
        request = ApiTokenCreate.model_validate(
            {"scopes": scopes, "description": description, "expires_in": expires_in,
             "targets": targets or None, "all_targets": all_targets}
        )  # fmt: skip
    except ValidationError as exc:
        raise UsageError(f"cannot make this token: {_first_error(exc)}") from exc
    with _registry(registry) as reg:
        created = reg.create_token(request)
    if as_json:
        emit_json(_dump(created))
        return
    out_console.print(created.token, markup=False)
    bound = f" for targets {', '.join(created.targets)}" if created.targets else ""
    err_console.print(f"token {created.id} with scopes {', '.join(created.scopes)}{bound}; "
                      "it is not shown again")  # fmt: skip


@token_app.command("revoke")
def token_revoke_command(
    token_id: Annotated[str, typer.Argument(help="Token id (tok_..., from `token create`).")],
    registry: RegistryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke an API token: every route refuses it from the next request on (logged by id)."""
    if not _TOKEN_ID.match(token_id):
        raise UsageError(
            f"{token_id!r} is not a token id; ids look like tok_0123456789abcdef "
            "(`kcert token create` prints them)"
        )
    with _registry(registry) as reg:
        revoked = reg.revoke_token(token_id)
    if as_json:
        emit_json(_dump(revoked))
        return
    out_console.print(f"revoked: token {revoked.id}", markup=False)


def _read_environment(path: Path | None) -> dict[str, Any]:
    if path is None:
        # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
        from kcert.certify.environment import collect_environment

        return dict(collect_environment("auto").fields)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --environment {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UsageError(f"--environment {path} is not JSON: {exc}") from exc
    if isinstance(value, dict) and isinstance(value.get("environment"), dict):
        # Accept `kcert fingerprint --json` output as it is.
        value = value["environment"]
    if not isinstance(value, dict):
        raise UsageError(f"--environment {path} must hold a JSON object of environment fields")
    return value


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


def _fail(message: str, *, as_json: bool, kind: str) -> NoReturn:
    err_console.print(f"[bold red]refused:[/] {message}", soft_wrap=True)
    if as_json:
        emit_json({"error": {"type": kind, "detail": message}})
    raise typer.Exit(EXIT_FAIL)


def register(app: typer.Typer) -> None:
    """Add this module's commands to app (and ``keys trust``/``keys revoke`` to ``keys``)."""
    app.command("serve")(serve_command)
    app.command("push")(push_command)
    app.command("gate")(gate_command)
    app.command("promote")(promote_command)
    app.command("revoke")(revoke_command)
    app.add_typer(target_app, name="target")
    app.add_typer(token_app, name="token")
