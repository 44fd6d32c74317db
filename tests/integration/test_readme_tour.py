"""The README's tour runs as written.

The ``sh`` blocks under "## A tour of the CLI" are taken from README.md
verbatim and run, in order, as one bash script under ``set -euo pipefail``:
any command that exits other than as the README says stops it (the one
expected denial is written ``|| echo "denied (exit $?)"`` there, and the
``text`` block of what it prints must then show ``denied (exit 1)``). Nothing
is replaced: the script finds ``.venv`` and ``examples/`` where a reader at
the repository root does, in a temporary folder that stands for the root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kcert

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## A tour of the CLI"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def tour_blocks(readme: str) -> tuple[list[str], list[str]]:
    """The tour's shell blocks and the lines its ``text`` block says it prints."""
    start = readme.index(SECTION + "\n")
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start : end if end != -1 else len(readme)]
    shell, expected = [], []
    for match in FENCE.finditer(section):
        lang, body = match.group(1), match.group(2)
        if lang == "sh":
            shell.append(body)
        elif lang == "text":
            expected.extend(line.strip() for line in body.splitlines() if line.strip())
    return shell, expected


def test_tour_blocks_are_found_and_use_no_placeholders() -> None:
    shell, expected = tour_blocks((ROOT / "README.md").read_text())
    assert len(shell) >= 2 and expected
    script = "\n".join(shell)
    for placeholder in ("my_kernel", "old.cert", "sha256:...", "CERT_ID", "...", "FILL_IN"):
        assert placeholder not in script, placeholder
    # every registry step the issue asked the tour to show runs against real values
    for command in ("kcert digest", "kcert promote", "kcert gate", "kcert revoke",
                    "kcert audit replay 3", "kcert diff"):  # fmt: skip
        assert command in script, command


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip("the tour sources .venv/bin/activate: run the tests from a virtual environment")
    shell, expected = tour_blocks((ROOT / "README.md").read_text())
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(ROOT / "examples", root / "examples")
    (root / ".venv").symlink_to(venv, target_is_directory=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith("KCERT_") and key not in {"VIRTUAL_ENV", "PYTHONHOME"}
    }  # fmt: skip
    env.update(
        HOME=str(tmp_path / "home"),  # nothing may reach the real ~/.kcert
        TMPDIR=str(scratch),  # mktemp -d lands here, and goes with tmp_path
        # the `kcert` script imports this checkout, not whatever the venv installed
        PYTHONPATH=os.pathsep.join(
            [str(Path(kcert.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
        COLUMNS="200",
    )
    script = "set -euo pipefail\n" + "\n".join(shell)
    run = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "Traceback" not in output
    lines = {line.strip() for line in output.splitlines()}
    missing = [line for line in expected if line not in lines]
    assert not missing, (missing, output[-6000:])
    # what the tour made is real: a signed certificate and a registry with six log entries
    homes = [p for p in scratch.iterdir() if (p / "registry.db").is_file()]
    assert len(homes) == 1, list(scratch.iterdir())
    home = homes[0]
    assert (home / "saxpy.cert.json").is_file() and (home / "signing.key.pub").is_file()
    assert (home / "mine" / "kcert.toml").is_file()
    assert "6 entries" in output
