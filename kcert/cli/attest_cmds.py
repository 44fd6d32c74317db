"""``kcert keys generate``, ``kcert verify`` and ``kcert diff``: thin doors into kcert.attest.

``keys generate`` joins the ``keys`` group of :mod:`kcert.cli.groups`, which
the registry's commands (``keys trust``, ``keys revoke``) fill too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from kcert.attest.certificate import (
    CertificateContents,
    VerifiedCertificate,
    inspect_envelope,
    load_envelope,
    read_certificate,
    verify_envelope,
)
from kcert.attest.diff import (
    DEFAULT_ERROR_GROWTH,
    DEFAULT_SLOWDOWN,
    CertificateDiff,
    NumberDelta,
    Thresholds,
    diff_certificates,
)
from kcert.attest.errors import CertificateFormatError, VerificationError
from kcert.attest.files import write_atomic
from kcert.attest.keys import (
    PASSPHRASE_ENV,
    load_public_key,
    passphrase_from_env,
    trust_map,
    write_keypair,
)
from kcert.certify.report import Verdict
from kcert.cli.app import EXIT_FAIL, EXIT_OK
from kcert.cli.groups import keys_app
from kcert.cli.output import emit_json, err_console, out_console

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


@keys_app.command("generate")
def keys_generate(
    out: Annotated[
        Path, typer.Option("--out", help="Private key path; the public key goes to PATH.pub.")
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace existing key files.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Make an Ed25519 key pair: PATH (private, mode 600) and PATH.pub.

    The private key is encrypted with KCERT_KEY_PASSPHRASE when that is set.
    """
    passphrase = passphrase_from_env()
    pair = write_keypair(out, passphrase=passphrase, overwrite=force)
    if as_json:
        emit_json({
            "keyid": pair.keyid, "private_key": str(pair.private_path),
            "public_key": str(pair.public_path), "encrypted": passphrase is not None,
        })  # fmt: skip
        return
    note = "encrypted" if passphrase else f"not encrypted; set {PASSPHRASE_ENV} to encrypt"
    err_console.print(f"wrote {pair.private_path} (mode 600, {note})", markup=False)
    err_console.print(f"wrote {pair.public_path}", markup=False)
    out_console.print(f"key id {pair.keyid}", markup=False)


