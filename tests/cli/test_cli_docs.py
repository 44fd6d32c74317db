"""docs/cli.md documents every command the CLI has, from the commands' own --help."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import typer

from kcert.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "scripts" / "cli_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_has_its_section_in_docs_cli_md() -> None:
    gen = _generator()
    root = typer.main.get_command(app)
    paths = list(gen.commands(root, root.context_class(root, info_name="kcert")))
    # the walk reaches the groups' subcommands, not only the top level
    assert ("certify",) in paths and ("audit", "replay") in paths and ("digest",) in paths
    documented = set(re.findall(r"^#{2,3} `kcert ([^`]+)`$", (ROOT / "docs" / "cli.md").read_text(),
                                re.MULTILINE))  # fmt: skip
    missing = [" ".join(p) for p in paths if " ".join(p) not in documented]
    assert not missing, f"run python scripts/cli_docs.py: docs/cli.md lacks {missing}"


def test_the_generator_renders_each_commands_help() -> None:
    text = _generator().render()
    assert "## `kcert gate`" in text
    # the option list comes from the command itself
    assert "--fail-on-regression" in text.split("## `kcert diff`")[1].split("\n## ")[0]


def test_docs_cli_md_is_what_the_generator_writes() -> None:
    # a hand edit to docs/cli.md is lost the next time it is generated: edit the generator.
    # In a fresh process, as the script runs: a group's commands are listed in the order
    # their lazily imported modules registered them, which other tests' imports change here
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
