"""``kcert perf`` on a real torch.profiler trace, and the p99 half of the promotion policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner, Result

from kcert.attest.keys import generate_private_key, public_key_hex
from kcert.cli.app import app
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines
from kcert.registry.models import TargetCreate, TrustedKeyCreate
from kcert.registry.testing import gpu_environment, make_certificate

runner = CliRunner()
TARGET = "prod-a"
CALLS = 40


def _run(*args: str) -> Result:
    return runner.invoke(app, list(args))


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedRegistry]:
    for name in ("KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN", "KCERT_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    reg = EmbeddedRegistry(Settings())
    reg.report_target(TARGET, TargetCreate(hw_class="H100", environment=gpu_environment()))
    yield reg
    dispose_engines()


def _trace(path: Path, size: int) -> Path:
    """A real torch.profiler Chrome trace of CALLS matrix products on the CPU."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(size, size)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(CALLS):
            torch.mm(a, a)
    prof.export_chrome_trace(str(path))
    return path


def _certified(reg: EmbeddedRegistry, key: Ed25519PrivateKey) -> str:
    made = make_certificate(key)
    reg.push(made.envelope)
    return made.kernel


def test_ingest_a_real_trace_then_compare(registry: EmbeddedRegistry, tmp_path: Path) -> None:
    fast = _trace(tmp_path / "fast.json", 16)
    slow = _trace(tmp_path / "slow.json", 192)
    before, after = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    # The trace holds cpu_op events on a CPU-only torch; the default (GPU kernels) finds none.
    none = _run("perf", "ingest", str(fast), "--target", TARGET, "--kernel", before)
    assert none.exit_code == 2 and "no kernel events" in none.stderr
    args = ("--target", TARGET, "--category", "cpu_op", "--name", "^aten::mm$", "--json")
    first = _run("perf", "ingest", str(fast), "--kernel", before, *args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["stored"] == CALLS
    again = json.loads(_run("perf", "ingest", str(fast), "--kernel", before, *args).stdout)
    assert again["duplicate"] is True and again["stored"] == 0
    assert _run("perf", "ingest", str(slow), "--kernel", after, *args).exit_code == 0

    result = _run("perf", "compare", "--target", TARGET, "--before", before, "--after", after,
                  "--json", "--resamples", "200")  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["before"]["samples"] == body["after"]["samples"] == CALLS
    p99 = {c["q"]: c for c in body["changes"]}[99.0]
    assert p99["change_pct"] > 0 and p99["low_pct"] <= p99["change_pct"] <= p99["high_pct"]
    for summary in (body["before"], body["after"]):
        for p in summary["percentiles"]:
            assert p["low_us"] <= p["value_us"] <= p["high_us"]
    # Seeded: the same call gives the same intervals.
    assert json.loads(_run("perf", "compare", "--target", TARGET, "--before", before, "--after",
                           after, "--json", "--resamples", "200").stdout) == body  # fmt: skip
    table = _run("perf", "compare", "--target", TARGET, "--before", before, "--after", after,
                 "--resamples", "50")  # fmt: skip
    assert table.exit_code == 0 and "p99" in table.stdout and "%" in table.stdout
    page = tmp_path / "compare.html"
    drawn = _run("perf", "compare", "--target", TARGET, "--before", before, "--after", after,
                 "--resamples", "50", "--html", str(page))  # fmt: skip
    assert drawn.exit_code == 0 and "p99" in drawn.stdout, drawn.output
    html = page.read_text(encoding="utf-8")
    assert html.count('class="cdf"') == 2 and "<script" not in html and before in html
    nowhere = _run("perf", "compare", "--target", TARGET, "--before", before, "--after", after,
                   "--html", str(tmp_path / "no" / "such" / "dir.html"))  # fmt: skip
    assert nowhere.exit_code == 2 and "Traceback" not in nowhere.output


def test_jsonl_and_bad_input(registry: EmbeddedRegistry, tmp_path: Path) -> None:
    good = tmp_path / "s.jsonl"
    good.write_text("\n".join(json.dumps({"name": "k", "start_us": i, "dur_us": 5.0 + i})
                              for i in range(10)) + "\n")  # fmt: skip
    kernel = "sha256:" + "c" * 64
    ok = _run("perf", "ingest", str(good), "--target", TARGET, "--kernel", kernel, "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["stored"] == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "k", "start_us": 0, "dur_us": -1}\n')
    refused = _run("perf", "ingest", str(bad), "--target", TARGET, "--kernel", kernel)
    assert refused.exit_code == 2 and "line 1" in refused.stderr
    nowhere = _run("perf", "ingest", str(good), "--target", "nowhere", "--kernel", kernel)
    assert nowhere.exit_code == 2 and "Traceback" not in nowhere.output
    regex = _run("perf", "ingest", str(good), "--target", TARGET, "--kernel", kernel,
                 "--name", "(")  # fmt: skip
    assert regex.exit_code == 2


@pytest.mark.parametrize(
    "trace",
    [
        b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's stack
        b'{"traceEvents": [{"ph": "X", "dur": ' + b"9" * 5000 + b"}]}",  # past the digit limit
        b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1'
        + b"0" * 400
        + b"}]}",  # past float's range
    ],
    ids=["deep", "digits", "overflow"],
)
def test_a_hostile_chrome_trace_is_refused_cleanly(
    registry: EmbeddedRegistry, tmp_path: Path, trace: bytes
) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(trace)
    kernel = "sha256:" + "c" * 64
    refused = _run("perf", "ingest", str(path), "--target", TARGET, "--kernel", kernel)
    assert refused.exit_code == 2, refused.output
    assert "Traceback" not in refused.output and "error" in refused.stderr


def _samples(path: Path, dur: float, n: int) -> Path:
    path.write_text("\n".join(json.dumps({"name": "k", "start_us": i, "dur_us": dur + i % 3})
                              for i in range(n)))  # fmt: skip
    return path


def test_a_p99_regression_denies_the_promotion_and_replays(
    registry: EmbeddedRegistry, tmp_path: Path
) -> None:
    key = generate_private_key()
    registry.trust_key(TrustedKeyCreate(name="ci", public_key=public_key_hex(key.public_key())))
    old, new = _certified(registry, key), _certified(registry, key)
    policy = _run("target", "policy", TARGET, "--max-p99-regression-pct", "10",
                  "--min-samples", "20", "--json")  # fmt: skip
    assert policy.exit_code == 0, policy.output
    # Too few samples: the registry cannot tell, and fails closed.
    few = _run("promote", "--kernel", new, "--target", TARGET, "--replaces", old, "--json")
    assert few.exit_code == 1 and "too few latency samples" in few.stdout
    for kernel, dur, name in ((old, 100.0, "old"), (new, 150.0, "new")):
        path = _samples(tmp_path / f"{name}.jsonl", dur, 50)
        assert _run("perf", "ingest", str(path), "--target", TARGET,
                    "--kernel", kernel).exit_code == 0  # fmt: skip
    denied = _run("promote", "--kernel", new, "--target", TARGET, "--replaces", old, "--json")
    assert denied.exit_code == 1, denied.output
    body: dict[str, Any] = json.loads(denied.stdout)
    assert any(r.startswith("p99-regression: p99") for r in body["reasons"]), body
    replay = _run("audit", "replay", str(body["log_index"]), "--json")
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.stdout)["same"] is True
    # The first kernel of its name on the target: nothing to compare against.
    first = _run("promote", "--kernel", old, "--target", TARGET, "--json")
    assert first.exit_code == 0, first.output
    # Leaving out --replaces does not skip the limit: the active kernel of that name is
    # the yardstick, and the leaf says so.
    implied = _run("promote", "--kernel", new, "--target", TARGET, "--json")
    assert implied.exit_code == 1, implied.output
    body = json.loads(implied.stdout)
    assert any(r.startswith("p99-regression: p99") and f"{old}, the target's active "
               "promotion of that name" in r for r in body["reasons"]), body
    leaf = _run("audit", "replay", str(body["log_index"]), "--json")
    assert leaf.exit_code == 0 and json.loads(leaf.stdout)["same"] is True
    # A faster kernel passes the policy, named or implied.
    faster = _certified(registry, key)
    path = _samples(tmp_path / "faster.jsonl", 90.0, 50)
    assert _run("perf", "ingest", str(path), "--target", TARGET, "--kernel", faster).exit_code == 0
    assert _run("promote", "--kernel", faster, "--target", TARGET).exit_code == 0
    assert _run("promote", "--kernel", faster, "--target", TARGET, "--replaces",
                old).exit_code == 0  # fmt: skip
    state = _run("audit", "replay", "--all", "--allow-unverified", "--json")
    assert state.exit_code == 0, state.output


def test_token_create_binds_an_observations_token_to_its_targets(
    registry: EmbeddedRegistry,
) -> None:
    unbound = _run("token", "create", "--scope", "observations:write")
    assert unbound.exit_code == 2
    assert unbound.stdout == "" and "targets" in unbound.output  # no token was shown
    made = _run("token", "create", "--scope", "observations:write", "--target", TARGET,
                "--target", "prod-b", "--json")  # fmt: skip
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["targets"] == [TARGET, "prod-b"]
    every = _run("token", "create", "--scope", "observations:write", "--all-targets", "--json")
    assert every.exit_code == 0 and json.loads(every.stdout)["targets"] is None
    both = _run("token", "create", "--scope", "observations:write", "--all-targets",
                "--target", TARGET)  # fmt: skip
    assert both.exit_code == 2 and "Traceback" not in both.output
