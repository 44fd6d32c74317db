"""``kcert digest`` prints the content address that gate and promote take as --kernel."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

from kcert.certify.spec import load_spec
from kcert.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_digest_is_the_source_digest_a_certificate_records() -> None:
    spec = load_spec(EXAMPLES / "triton" / "kcert.toml")
    kernel = spec.kernel("saxpy")
    result = CliRunner().invoke(app, ["digest", str(kernel.source)])
    assert result.exit_code == 0, result.output
    # what the certifier puts in the predicate's kernel.source_digest (and the first subject)
    assert result.stdout.strip() == str(kernel.code.digest)
    want = hashlib.sha256(kernel.source.read_bytes()).hexdigest()
    assert result.stdout == f"sha256:{want}\n"


def test_several_files_one_line_each_in_order_and_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.cu", tmp_path / "b.py"
    a.write_bytes(b"extern \"C\" __global__ void k() {}\n")
    b.write_bytes(b"")
    plain = CliRunner().invoke(app, ["digest", str(a), str(b)])
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.splitlines() == [
        f"sha256:{hashlib.sha256(a.read_bytes()).hexdigest()}",
        f"sha256:{hashlib.sha256(b'').hexdigest()}",
    ]
    as_json = CliRunner().invoke(app, ["digest", str(a), str(b), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert [d["file"] for d in data["digests"]] == [str(a), str(b)]
    assert [d["digest"] for d in data["digests"]] == plain.stdout.splitlines()


def test_a_missing_file_or_a_folder_is_bad_input(tmp_path: Path) -> None:
    good = tmp_path / "k.cu"
    good.write_text("x")
    missing = CliRunner().invoke(app, ["digest", str(good), str(tmp_path / "nope.cu"), "--json"])
    assert missing.exit_code == 2
    assert "nope.cu: cannot read" in missing.stderr
    # nothing half-printed: the one JSON object on stdout is the error
    assert json.loads(missing.stdout)["error"]["type"] == "usage"
    folder = CliRunner().invoke(app, ["digest", str(tmp_path)])
    assert folder.exit_code == 2
    assert "is a folder" in folder.stderr
    assert folder.stdout == ""
