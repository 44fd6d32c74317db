"""The public Python API: every name in ``kcert.__all__`` resolves, ``import kcert`` stays
lazy, and the API certifies, signs, verifies, diffs and pushes end to end (on the CPU)."""

from __future__ import annotations

import contextlib
import doctest
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kcert

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves() -> None:
    assert kcert.__all__[0] == "__version__" and len(set(kcert.__all__)) == len(kcert.__all__)
    for name in kcert.__all__:
        assert getattr(kcert, name) is not None, name
    assert set(kcert.__all__) <= set(dir(kcert))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = kcert.nope  # type: ignore[attr-defined]
    # the typed results are the library's own classes, not copies
    from kcert.certify.report import CertificationReport

    assert kcert.CertificationReport is CertificationReport


def test_import_kcert_loads_nothing_heavy() -> None:
    code = ("import sys, kcert\n"
            "heavy = [m for m in ('numpy', 'sqlalchemy', 'cryptography', 'httpx', 'typer',\n"
            "         'kcert.certify', 'kcert.registry', 'kcert.attest') if m in sys.modules]\n"
            "print(','.join(heavy))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)  # fmt: skip
    assert done.stdout.strip() == ""


def test_the_docstring_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    result = doctest.testmod(kcert, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0


def test_the_readme_python_section_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    pytest.importorskip("triton")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use kcert from Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KCERT_REGISTRY", raising=False)
    monkeypatch.delenv("KCERT_DATABASE_URL", raising=False)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pass" and lines[1].startswith("kernel 'saxpy'")
    assert lines[-3].startswith("sha256:") and lines[-3].endswith(" pass")
    assert lines[-2:] == ["False", "True"]
    assert (tmp_path / "saxpy.cert.json").is_file()


def test_certify_sign_verify_diff_push(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    options = kcert.CertifyOptions(executor="triton-interpreter", max_probes=3)
    good = kcert.certify_kernel(kcert.load_kernel(ROOT / "examples/triton/kcert.toml", "saxpy"),
                                options)  # fmt: skip
    assert good.verdict is kcert.Verdict.PASS
    assert good.feedback().startswith("kernel 'saxpy'") and "PASS" in good.feedback()

    # the same spec with a kernel that is a little off: a failing certification of it
    folder = tmp_path / "triton"
    shutil.copytree(ROOT / "examples/triton", folder)
    source = folder / "saxpy.py"
    source.write_text(source.read_text().replace("a * x + y,", "a * x + y * 1.001,"))
    bad = kcert.certify_kernel(kcert.load_kernel(source), options)
    assert bad.verdict is kcert.Verdict.FAIL
    assert "FAILED correctness" in bad.feedback() and "allowed error" in bad.feedback()

    key, other = kcert.generate_key(), kcert.generate_key()
    cert_a, cert_b = kcert.sign(good, key), kcert.sign(bad, key)
    path = tmp_path / "saxpy.cert.json"
    kcert.write_certificate(path, cert_a)
    verified = kcert.verify(path, key.public_key())
    assert isinstance(verified, kcert.VerifiedCertificate)
    assert verified.keyid == kcert.key_id(key.public_key())
    assert verified.verdict is kcert.Verdict.PASS and verified.kernel_name == "saxpy"
    assert verified.id == kcert.certificate_id(cert_a)
    with pytest.raises(kcert.VerificationError):
        kcert.verify(cert_a, other.public_key())
    # a signature over a failed verdict still verifies: the verdict is in the result
    assert kcert.verify(cert_b, [other.public_key(), key.public_key()]).verdict.value == "fail"

    change = kcert.diff(path, cert_b)
    assert isinstance(change, kcert.CertificateDiff)
    assert change.regressed and change.verdict is not None
    assert (change.verdict.a, change.verdict.b) == ("pass", "fail")
    assert not kcert.diff(cert_a, kcert.inspect(cert_a)).regressed

    with contextlib.closing(kcert.open_registry(home=tmp_path / "home")) as registry:
        assert isinstance(registry, kcert.EmbeddedRegistry)
        with pytest.raises(kcert.RegistryError):
            registry.push(cert_a)  # nobody trusts the key yet
        kcert.trust_key(registry, key.public_key(), name="ci")
        stored = registry.push(cert_a)
        assert isinstance(stored, kcert.CertificateStored)
        assert stored.created and stored.id == str(verified.id)
        assert not registry.push(cert_a).created
        gate = registry.gate(kcert.Digest.parse(good.kernel.source_digest), "nowhere")
        assert isinstance(gate, kcert.GateDecision) and not gate.allow
