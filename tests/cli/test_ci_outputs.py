"""``--junit`` and ``--sarif`` of ``kcert lint`` and ``kcert certify``, and certify of many kernels.

The SARIF output is validated against the official SARIF 2.1.0 schema
(tests/assets/sarif); the JUnit output is parsed and its counts checked
against the checks the command reported in its own ``--json``.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner, Result

from kcert.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (pip install 'kcert[triton]')")
SCHEMA = json.loads((ROOT / "tests" / "assets" / "sarif" / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def sarif_results(path: Path) -> list[dict[str, Any]]:
    log = json.loads(path.read_text())
    jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(log)
    assert log["version"] == "2.1.0"
    run_ = log["runs"][0]
    rules = [r["id"] for r in run_["tool"]["driver"]["rules"]]
    for result in run_["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]
    results: list[dict[str, Any]] = run_["results"]
    return results


def where(result: dict[str, Any]) -> tuple[str, int, int | None]:
    physical = result["locations"][0]["physicalLocation"]
    region = physical["region"]
    return physical["artifactLocation"]["uri"], region["startLine"], region.get("startColumn")


def junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    cases = root.findall("testsuite/testcase")
    counted = {
        "tests": len(cases),
        "failures": sum(c.find("failure") is not None for c in cases),
        "errors": sum(c.find("error") is not None for c in cases),
        "skipped": sum(c.find("skipped") is not None for c in cases),
    }
    # the totals the file declares are the ones its cases show
    assert {k: int(root.get(k, "-1")) for k in counted} == counted
    for suite in root.findall("testsuite"):
        assert int(suite.get("tests", "-1")) == len(suite.findall("testcase"))
    return counted


def expected_counts(checks: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "tests": len(checks),
        "failures": sum(c["status"] == "fail" and c["required"] for c in checks),
        "errors": 0,
        "skipped": sum(c["status"] == "skip" for c in checks),
    }


# ---------------------------------------------------------------------------- lint


def test_lint_places_an_nvrtc_error_at_its_line_and_column(tmp_path: Path) -> None:
    folder = tmp_path / "cuda"
    shutil.copytree(EXAMPLES / "cuda", folder)
    source = folder / "saxpy.cu"
    text = source.read_text()
    broken = text.replace("fmaf(a, x[i]", "fmaf(a, xq[i]", 1)
    assert broken != text
    source.write_text(broken)
    line = next(i for i, t in enumerate(broken.splitlines(), 1) if "xq[i]" in t)
    column = broken.splitlines()[line - 1].index("xq[i]") + 1
    spec = folder / "kcert.toml"
    result = run("lint", str(spec), "--kernel", "saxpy", "--json",
                 "--sarif", "lint.sarif", "--junit", "lint.xml")  # fmt: skip
    assert result.exit_code == 1, result.output
    checks = json.loads(result.stdout)["kernels"][0]["checks"]
    assert junit_counts(tmp_path / "lint.xml") == expected_counts(checks) == {
        "tests": 2, "failures": 1, "errors": 0, "skipped": 1}
    failure = ET.parse(tmp_path / "lint.xml").getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("type") == "build"
    assert 'identifier "xq" is undefined' in (failure.text or "")
    results = sarif_results(tmp_path / "lint.sarif")
    assert [(r["ruleId"], r["level"]) for r in results] == [("build", "error")]
    assert where(results[0]) == ("cuda/saxpy.cu", line, column)
    assert 'identifier "xq" is undefined' in results[0]["message"]["text"]


@needs_triton
def test_lint_places_a_triton_compile_error_at_its_line_and_column(tmp_path: Path) -> None:
    folder = tmp_path / "triton"
    shutil.copytree(EXAMPLES / "triton", folder)
    source = folder / "saxpy.py"
    text = source.read_text()
    broken = text.replace("tl.load(x_ptr", "tl.load(xx_ptr", 1)
    assert broken != text
    source.write_text(broken)
    line = next(i for i, t in enumerate(broken.splitlines(), 1) if "xx_ptr" in t)
    column = broken.splitlines()[line - 1].index("xx_ptr") + 1
    result = run("lint", str(source), "--sarif", str(tmp_path / "t.sarif"))
    assert result.exit_code == 1, result.output
    results = sarif_results(tmp_path / "t.sarif")
    assert [(r["ruleId"], r["level"]) for r in results] == [("build", "error")]
    assert where(results[0]) == ("triton/saxpy.py", line, column)
    assert "xx_ptr is not defined" in results[0]["message"]["text"]


def test_a_line_directive_cannot_point_a_finding_at_another_file(tmp_path: Path) -> None:
    folder = tmp_path / "cuda"
    shutil.copytree(EXAMPLES / "cuda", folder)
    source = folder / "saxpy.cu"
    text = source.read_text()
    # the log now blames /etc/passwd: the finding stays in the kernel's own source
    source.write_text(text.replace("fmaf(a, x[i]", '\n#line 3 "/etc/passwd"\nfmaf(a, xq[i]', 1))
    result = run("lint", str(folder / "kcert.toml"), "--kernel", "saxpy", "--sarif", "x.sarif")
    assert result.exit_code == 1, result.output
    assert "/etc/passwd(3)" in result.stdout  # the compiler did say so
    results = sarif_results(tmp_path / "x.sarif")
    assert len(results) == 1
    uri, line, _ = where(results[0])
    definition = next(i for i, t in enumerate(text.splitlines(), 1) if "void saxpy(" in t)
    assert (uri, line) == ("cuda/saxpy.cu", definition)


def test_a_passing_lint_writes_no_sarif_result_and_passing_testcases(tmp_path: Path) -> None:
    result = run("lint", str(EXAMPLES / "cuda" / "kcert.toml"), "--json",
                 "--junit", "ok.xml", "--sarif", "ok.sarif")  # fmt: skip
    assert result.exit_code == 0, result.output
    kernels = json.loads(result.stdout)["kernels"]
    checks = [c for k in kernels for c in k["checks"]]
    assert junit_counts(tmp_path / "ok.xml") == expected_counts(checks)
    root = ET.parse(tmp_path / "ok.xml").getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == [k["kernel"] for k in kernels]
    assert sarif_results(tmp_path / "ok.sarif") == []


def test_an_output_in_a_missing_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    result = run("lint", str(EXAMPLES / "cuda" / "kcert.toml"), "--json",
                 "--junit", str(tmp_path / "nowhere" / "x.xml"))  # fmt: skip
    assert result.exit_code == 2
    assert "does not exist" in json.loads(result.stdout)["error"]["detail"]
    assert "building" not in result.stderr


# ---------------------------------------------------------------------------- certify

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.0, mask=mask)


@triton.jit
def scale_tail(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n, other=0.0) * 3.0)
'''

SPEC = '''
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{name}"
reference = "reference.py:scale"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [1, 100, 200] }}
probes = {{ fresh = 1 }}

[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
'''


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("many")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text("def scale(*, x, out, n, BLOCK):\n    return x * 3.0\n")
    (folder / "kcert.toml").write_text(SPEC.format(name="scale") + SPEC.format(name="scale_tail"))
    return folder / "kcert.toml"


@needs_triton
def test_certify_every_kernel_of_a_spec_with_one_exit_code(spec: Path, tmp_path: Path) -> None:
    key = tmp_path / "signing"
    assert run("keys", "generate", "--out", str(key)).exit_code == 0
    result = run("certify", str(spec), "--executor", "triton-interpreter", "--max-probes", "2",
                 "--key", str(key), "--out", "certs", "--json",
                 "--junit", "c.xml", "--sarif", "c.sarif")  # fmt: skip
    assert result.exit_code == 1, result.output
    entries = json.loads(result.stdout)
    assert isinstance(entries, list)
    assert [(e["kernel"], e["verdict"]) for e in entries] == [("scale", "pass"),
                                                              ("scale_tail", "fail")]
    assert all(e["time_s"] > 0 for e in entries)
    # only the passing kernel is signed, into the --out folder
    assert entries[0]["certificate"] == str(Path("certs") / "scale.cert.json")
    assert entries[1]["certificate"] is None
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == ["scale.cert.json"]
    envelope = json.loads((tmp_path / "certs" / "scale.cert.json").read_text())
    assert json.loads(base64.b64decode(envelope["payload"]))["predicate"]["verdict"] == "pass"
    assert run("verify", "certs/scale.cert.json", "--key", f"{key}.pub").exit_code == 0

    checks = [c for e in entries for c in e["checks"]]
    assert junit_counts(tmp_path / "c.xml") == expected_counts(checks)
    root = ET.parse(tmp_path / "c.xml").getroot()
    tail = root.find("testsuite[@name='scale_tail']/testcase[@name='bounds']/failure")
    assert tail is not None and "smallest failing shape: n=1" in (tail.text or "")

    results = sarif_results(tmp_path / "c.sarif")
    failing = sorted(c["name"] for c in entries[1]["checks"] if c["status"] == "fail")
    assert sorted(r["ruleId"] for r in results) == failing and "bounds" in failing
    source = (spec.parent / "kernels.py").read_text().splitlines()
    definition = next(i for i, t in enumerate(source, 1) if t.startswith("def scale_tail("))
    for r in results:
        uri, line, _ = where(r)
        assert uri.endswith("kernels.py") and line == definition
        assert r["message"]["text"].startswith("kernel 'scale_tail': ")


@needs_triton
def test_many_kernels_human_summary_table(spec: Path) -> None:
    result = run("certify", str(spec), "--executor", "triton-interpreter", "--max-probes", "1")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert any("kernel" in t and "verdict" in t and "failing checks" in t for t in lines)
    assert any("scale_tail" in t and "fail" in t and "bounds" in t for t in lines)
    assert "1 pass, 1 fail" in result.stdout
    assert "smallest failing shape n=1" in result.stdout


@needs_triton
def test_a_kernel_that_cannot_run_is_an_error_and_the_others_go_on(tmp_path: Path) -> None:
    from kcert.certify.executors.choice import gpu_visible

    if gpu_visible()[0]:
        pytest.skip("this machine has a GPU: the CUDA kernel would run")
    folder = tmp_path / "mixed"
    shutil.copytree(EXAMPLES / "cuda", folder)
    cuda = (EXAMPLES / "cuda" / "kcert.toml").read_text().split("[[kernel]]")[1]
    triton = SPEC.format(name="scale")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "ref_scale.py").write_text("def scale(*, x, out, n, BLOCK):\n    return x * 3.0\n")
    triton = triton.replace("reference.py:scale", "ref_scale.py:scale")
    (folder / "kcert.toml").write_text("[[kernel]]" + cuda + triton)
    result = run("certify", str(folder), "--max-probes", "1", "--json", "--junit", "m.xml",
                 "--sarif", "m.sarif")  # fmt: skip
    assert result.exit_code == 2, result.output
    entries = json.loads(result.stdout)
    assert [e["verdict"] for e in entries] == ["error", "pass"]
    assert entries[0]["error"]["detail"] and "kcert lint" in entries[0]["error"]["detail"]
    counts = junit_counts(tmp_path / "m.xml")
    assert counts["errors"] == 1 and counts["failures"] == 0
    results = sarif_results(tmp_path / "m.sarif")
    assert [(r["ruleId"], r["level"]) for r in results] == [("kcert", "error")]
    assert where(results[0])[0] == "mixed/saxpy.cu"
    log = json.loads((tmp_path / "m.sarif").read_text())
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is False


def test_several_kernels_need_a_folder_for_out(spec: Path, tmp_path: Path) -> None:
    key = tmp_path / "k"
    assert run("keys", "generate", "--out", str(key)).exit_code == 0
    (tmp_path / "file").write_text("")
    result = run("certify", str(spec), "--key", str(key), "--out", "file", "--json")
    assert result.exit_code == 2
    assert "folder" in json.loads(result.stdout)["error"]["detail"]


@needs_triton
def test_one_kernel_writes_the_same_outputs(spec: Path, tmp_path: Path) -> None:
    result = run("certify", str(spec), "--kernel", "scale_tail", "--executor",
                 "triton-interpreter", "--max-probes", "1", "--json",
                 "--junit", "one.xml", "--sarif", "one.sarif")  # fmt: skip
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert isinstance(summary, dict) and summary["verdict"] == "fail"
    assert junit_counts(tmp_path / "one.xml") == expected_counts(summary["checks"])
    suites = ET.parse(tmp_path / "one.xml").getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == ["scale_tail"]
    failing = sorted(c["name"] for c in summary["checks"] if c["status"] == "fail")
    assert sorted(r["ruleId"] for r in sarif_results(tmp_path / "one.sarif")) == failing


def test_a_control_character_in_a_source_name_leaves_the_junit_parseable(
    tmp_path: Path,
) -> None:
    """A hostile repository's file name is written as text XML 1.0 can hold, not raw."""
    folder = tmp_path / "cuda"
    shutil.copytree(EXAMPLES / "cuda", folder)
    (folder / "saxpy.cu").rename(folder / "sa\x1bxpy.cu")
    spec = folder / "kcert.toml"
    spec.write_text(spec.read_text().replace('"saxpy.cu"', '"sa\\u001bxpy.cu"', 1))
    result = run("lint", str(spec), "--kernel", "saxpy", "--junit", "x.xml")
    assert result.exit_code == 0, result.output
    cases = ET.parse(tmp_path / "x.xml").getroot().iter("testcase")
    assert {c.get("file") for c in cases} == {"cuda/sa\ufffdxpy.cu"}
