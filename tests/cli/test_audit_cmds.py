"""``kcert audit verify`` and ``kcert audit replay`` on the embedded registry, in-process.

The registry is driven through its own library (keys, certificates, targets,
promotions), so the log holds exactly what a real registry writes, then
tampered with directly in the database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, text
from typer.testing import CliRunner, Result

from kcert.cli.app import app
from kcert.digest import Digest
from kcert.errors import KcertError
from kcert.log.note import Checkpoint, Signer
from kcert.registry import audit
from kcert.registry.certificates import store_certificate
from kcert.registry.db import dispose_engines, make_engine, migrate, read_session, write_session
from kcert.registry.decisions import promote
from kcert.registry.keys import trust_key
from kcert.registry.models import TargetCreate, TrustedKeyCreate
from kcert.registry.policy import PromotionInputs, decide_promotion
from kcert.registry.targets import report_target
from kcert.registry.testing import gpu_environment, make_certificate


@dataclass
class Registry:
    home: Path
    engine: Engine
    decisions: list[int]


def _raw(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        .hex()
    )


def _decision_indices(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT leaf_index FROM log_entry WHERE kind LIKE 'promotion.%' ORDER BY 1")
        )
        return [int(r[0]) for r in rows]


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """An embedded registry that went through a whole flow: grant, drift, suspend, deny."""
    home = tmp_path / "kcert-home"
    for name in ("KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(home))
    engine = make_engine(f"sqlite:///{home / 'registry.db'}")
    migrate(engine)
    key = Ed25519PrivateKey.generate()
    cert = make_certificate(key)
    kernel = Digest.parse(cert.kernel)
    with write_session(engine) as s:
        trust_key(session=s, key=TrustedKeyCreate(name="ci", public_key=_raw(key)))
    with write_session(engine) as s:
        store_certificate(session=s, envelope=cert.envelope)
    with write_session(engine) as s:
        report_target(
            session=s,
            name="fleet",
            report=TargetCreate(hw_class="H100", environment=gpu_environment()),
        )
    with write_session(engine) as s:
        promote(session=s, kernel=kernel, target="fleet")
    with write_session(engine) as s:
        drifted = gpu_environment(driver_version="999.1")
        report_target(
            session=s, name="fleet", report=TargetCreate(hw_class="H100", environment=drifted)
        )
    with write_session(engine) as s, pytest.raises(KcertError):
        promote(session=s, kernel=kernel, target="fleet")
    yield Registry(home, engine, _decision_indices(engine))
    engine.dispose()
    dispose_engines()


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, ["audit", *args])


def _json(result: Result) -> dict[str, Any]:
    value = json.loads(result.stdout)
    assert isinstance(value, dict)
    return value


def test_the_flow_logged_every_decision(registry: Registry) -> None:
    with registry.engine.connect() as conn:
        kinds = [r[0] for r in conn.execute(text("SELECT kind FROM log_entry ORDER BY leaf_index"))]
    assert kinds.count("promotion.granted") == 1
    assert kinds.count("promotion.suspended") == 1
    assert kinds.count("promotion.denied") == 1
    assert {"key.trusted", "certificate.stored", "target.reported"} <= set(kinds)


def test_verify_refuses_without_a_pinned_key(registry: Registry) -> None:
    result = _run("verify")
    assert result.exit_code == 2
    assert "--trust-on-first-use" in result.stderr


def test_verify_pins_on_first_use_then_passes_and_remembers(registry: Registry) -> None:
    first = _run("verify", "--trust-on-first-use", "--json")
    assert first.exit_code == 0, first.output
    body = _json(first)
    assert body["ok"] is True and body["pinned_now"] is True
    with write_session(registry.engine) as s:
        audit.record_event(s, "key.trusted", {"keyid": "later"})
        s.commit()
    second = _run("verify", "--json")
    assert second.exit_code == 0, second.output
    assert _json(second)["consistent_with"] == ["the last audited checkpoint"]
    assert "OK" in _run("verify").stdout


@pytest.mark.parametrize("tamper", ["edit", "drop", "swap"])
def test_verify_names_the_first_bad_index(registry: Registry, tamper: str) -> None:
    assert _run("verify", "--trust-on-first-use").exit_code == 0
    bad = registry.decisions[0]
    with registry.engine.begin() as conn:
        if tamper == "edit":
            leaf = bytes(
                conn.execute(
                    text("SELECT leaf FROM log_entry WHERE leaf_index = :i"), {"i": bad}
                ).scalar_one()
            )
            edited = leaf.replace(b'"allow":true', b'"allow":false')
            assert edited != leaf
            conn.execute(
                text("UPDATE log_entry SET leaf = :l WHERE leaf_index = :i"),
                {"l": edited, "i": bad},
            )
        elif tamper == "drop":
            conn.execute(text("DELETE FROM log_entry WHERE leaf_index = :i"), {"i": bad})
        else:
            conn.execute(
                text("UPDATE log_entry SET leaf_index = -1 WHERE leaf_index = :i"), {"i": bad}
            )
            conn.execute(
                text("UPDATE log_entry SET leaf_index = :i WHERE leaf_index = :j"),
                {"i": bad, "j": bad + 1},
            )
            conn.execute(
                text("UPDATE log_entry SET leaf_index = :j WHERE leaf_index = -1"), {"j": bad + 1}
            )
    result = _run("verify", "--json")
    assert result.exit_code == 1, result.output
    assert _json(result)["first_bad_index"] == bad
    assert f"first bad index {bad}" in _run("verify").stdout


def _write_checkpoint(path: Path, note: str) -> Path:
    path.write_text(note, encoding="utf-8")
    return path


def test_verify_checks_a_given_checkpoint(registry: Registry, tmp_path: Path) -> None:
    assert _run("verify", "--trust-on-first-use").exit_code == 0
    with registry.engine.connect() as conn:
        size = conn.execute(text("SELECT size FROM log_state")).scalar_one()
    signer = audit.log_signer(registry.home)
    with read_session(registry.engine) as s:
        good = audit.signed_checkpoint(s, signer)
    assert (
        _run("verify", "--checkpoint", str(_write_checkpoint(tmp_path / "good", good))).exit_code
        == 0
    )
    edited_size = good.replace(f"\n{size}\n", f"\n{size - 1}\n")
    path = _write_checkpoint(tmp_path / "edited", edited_size)
    assert _run("verify", "--checkpoint", str(path)).exit_code == 1
    forged = Checkpoint(signer.name, size, bytes(32)).sign(
        Signer(signer.name, Ed25519PrivateKey.generate())
    )
    path = _write_checkpoint(tmp_path / "forged", forged)
    result = _run("verify", "--checkpoint", str(path), "--json")
    assert result.exit_code == 1 and "no signature by the pinned key" in result.stdout
    assert _run("verify", "--checkpoint", str(tmp_path / "missing")).exit_code == 2


def test_verify_with_the_wrong_key_fails(registry: Registry, tmp_path: Path) -> None:
    other = Signer(audit.log_signer(registry.home).name, Ed25519PrivateKey.generate())
    key = tmp_path / "log.vkey"
    key.write_text(other.verifier.vkey())
    result = _run("verify", "--key", str(key), "--json")
    assert result.exit_code == 1
    assert _json(result)["ok"] is False
    # Now pinned: a different --key is refused rather than silently re-pinned.
    right = tmp_path / "right.vkey"
    right.write_text(audit.log_signer(registry.home).verifier.vkey())
    assert _run("verify", "--key", str(right)).exit_code == 2


def test_verify_without_a_registry_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCERT_DATABASE_URL", raising=False)
    monkeypatch.delenv("KCERT_REGISTRY", raising=False)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "empty"))
    result = _run("verify", "--json")
    assert result.exit_code == 2
    assert _json(result)["error"]["type"] == "usage"


def test_replay_reproduces_every_decision_of_the_flow(registry: Registry) -> None:
    assert _run("verify", "--trust-on-first-use").exit_code == 0
    assert len(registry.decisions) == 3
    for index in registry.decisions:
        result = _run("replay", str(index), "--json")
        assert result.exit_code == 0, result.output
        body = _json(result)
        assert body["same"] is True and body["included"] is True
        assert body["objects"] and all(o["status"] == "same" for o in body["objects"])


def test_replay_of_an_altered_decision_differs(registry: Registry) -> None:
    granted = registry.decisions[0]
    with registry.engine.begin() as conn:
        leaf = bytes(
            conn.execute(
                text("SELECT leaf FROM log_entry WHERE leaf_index = :i"), {"i": granted}
            ).scalar_one()
        )
        edited = leaf.replace(b'"allow":true', b'"allow":false')
        conn.execute(
            text("UPDATE log_entry SET leaf = :l WHERE leaf_index = :i"),
            {"l": edited, "i": granted},
        )
    result = _run("replay", str(granted), "--json")
    assert result.exit_code == 1
    body = _json(result)
    assert body["same"] is False
    assert any(str(d).startswith("allow:") for d in body["differences"])


def test_replay_refuses_what_is_not_a_decision(registry: Registry) -> None:
    assert _run("replay", "0").exit_code == 2
    assert _run("replay", "9999").exit_code == 2


def test_rerun_without_a_gpu_says_so(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from kcert.certify import environment

    monkeypatch.setattr(environment, "gpu_status", lambda: (False, "no CUDA driver is loaded"))
    result = _run("replay", str(registry.decisions[0]), "--rerun")
    assert result.exit_code == 2
    assert "needs a GPU" in result.stderr and "no CUDA driver" in result.stderr


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "triton"


@pytest.fixture
def cpu_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Registry, Path]]:
    """An embedded registry holding a real CPU certificate of the saxpy example, promoted."""
    yield from _promoted_example(tmp_path, monkeypatch, EXAMPLES, "triton-interpreter")


def _promoted_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, examples: Path, executor: str,
) -> Iterator[tuple[Registry, Path]]:  # fmt: skip
    """A registry holding a real certificate of ``examples``' saxpy, promoted to its target."""
    import shutil

    from kcert.attest.certificate import sign_report
    from kcert.certify.pipeline import CertifyOptions, certify
    from kcert.certify.spec import resolve_kernel

    home = tmp_path / "kcert-home"
    for name in ("KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(home))
    spec_dir = tmp_path / "kernels"
    shutil.copytree(examples, spec_dir)
    kernel = resolve_kernel(spec_dir / "kcert.toml", "saxpy")
    options = CertifyOptions(executor=executor, timing=False, minimize=False)
    report = certify(kernel, options)
    failed = [f"{c.name}: {c.message}" for c in report.checks if c.status == "fail"]
    assert not failed, failed
    key = Ed25519PrivateKey.generate()
    envelope = sign_report(report, key)
    engine = make_engine(f"sqlite:///{home / 'registry.db'}")
    migrate(engine)
    with write_session(engine) as s:
        trust_key(session=s, key=TrustedKeyCreate(name="cpu-ci", public_key=_raw(key)))
    with write_session(engine) as s:
        store_certificate(session=s, envelope=envelope)
    with write_session(engine) as s:
        report_target(
            session=s, name="laptops",
            report=TargetCreate(hw_class=report.hw_class, environment=dict(report.environment)),
        )  # fmt: skip
    try:
        with write_session(engine) as s:
            promote(session=s, kernel=Digest.parse(report.kernel.source_digest), target="laptops")
    except KcertError as exc:
        pytest.fail(f"{exc}: {getattr(exc, 'reasons', '')}")
    yield Registry(home, engine, _decision_indices(engine)), spec_dir
    engine.dispose()
    dispose_engines()


@pytest.mark.slow
def test_rerun_reproduces_every_anchor_then_names_reference_drift(
    cpu_registry: tuple[Registry, Path],
) -> None:
    registry, spec_dir = cpu_registry
    (granted,) = registry.decisions
    args = ("replay", str(granted), "--rerun", "--spec", str(spec_dir / "kcert.toml"))
    result = _run(*args, "--kernel", "saxpy", "--json")
    assert result.exit_code == 0, result.output
    body = _json(result)
    assert body["same"] is True and body["rerun"] == []
    # The NumPy reference now computes something else: only reference anchors move.
    reference = spec_dir / "reference.py"
    reference.write_text(
        reference.read_text().replace(
            "return (np.float64(a) * x_ptr.astype(np.float64) + y_ptr).astype(np.float32)",
            "return (np.float64(a) * x_ptr.astype(np.float64) + y_ptr + 1.0).astype(np.float32)",
        )
    )
    result = _run(*args, "--kernel", "saxpy", "--json")
    assert result.exit_code == 1, result.output
    drift = _json(result)["rerun"]
    causes = {d["cause"] for d in drift}
    assert "reference drift" in causes
    # Kernel outputs and inputs are untouched; the certifier skips fresh probes once
    # fixed ones fail (here: against the drifted reference), which is named too.
    assert causes <= {"reference drift", "probe not re-run"}
    assert all(d["role"] == "reference" for d in drift if d["cause"] == "reference drift")


@pytest.fixture
def served(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The same registry behind its HTTP API; the CLI reaches it in-process."""
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from kcert.api.app import create_app
    from kcert.cli import audit_cmds
    from kcert.log.source import HttpLogSource
    from kcert.registry.config import Settings

    settings = Settings(
        home=registry.home,
        database_url=str(registry.engine.url),
        admin_token=SecretStr("s3cret-admin"),
    )
    with TestClient(create_app(settings, engine=registry.engine)) as client:
        monkeypatch.setattr(
            audit_cmds,
            "HttpLogSource",
            lambda url, **kw: HttpLogSource(url, client=client, **kw),
        )
        monkeypatch.setenv("KCERT_TOKEN", "s3cret-admin")
        yield registry


def test_verify_and_replay_a_live_registry_over_http(served: Registry) -> None:
    url = ("--registry", "http://testserver")
    assert _run("verify", *url).exit_code == 2  # nothing pinned for this registry yet
    first = _run("verify", *url, "--trust-on-first-use", "--json")
    assert first.exit_code == 0, first.output
    assert _json(first)["log"] == "http://testserver"
    for index in served.decisions:
        result = _run("replay", str(index), *url, "--json")
        assert result.exit_code == 0, result.output
        body = _json(result)
        assert body["included"] is True
        assert [o["status"] for o in body["objects"]] == ["same"]
    bad = served.decisions[-1]
    with served.engine.begin() as conn:
        conn.execute(text("DELETE FROM log_entry WHERE leaf_index = :i"), {"i": bad})
    result = _run("verify", *url, "--json")
    assert result.exit_code == 1
    assert _json(result)["first_bad_index"] == bad


def test_replay_of_a_damaged_entry_is_a_finding(registry: Registry) -> None:
    granted = registry.decisions[0]
    with registry.engine.begin() as conn:
        conn.execute(
            text("UPDATE log_entry SET leaf = :l WHERE leaf_index = :i"), {"l": b"{}", "i": granted}
        )
    result = _run("replay", str(granted), "--json")
    assert result.exit_code == 1
    assert "cannot be replayed" in _json(result)["error"]["detail"]


def _append_decision(registry: Registry, kind: str, payload: dict[str, Any]) -> int:
    with write_session(registry.engine) as s:
        index = audit.record_event(s, kind, payload)
        s.commit()
    return index


def _granted_payload(registry: Registry) -> dict[str, Any]:
    with registry.engine.connect() as conn:
        leaf = conn.execute(
            text("SELECT leaf FROM log_entry WHERE leaf_index = :i"), {"i": registry.decisions[0]}
        ).scalar_one()
    payload: dict[str, Any] = json.loads(bytes(leaf))["payload"]
    return payload


def test_a_grant_logged_before_the_sandbox_check_still_replays_the_same(
    registry: Registry,
) -> None:
    """A leaf as kcert wrote it under policy kcert-promotion/1: no "sandboxed" anywhere."""
    payload = _granted_payload(registry)
    assert payload["inputs"]["candidates"][0]["sandboxed"] is True  # what is written today
    for candidate in payload["inputs"]["candidates"]:
        del candidate["sandboxed"]
    payload["inputs"]["policy_version"] = "kcert-promotion/1"
    payload["decision"]["policy_version"] = "kcert-promotion/1"
    index = _append_decision(registry, "promotion.granted", payload)
    result = _run("replay", str(index), "--json")
    assert result.exit_code == 0, result.output
    body = _json(result)
    assert body["same"] is True and body["replayed"]["allow"] is True
    assert body["objects"] and all(o["status"] == "same" for o in body["objects"])


def test_replay_names_a_recorded_sandbox_the_certificate_does_not_carry(
    registry: Registry,
) -> None:
    payload = _granted_payload(registry)
    payload["inputs"]["candidates"][0]["sandboxed"] = False
    # A consistent leaf (the decision follows from its inputs) about the wrong certificate.
    payload["decision"] = decide_promotion(PromotionInputs.from_json(payload["inputs"])).to_json()
    index = _append_decision(registry, "promotion.denied", payload)
    result = _run("replay", str(index), "--json")
    assert result.exit_code == 1
    body = _json(result)
    assert body["differences"] == [] and body["replayed"]["allow"] is False
    (obj,) = body["objects"]
    assert obj["status"] == "differs"
    assert "sandboxed: recorded False, certificate True" in obj["notes"]


@pytest.mark.gpu
@pytest.mark.parametrize("language", ["cuda", "triton"])
def test_rerun_on_the_gpu_reproduces_every_anchor(
    language: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A GPU certificate made here, promoted, replayed with --rerun: same anchors, SAME."""
    examples = EXAMPLES.parent / language
    for registry, spec_dir in _promoted_example(tmp_path, monkeypatch, examples, language):
        (granted,) = registry.decisions
        result = _run("replay", str(granted), "--rerun", "--spec", str(spec_dir / "kcert.toml"),
                      "--kernel", "saxpy", "--json")  # fmt: skip
        assert result.exit_code == 0, result.output
        body = _json(result)
        assert body["same"] is True and body["rerun"] == [], body


def test_replay_all_follows_every_decision_from_the_history_before_it(
    registry: Registry,
) -> None:
    # The embedded registry proves its leaves with its own log key and checkpoint file.
    first = _run("replay", "--all", "--json")
    assert first.exit_code == 0, first.output
    checkpoint = registry.home / "log-checkpoint"
    assert _run("verify", "--trust-on-first-use").exit_code == 0
    result = _run("replay", "--all", "--json")
    assert result.exit_code == 0, result.output
    body = _json(result)
    assert body == {
        "same": True, "decisions": 3, "differences": [], "log": [], "unverified": [],
        "proved_against": ["the log's signed checkpoint (size 8)",
                           f"the server's last signed checkpoint ({checkpoint}) (size 8)",
                           "the last audited checkpoint (size 8)"],
    }, body  # fmt: skip
    assert _run("replay").exit_code == 2
    assert _run("replay", "1", "--all").exit_code == 2
    # The grant logged again after the drift: its inputs are no longer the log's state.
    granted = registry.decisions[0]
    with read_session(registry.engine) as s:
        (record,) = audit.read_entries(s, granted, granted + 1)
    payload = json.loads(record.leaf)["payload"]
    with write_session(registry.engine) as s:
        index = audit.record_event(s, "promotion.granted", payload)
        s.commit()
    result = _run("replay", "--all")
    assert result.exit_code == 1
    assert f"entry {index} (promotion.granted): target_fingerprint: recorded" in result.stdout
    assert "decision: recorded allow" in result.stdout


def test_replay_all_over_http(served: Registry) -> None:
    url = ("--registry", "http://testserver")
    # Nothing pinned to prove the leaves with: unverified, which fails unless accepted.
    unproved = _run("replay", "--all", *url, "--json")
    assert unproved.exit_code == 1, unproved.output
    assert [u["kind"] for u in _json(unproved)["unverified"]] == ["log"]
    assert _run("replay", "--all", *url, "--allow-unverified").exit_code == 0
    assert _run("verify", *url, "--trust-on-first-use").exit_code == 0
    result = _run("replay", "--all", *url, "--json")
    assert result.exit_code == 0, result.output
    assert _json(result)["decisions"] == 3
    assert _json(result)["proved_against"][0] == "the log's signed checkpoint (size 8)"
