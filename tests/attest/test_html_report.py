"""``kcert report``: the HTML page, its escaping, its signature banner, and the profile's size."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from attest_report_factory import make_probe, make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from html_samples import HOSTILE, profiled, sample_report
from typer.testing import CliRunner

from kcert.attest.certificate import (
    CertificateContents,
    inspect_envelope,
    read_certificate,
    sign_report,
    write_certificate,
)
from kcert.attest.errors import VerificationError
from kcert.attest.html_report import render_html
from kcert.attest.keys import (
    generate_private_key,
    key_id,
    load_private_key,
    public_key_hex,
    write_keypair,
)
from kcert.attest.statement import validate_predicate
from kcert.certify.report import CertificationReport, ErrorProfile
from kcert.cli.app import app


def _contents(report: CertificationReport) -> CertificateContents:
    return inspect_envelope(sign_report(report, generate_private_key()))


def test_page_shows_verdict_checks_environment_and_a_plot_per_profiled_output() -> None:
    page = render_html(inspect_envelope(sign_report(sample_report(), generate_private_key())),
                       keyid=None)  # fmt: skip
    assert page.startswith("<!DOCTYPE html>")
    assert 'class="verdict fail">FAIL<' in page
    for name in ("build", "correctness", "timing", "special-values"):
        assert f"<td>{name}</td>" in page
    assert "NVIDIA H100 80GB HBM3" in page and "Environment" in page
    assert page.count("<svg") == 2  # one bar chart, one heat map
    assert "flattened output index (1000 elements, 64 bins)" in page
    assert "48 rows, 32 bins" in page and "64 columns, 32 bins" in page
    assert "no profile recorded" in page  # the probe without a profile still renders
    # the failing tail of the vector and the failing bottom row of the matrix are marked
    assert "elements 984\u2013999: FAIL: NaN, Inf or never written" in page
    assert "elements 500\u2013514: FAIL: max err/allowed &gt; 1.8e+03<" in page
    assert "rows 46\u201347, cols 10\u201311: FAIL: max err/allowed &gt; 1.8e+03<" in page
    assert "rows 19\u201320, cols 40\u201341: FAIL: NaN, Inf or never written<" in page
    assert page.count("FAIL: ") == 4  # every other bin passes
    assert "Signature not verified" in page


def test_page_is_self_contained_and_has_no_script() -> None:
    page = render_html(_contents(sample_report()), keyid=None)
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "default-src 'none'" in page  # CSP: nothing may be fetched


def test_everything_from_the_certificate_is_escaped() -> None:
    report = sample_report(message=HOSTILE)
    kernel = dataclasses.replace(report.kernel, name="k<b>x</b>", entry="e\"onload=\"x")
    probe = dataclasses.replace(report.probes[0], id="<svg onload=alert(2)>",
                                dims={"<i>n": 3})  # fmt: skip
    report = dataclasses.replace(report, kernel=kernel, probes=(probe, *report.probes[1:]),
                                 environment={"gpu_name": HOSTILE})  # fmt: skip
    page = render_html(_contents(report), keyid=None)
    assert "<script" not in page.lower() and "<img" not in page and "<b>x" not in page
    assert "<svg onload" not in page and "<i>n" not in page and 'onload="x' not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "k&lt;b&gt;x&lt;/b&gt;" in page


def test_a_profile_that_does_not_add_up_is_reported_not_drawn() -> None:
    report = sample_report()
    bad = ErrorProfile(extent=(10,), bins=(4,), levels="AAA")
    probe = report.probes[0]
    metrics = {k: dataclasses.replace(m, profile=bad) for k, m in probe.metrics.items()}
    report = dataclasses.replace(report, probes=(dataclasses.replace(probe, metrics=metrics),))
    page = render_html(_contents(report), keyid=None)
    assert "profile unreadable: profile of 3 levels does not fill [4] bins" in page


def test_forty_probes_with_full_profiles_grow_a_certificate_by_less_than_60_kb() -> None:
    """The worst case the budget allows: every probe a matrix with 1024 bins."""
    key = generate_private_key()
    bare = tuple(dataclasses.replace(make_probe(n), id=f"m={n},n={n}") for n in range(40))
    full = tuple(profiled(p, (300, 300), bad=(7,)) for p in bare)
    assert all(len(next(iter(p.metrics.values())).profile.levels) == 1024  # type: ignore[union-attr]
               for p in full)  # fmt: skip
    size = {label: len(sign_report(make_report(probes=probes, failing={}), key).to_bytes())
            for label, probes in (("bare", bare), ("full", full))}  # fmt: skip
    growth = size["full"] - size["bare"]
    assert 40 * 1024 < growth < 60 * 1024, size


runner = CliRunner()


@pytest.fixture
def cert_and_key(tmp_path: Path) -> tuple[Path, Path, Ed25519PrivateKey]:
    pair = write_keypair(tmp_path / "key", passphrase=None)
    private = load_private_key(pair.private_path, passphrase=None)
    cert = tmp_path / "k.cert.json"
    write_certificate(cert, sign_report(sample_report(HOSTILE), private))
    return cert, pair.public_path, private


def test_cli_writes_the_page_and_says_the_signature_was_not_checked(
    tmp_path: Path, cert_and_key: tuple[Path, Path, Ed25519PrivateKey]
) -> None:
    cert, _, _ = cert_and_key
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(cert), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "signature not verified" in result.output
    page = out.read_text("utf-8")
    assert "Signature not verified" in page and "<script" not in page.lower()
    result = runner.invoke(app, ["report", str(cert), "--json"])
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["signature_verified"] is False and summary["verdict"] == "fail"
    assert summary["id"] == str(inspect_envelope(read_certificate(cert)).id)


def test_cli_verifies_with_key_and_refuses_a_wrong_one(
    tmp_path: Path, cert_and_key: tuple[Path, Path, Ed25519PrivateKey]
) -> None:
    cert, public, private = cert_and_key
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(cert), "--key", str(public), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text("utf-8")
    assert f"Signature verified with key {key_id(private.public_key())}" in page
    assert "Signature not verified" not in page
    other = write_keypair(tmp_path / "other", passphrase=None)
    out.unlink()
    result = runner.invoke(app, ["report", str(cert), "--key", str(other.public_path),
                                 "--html", str(out)])  # fmt: skip
    assert result.exit_code == 1 and "invalid" in result.output
    assert not out.exists()  # nothing written for a certificate that is not valid
    assert public_key_hex(private.public_key()) not in result.output


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    for args in (["report", str(tmp_path / "missing.json"), "--html", str(out)],
                 ["report", str(junk), "--html", str(out)]):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and "error:" in result.output
    assert not out.exists()
    cert = tmp_path / "k.cert.json"
    write_certificate(cert, sign_report(sample_report(), generate_private_key()))
    result = runner.invoke(app, ["report", str(cert), "--html", str(tmp_path / "no" / "x.html")])
    assert result.exit_code == 2 and "cannot write HTML report" in result.output


def test_the_schema_checks_a_recorded_profile() -> None:
    predicate = json.loads(json.dumps(sample_report().predicate()))
    validate_predicate(predicate)
    profile = predicate["probes"]["items"][0]["metrics"]["y"]["profile"]
    assert profile == {"extent": [1000], "shape": [64], "levels": profile["levels"]}
    for key, value in (("levels", "AB<"), ("shape", [65]), ("extra", 1)):
        broken = json.loads(json.dumps(predicate))
        broken["probes"]["items"][0]["metrics"]["y"]["profile"][key] = value
        with pytest.raises(VerificationError, match="profile"):
            validate_predicate(broken)


def test_a_certificate_full_of_profiles_draws_a_bounded_page() -> None:
    """The schema bounds each profile, not their number: a page draws at most MAX_DRAWN_BINS."""
    from kcert.attest.html_report import MAX_DRAWN_BINS

    report = sample_report()
    probe = report.probes[0]
    metric = next(iter(probe.metrics.values()))
    full = ErrorProfile(extent=(32, 32), bins=(32, 32), levels="z" * 1024)
    outputs = MAX_DRAWN_BINS // 1024 + 20
    metrics = {f"o{i}": dataclasses.replace(metric, profile=full) for i in range(outputs)}
    report = dataclasses.replace(report, probes=(dataclasses.replace(probe, metrics=metrics),))
    page = render_html(_contents(report), keyid=None)
    assert page.count('class="cell"') == MAX_DRAWN_BINS
    assert page.count(f"not drawn: the page already shows {MAX_DRAWN_BINS} bins") == 20
