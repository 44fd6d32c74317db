"""The Typer application, and the one place where errors become exit codes.

Exit codes: 0 success, pass or allowed; 1 a verdict of fail, denied or an
invalid signature; 2 bad input, usage or environment. Each sub-module owns
one group of commands and registers it here.
"""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from kcert import __version__
from kcert.cli.output import emit_error
from kcert.errors import KcertError

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class _KcertGroup(TyperGroup):
    """Turns every :class:`KcertError` into a message and exit code 2."""

    def invoke(self, ctx: Any) -> Any:
        # The group clears its argument lists while dispatching: read them first.
        argv = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        try:
            return super().invoke(ctx)
        except KcertError as exc:
            emit_error(exc, as_json="--json" in argv)
            raise typer.Exit(EXIT_USAGE) from None


app = typer.Typer(
    cls=_KcertGroup,
    name="kcert",
    help="Certify GPU kernels against adversarial probes, sign the evidence, gate deployments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts mention TOML tables like [[kernel]]; don't read them as markup.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kcert {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Certify GPU kernels against adversarial probes, sign the evidence, gate deployments."""


def _register_all() -> None:
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.cli import (
        attest_cmds,
        audit_cmds,
        build_cmds,
        certify_cmds,
        digest_cmd,
        fingerprint_cmd,
        perf_cmds,
        registry_cmds,
        witness_cmds,
    )

    for module in (
        build_cmds, certify_cmds, fingerprint_cmd, attest_cmds, digest_cmd, registry_cmds,
        audit_cmds, witness_cmds, perf_cmds,
    ):  # fmt: skip
        module.register(app)


_register_all()


def _terminate(signum: int, _frame: object) -> None:
    # unwind as for Ctrl-C: context managers close their sandboxes, atexit discards spares
    raise SystemExit(128 + signum)


def main() -> None:
    """Console-script entry point."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, _terminate)
    try:
        app(prog_name="kcert")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
