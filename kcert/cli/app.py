"""The Typer application, and the one place where errors become exit codes.

Exit codes: 0 success, pass or allowed; 1 a verdict of fail, denied or an
invalid signature; 2 bad input, usage or environment. Each sub-module owns
one group of commands and registers it here.

Commands are imported only when they run (:data:`_OWNERS`): the certifier
pulls in NumPy and the registry SQLAlchemy and Alembic, seconds of imports
that ``kcert --version``, ``kcert verify`` or a ``kcert gate`` against a
server never use. ``bench/startup.py`` measures it.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer 0.2x carries its own copy of click, and raises its exceptions
    from typer._click.core import Command, Context
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - an older typer on click itself
    from click import Command, Context  # type: ignore[assignment]
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from kcert import __version__
from kcert.cli.output import emit_error, emit_json
from kcert.errors import KcertError

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2

#: The module (under ``kcert.cli``) that registers each top-level command. ``keys`` and
#: ``target`` have two: the registry's module adds ``keys trust`` and ``keys revoke`` to the
#: attest module's group, and the perf module adds ``target policy`` to the registry's.
_OWNERS: dict[str, tuple[str, ...]] = {
    "init": ("build_cmds",),
    "lint": ("build_cmds",),
    "certify": ("certify_cmds",),
    "fingerprint": ("fingerprint_cmd",),
    "keys": ("attest_cmds", "registry_cmds"),
    "verify": ("attest_cmds",),
    "diff": ("attest_cmds",),
    "report": ("attest_cmds",),
    "digest": ("digest_cmd",),
    "serve": ("registry_cmds",),
    "push": ("registry_cmds",),
    "gate": ("registry_cmds",),
    "promote": ("registry_cmds",),
    "revoke": ("registry_cmds",),
    "target": ("registry_cmds", "perf_cmds"),
    "token": ("registry_cmds",),
    "audit": ("audit_cmds",),
    "witness": ("witness_cmds",),
    "perf": ("perf_cmds",),
}
#: Click commands already built, by name: building one imports its module.
_LOADED: dict[str, Command] = {}


def _load(name: str) -> Command | None:
    if name not in _LOADED:
        owners = _OWNERS.get(name)
        if owners is None:
            return None
        modules = [importlib.import_module(f"kcert.cli.{owner}") for owner in owners]
        scratch = typer.Typer(rich_markup_mode=None)
        for module in modules:
            module.register(scratch)
        commands = typer.main.get_group(scratch).commands
        for built, command in commands.items():
            # Only where these modules are all of its owners: ``keys`` built for ``verify``
            # alone would lack the registry's ``keys trust``.
            if _OWNERS.get(built) == owners:
                _LOADED.setdefault(built, command)
    return _LOADED.get(name)


def _json_requested(argv: Sequence[str]) -> bool:
    return "--json" in argv


class _KcertGroup(TyperGroup):
    """Loads each command on first use and turns errors into messages and exit codes."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(_OWNERS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        return self.commands.get(cmd_name) or _load(cmd_name)

    def invoke(self, ctx: Context) -> Any:
        # The group clears its argument lists while dispatching: read them first.
        argv = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        try:
            return super().invoke(ctx)
        except KcertError as exc:
            emit_error(exc, as_json=_json_requested(argv))
            raise typer.Exit(EXIT_USAGE) from None

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Click's usage errors happen before any command runs: with ``--json`` they are
        also the one JSON object on stdout, so a script reading it is never left empty."""
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as exc:
            if not standalone_mode:
                raise
            exc.show()
            code = EXIT_USAGE if isinstance(exc, UsageError) else exc.exit_code
            if _json_requested(argv):
                kind = "usage" if isinstance(exc, UsageError) else "error"
                emit_json({"error": {"type": kind, "detail": exc.format_message()}})
            sys.exit(code)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("Aborted!", err=True)
            sys.exit(EXIT_FAIL)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


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


def _terminate(signum: int, _frame: object) -> None:
    # unwind as for Ctrl-C: context managers close the sandboxes and the worker pool
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