def verify_command(
    cert: Annotated[Path, typer.Argument(help="The certificate (DSSE envelope JSON).")],
    key: Annotated[Path, typer.Option("--key", help="The signer's public key (PATH.pub or PEM).")],
    require_pass: Annotated[
        bool, typer.Option("--require-pass", help="Also exit 1 when the verdict recorded is fail.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Check a certificate's signature and contents. Exit 0 valid, 1 invalid, 2 unreadable."""
    public_key = load_public_key(key)
    envelope = load_envelope(cert)
    try:
        verified = verify_envelope(envelope, trust_map([public_key]))
    except CertificateFormatError:
        raise
    except VerificationError as exc:
        _invalid(cert, exc, as_json=as_json)
    failed = verified.verdict is Verdict.FAIL
    if as_json:
        emit_json({"valid": True, "certificate": str(cert), **_summary(verified)})
    else:
        out_console.print(f"[green]valid[/] certificate {verified.id}", soft_wrap=True)
        # Names come from the certificate: escape them so they cannot restyle the terminal.
        out_console.print(
            f"kernel {escape(verified.kernel_name)} ({verified.source_digest}), verdict "
            f"{'[bold red]fail[/]' if failed else '[green]pass[/]'}, hardware "
            f"{escape(verified.hw_class)} ({verified.executor}), signed by {verified.keyid}",
            soft_wrap=True,
        )
    if failed:
        err_console.print(
            "note: the signature is valid, but it certifies a FAILED verification of the kernel",
            markup=False,
        )
    raise typer.Exit(EXIT_FAIL if failed and require_pass else EXIT_OK)


def _summary(c: VerifiedCertificate) -> dict[str, Any]:
    return {
        "id": str(c.id), "keyid": c.keyid, "kernel": c.kernel_name,
        "source_digest": str(c.source_digest), "verdict": str(c.verdict),
        "hw_class": c.hw_class, "executor": c.executor, "fingerprint": str(c.fingerprint),
        "subjects": [{"name": n, "digest": str(d)} for n, d in c.subjects],
    }  # fmt: skip


def diff_command(
    cert_a: Annotated[Path, typer.Argument(help="The earlier certificate (A).")],
    cert_b: Annotated[Path, typer.Argument(help="The later certificate (B).")],
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="Exit 1 when B is worse than A.")
    ] = False,
    error_growth: Annotated[
        float, typer.Option("--error-growth", min=0.0,
                            help="Max abs error may grow by this fraction before it regresses.")
    ] = DEFAULT_ERROR_GROWTH,  # fmt: skip
    slowdown: Annotated[
        float, typer.Option("--slowdown", min=0.0,
                            help="Kernel median time may grow by this fraction (same hw class).")
    ] = DEFAULT_SLOWDOWN,  # fmt: skip
    key: Annotated[
        Path | None, typer.Option("--key", help="Also verify both signatures with this public key.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Compare two certificates: errors per probe, artifact, timing, environment, checks.

    B regresses when a check that passed now fails, the verdict turns to fail, a
    probe's max abs error grows beyond --error-growth (a probe compares only with
    the same probe on the same input bytes: fresh probes redrawn from another
    seed are listed, not compared), registers, spills or local
    memory grow, or the kernel's median time grows beyond --slowdown. Exit 0; 1
    when a certificate is invalid, or with --fail-on-regression when B regressed;
    2 when a file cannot be read.
    """
    try:
        a, b = _read(cert_a, key), _read(cert_b, key)
    except CertificateFormatError:
        raise
    except VerificationError as exc:
        # As with verify: a readable certificate that is not valid exits 1.
        if as_json:
            emit_json({"valid": False, "reason": exc.diagnostics()})
        err_console.print(f"[bold red]invalid:[/] {escape(exc.diagnostics())}", soft_wrap=True)
        raise typer.Exit(EXIT_FAIL) from None
    result = diff_certificates(a, b, Thresholds(error_growth=error_growth, slowdown=slowdown))
    if as_json:
        emit_json({**result.to_json(), "signatures_checked": key is not None})
    else:
        _show_diff(result, signatures_checked=key is not None)
    raise typer.Exit(EXIT_FAIL if fail_on_regression and result.regressed else EXIT_OK)


def report_command(
    cert: Annotated[Path, typer.Argument(help="The certificate (DSSE envelope JSON).")],
    html: Annotated[
        Path | None, typer.Option("--html", help="Write one self-contained HTML page.")
    ] = None,
    key: Annotated[
        Path | None, typer.Option("--key", help="Verify the signature with this public key first.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show a certificate: verdict, checks, environment and where each probe's error falls.

    Without --key the signature is not checked, and the report says so. Exit 0;
    1 when --key is given and the signature does not verify; 2 when the file
    cannot be read.
    """
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.attest.html_report import render_html

    try:
        contents = _read(cert, key)
    except CertificateFormatError:
        raise
    except VerificationError as exc:
        _invalid(cert, exc, as_json=as_json)
    keyid = contents.keyid if isinstance(contents, VerifiedCertificate) else None
    if html is not None:
        write_atomic(html, render_html(contents, keyid=keyid).encode(), what="HTML report")
    if as_json:
        emit_json({"id": str(contents.id), "kernel": contents.kernel_name,
                   "verdict": str(contents.verdict), "signature_verified": keyid is not None,
                   "keyid": keyid, "html": None if html is None else str(html)})  # fmt: skip
        return
    checks = contents.predicate["checks"]
    failed = [str(c["name"]) for c in checks if c["status"] == "fail"]
    out_console.print(f"certificate {contents.id}", markup=False, soft_wrap=True)
    out_console.print(
        f"kernel {escape(contents.kernel_name)}, verdict "
        f"{'[bold red]fail[/]' if failed else '[green]pass[/]'}, {len(checks)} checks"
        + (f", failed: {escape(', '.join(failed))}" if failed else ""), soft_wrap=True)
    if keyid is None:
        err_console.print("signature not verified (pass --key to check it)", markup=False)
    if html is not None:
        err_console.print(f"wrote {html}", markup=False)


def _read(path: Path, key: Path | None) -> CertificateContents:
    if key is None:
        return inspect_envelope(read_certificate(path))
    public_key = load_public_key(key)
    envelope = load_envelope(path)
    try:
        return verify_envelope(envelope, trust_map([public_key]))
    except VerificationError as exc:
        raise VerificationError(f"{path}: {exc.diagnostics()}") from exc


def _show_diff(d: CertificateDiff, *, signatures_checked: bool) -> None:
    out_console.print(f"A {d.a_id}\nB {d.b_id}", markup=False, soft_wrap=True)
    if not signatures_checked:
        err_console.print("signatures not checked (pass --key to check them)", markup=False)
    rows = [
        *((c.field, c.a, c.b) for c in d.kernel),
        *((("verdict", d.verdict.a, d.verdict.b),) if d.verdict else ()),
        *((f"check {c.field}", c.a, c.b) for c in d.checks),
        *((c.field, c.a, c.b) for c in d.environment),
    ]
    if rows:
        table = _table("changes", "field", "A", "B")
        for label, a, b in rows:
            table.add_row(escape(label), _text(a), _text(b))
        out_console.print(table)
    if d.errors:
        table = _table("max error per probe", "probe", "output", "metric", "A", "B", "delta")
        for e in d.errors:
            table.add_row(escape(e.probe), escape(e.output), e.metric, f"{e.a:.4g}", f"{e.b:.4g}",
                          "-" if e.delta is None else f"{e.delta:+.3g}")  # fmt: skip
        out_console.print(table)
    for side, ids in (("A", d.probes_only_in_a), ("B", d.probes_only_in_b)):
        if ids:
            out_console.print(f"probes only in {side}: {', '.join(ids)}", markup=False)
    sections: tuple[tuple[str, tuple[NumberDelta, ...]], ...] = (
        ("artifact", d.artifact), ("timing", d.timing),
    )  # fmt: skip
    for title, numbers in sections:
        if numbers:
            table = _table(title, "field", "A", "B", "delta")
            for n in numbers:
                table.add_row(n.field, _text(n.a), _text(n.b),
                              "-" if n.delta is None else f"{n.delta:+.4g}")  # fmt: skip
            out_console.print(table)
    if d.regressions:
        out_console.print(f"[bold red]{len(d.regressions)} regression(s):[/]")
        for r in d.regressions:
            out_console.print(f"  {r.kind}: {r.message}", markup=False, soft_wrap=True)
    else:
        out_console.print("[green]no regressions[/] (thresholds: error growth "
                          f"{d.thresholds.error_growth:.0%}, slowdown "
                          f"{d.thresholds.slowdown:.0%})")  # fmt: skip


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def _text(value: Any) -> str:
    """A table cell; values come from certificates, so markup in them is escaped."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return escape(str(value))


def register(app: typer.Typer) -> None:
    """Add this module's commands to app."""
    app.add_typer(keys_app, name="keys")
    app.command("verify")(verify_command)
    app.command("diff")(diff_command)
    app.command("report")(report_command)


def _invalid(cert: Path, exc: VerificationError, *, as_json: bool) -> NoReturn:
    """A certificate whose signature or contents failed verification: a verdict, exit 1."""
    if as_json:
        emit_json({"valid": False, "certificate": str(cert), "reason": exc.diagnostics()})
    err_console.print(f"[bold red]invalid:[/] {escape(exc.diagnostics())}", soft_wrap=True)
    raise typer.Exit(EXIT_FAIL) from None
