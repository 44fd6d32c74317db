"""``kcert witness serve`` and ``kcert witness key``: run a C2SP tlog-witness.

The witness's Ed25519 key is a PEM file (``--key``, default
``$KCERT_HOME/witness-key.pem``, made with mode 600 on first use); its
cosigner verifier key (``name+keyid+base64(0x04 || key)``) is what logs and
auditors configure. The logs it follows are given by their C2SP verifier keys
(``--log``, a key or a file holding one; a kcert registry serves its own at
``/v1/log/key``). Its state, the latest cosigned checkpoint per log, is one
JSON file (``--state``, default ``$KCERT_HOME/witness-state.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kcert.cli.output import err_console, out_console
from kcert.errors import UsageError
from kcert.log.cosignature import Cosigner
from kcert.log.errors import LogError
from kcert.log.note import Verifier, load_or_create_signer

witness_app = typer.Typer(
    name="witness",
    help="Run a C2SP tlog-witness that cosigns checkpoints of the logs it follows.",
    no_args_is_help=True,
)

NameOpt = Annotated[
    str, typer.Option("--name", help="The witness's name, e.g. witness.example.org/w1.")
]
KeyOpt = Annotated[
    Path | None,
    typer.Option("--key", help="Ed25519 PEM key (default: KCERT_HOME/witness-key.pem)."),
]


def _home() -> Path:
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.registry.config import Settings

    return Settings().home


def _cosigner(name: str, key: Path | None) -> Cosigner:
    path = key or _home() / "witness-key.pem"
    try:
        signer = load_or_create_signer(path, origin=name)
    except LogError as exc:
        raise UsageError(f"--name/--key: {exc}") from exc
    return Cosigner(signer.name, signer.private_key)


def _log_key(text: str) -> Verifier:
    path = Path(text)
    try:
        value = path.read_text(encoding="utf-8") if path.is_file() else text
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--log: cannot read {path}") from exc
    try:
        return Verifier.from_vkey(value)
    except LogError as exc:
        raise UsageError(f"--log: {exc}") from exc


def key_command(name: NameOpt, key: KeyOpt = None) -> None:
    """Print the witness's cosigner verifier key (making the key if there is none)."""
    out_console.print(_cosigner(name, key).key.vkey(), markup=False, soft_wrap=True)


def serve_command(
    name: NameOpt,
    log: Annotated[
        list[str],
        typer.Option("--log", help="A followed log's verifier key, or a file holding one "
                     "(repeat for more logs)."),
    ],
    key: KeyOpt = None,
    state: Annotated[
        Path | None,
        typer.Option("--state", help="State file (default: KCERT_HOME/witness-state.json)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8710,
) -> None:  # fmt: skip
    """Serve POST /add-checkpoint (C2SP tlog-witness) for the logs named by --log."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    import uvicorn

    from kcert.api.witness_app import create_witness_app
    from kcert.log.witness import Witness, WitnessState

    cosigner = _cosigner(name, key)
    logs = [_log_key(text) for text in log]
    witness = Witness(cosigner, logs, WitnessState(state or _home() / "witness-state.json"))
    try:
        witness.state.read()
    except LogError as exc:
        raise UsageError(str(exc)) from exc
    err_console.print(f"witness {cosigner.name} on http://{host}:{port}", markup=False)
    err_console.print(f"verifier key: {cosigner.key.vkey()}", markup=False, soft_wrap=True)
    for verifier in logs:
        err_console.print(f"following log {verifier.name}", markup=False)
    uvicorn.run(create_witness_app(witness), host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add this module's commands to app."""
    witness_app.command("serve")(serve_command)
    witness_app.command("key")(key_command)
    app.add_typer(witness_app)
