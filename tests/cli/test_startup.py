"""What the quick commands import, and usage errors under ``--json``.

``kcert --version``, ``verify`` and ``gate`` (against a server) sit in deploy
scripts: they must not load the certifier's NumPy or the registry's database
stack, nor what only another command needs: the server's settings
(pydantic-settings), the predicate's schema validator (jsonschema: only a
command that reads a certificate validates one), certificate code in ``gate``,
the HTTP client in ``verify``, and pydantic outside the registry's client
(Typer before 0.29 parses options without it; pyproject.toml pins that). The
time itself is measured by ``bench/startup.py``; here we check the cause, the
imported modules, which does not depend on how busy the machine is.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from kcert.attest.certificate import sign_report, write_certificate
from kcert.attest.keys import load_private_key, write_keypair
from kcert.cli.app import _OWNERS, app

HEAVY = ("numpy", "sqlalchemy", "sqlmodel", "alembic", "fastapi", "cupy", "triton", "torch")
#: The server's settings and the schema validator: no quick command but verify CERT needs one.
SERVER_ONLY = ("pydantic_settings",)
CERTIFICATES = ("jsonschema", "cryptography", "kcert.attest", "kcert.cli.attest_cmds")
CLIENT = ("httpx", "kcert.registry.remote")

_PROBE = """
import json, sys
from kcert.cli import main
sys.argv = ["kcert", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _imports(*args: str) -> tuple[int, set[str]]:
    """The exit code, and every module imported (``a.b.c`` counts as ``a``, ``a.b``, ``a.b.c``)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    last = done.stderr.strip().splitlines()[-1]
    report = json.loads(last)
    modules = {
        ".".join(parts[:n]) for parts in (m.split(".") for m in report["modules"])
        for n in range(1, len(parts) + 1)
    }  # fmt: skip
    return report["code"], modules


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        (("--version",), (*HEAVY, *SERVER_ONLY, *CERTIFICATES, *CLIENT, "pydantic", "rich")),
        (("verify", "--help"), (*HEAVY, *SERVER_ONLY, "jsonschema", *CLIENT, "pydantic")),
        (("gate", "--help"), (*HEAVY, *SERVER_ONLY, *CERTIFICATES, *CLIENT)),
        # a server that is not there: the client gets as far as connecting, then exits 2
        (("gate", "--kernel", "sha256:" + "a" * 64, "--target", "t",
          "--registry", "http://127.0.0.1:9"), (*HEAVY, *SERVER_ONLY, *CERTIFICATES)),
    ],
)  # fmt: skip
def test_quick_commands_skip_what_they_do_not_use(
    args: tuple[str, ...], absent: tuple[str, ...]
) -> None:
    code, modules = _imports(*args)
    assert code in (0, 2)
    assert not modules & set(absent), sorted(modules & set(absent))


def test_verify_of_a_real_certificate_skips_what_it_does_not_use(tmp_path: Path) -> None:
    key = tmp_path / "signer"
    write_keypair(key, passphrase=None)
    cert = tmp_path / "saxpy.cert.json"
    write_certificate(cert, sign_report(_factory().make_report(), load_private_key(key)))
    code, modules = _imports("verify", str(cert), "--key", f"{key}.pub")
    assert code == 0
    absent = {*HEAVY, *SERVER_ONLY, *CLIENT, "pydantic", "kcert.registry"}
    assert not modules & absent, sorted(modules & absent)
    # The control: reading a certificate validates its predicate, and the probe sees that.
    assert {"jsonschema", "cryptography", "kcert.attest.statement"} <= modules


def test_the_probe_sees_heavy_imports_where_there_are_some() -> None:
    # The control: certify's own command does import NumPy, so the probe can see it.
    code, modules = _imports("certify", "--help")
    assert code == 0
    assert "numpy" in modules


def _factory() -> ModuleType:
    # The report factory lives with the attestation tests; tests/ is not a package.
    path = Path(__file__).parents[1] / "attest" / "attest_report_factory.py"
    spec = importlib.util.spec_from_file_location("attest_report_factory_for_startup", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_is_listed_in_owners() -> None:
    import typer

    scratch = typer.Typer()
    for owner in sorted({m for owners in _OWNERS.values() for m in owners}):
        importlib.import_module(f"kcert.cli.{owner}").register(scratch)
    assert set(typer.main.get_group(scratch).commands) == set(_OWNERS)


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "--bogus", "--json"],
        ["verify", "--json"],
        ["nope", "--json"],
        ["certify", "--executor", "abacus", "--json", "x.toml"],
    ],
)
def test_json_usage_errors_print_one_problem_on_stdout(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    body = json.loads(result.stdout)
    assert body["error"]["type"] == "usage"
    assert body["error"]["detail"]


def test_usage_errors_without_json_leave_stdout_empty() -> None:
    result = CliRunner().invoke(app, ["verify", "--bogus"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such option: --bogus" in result.stderr


def test_a_group_with_two_owners_is_whole_after_a_command_of_one_of_them() -> None:
    # ``verify`` loads the attest commands alone; ``keys`` must still get the registry's own.
    # A fresh interpreter: once any test imported the registry's commands, this cannot fail.
    script = """
from typer.testing import CliRunner
from kcert.cli.app import app
runner = CliRunner()
assert runner.invoke(app, ["verify", "--help"]).exit_code == 0
result = runner.invoke(app, ["keys", "--help"])
print(result.exit_code, result.stdout)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.startswith("0 ")
    listed = done.stdout.split("Commands:", 1)[1].splitlines()
    assert {line.split()[0] for line in listed if line.strip()} == {"generate", "trust", "revoke"}
