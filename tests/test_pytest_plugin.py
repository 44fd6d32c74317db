"""The pytest plugin (kcert.pytest_plugin), run by pytest itself through ``pytester``.

The plugin is loaded with ``-p kcert.pytest_plugin``, which works whether or
not kcert is installed; that the installed ``pytest11`` entry point loads the
same plugin (and that both together do not clash) is checked with a stand-in
distribution whose entry point is copied from pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tomllib
from pathlib import Path

import pytest

# What the plugin imports, imported here first: an in-process pytester run drops the
# modules it imported when it ends, and some (NumPy) warn when imported again.
import kcert.certify.ci
import kcert.certify.executors.choice
import kcert.certify.spec
import kcert.pytest_plugin  # noqa: F401

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PLUGIN = "kcert.pytest_plugin"
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (pip install 'kcert[triton]')")


def example_table(language: str, name: str) -> str:
    """One ``[[kernel]]`` table of an example spec, verbatim."""
    text = (EXAMPLES / language / "kcert.toml").read_text()
    tables = ["[[kernel]]" + t for t in text.split("[[kernel]]")[1:]]
    found = [t for t in tables if f'name = "{name}"' in t]
    assert len(found) == 1
    return found[0]


@pytest.fixture
def triton_specs(pytester: pytest.Pytester) -> Path:
    """examples/triton's saxpy, and a variant that drops the tail mask on its store."""
    for name in ("saxpy.py", "reference.py"):
        shutil.copy(EXAMPLES / "triton" / name, pytester.path / name)
    source = (pytester.path / "saxpy.py").read_text()
    tail = source.replace("a * x + y, mask=mask)", "a * x + y)")
    assert tail != source
    (pytester.path / "saxpy_tail.py").write_text(tail)
    table = example_table("triton", "saxpy")
    variant = (table.replace('name = "saxpy"', 'name = "saxpy_tail"')
               .replace('source = "saxpy.py"', 'source = "saxpy_tail.py"'))  # fmt: skip
    spec = pytester.path / "kcert.toml"
    spec.write_text("version = 1\n\n" + table + "\n" + variant)
    return spec


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    # a child pytest imports this checkout's kcert, installed or not
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def test_pyproject_registers_the_plugin_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


@needs_triton
def test_each_kernel_is_a_test_and_a_failure_shows_why(
    pytester: pytest.Pytester, triton_specs: Path
) -> None:
    # in a child: an in-process run would drop the modules it imported (Triton among
    # them) when it ends, and Triton's extension cannot be loaded twice in one process
    result = pytester.runpytest_subprocess(
        "-p", PLUGIN, "--kcert", "--kcert-executor", "triton-interpreter",
        "--kcert-max-probes", "2", "-p", "no:cacheprovider", "-v", "--junitxml", "out.xml")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "Traceback" not in out
    result.stdout.fnmatch_lines([
        "kcert.toml::saxpy PASSED*",
        "kcert.toml::saxpy_tail FAILED*",
        "*kernel 'saxpy_tail' failed certification*",
        "FAILED bounds (first failing probe *; smallest failing shape n=*):",
        "*past its end*",
        "*FAILED kcert.toml::saxpy_tail*",
    ])  # fmt: skip
    # pytest's own JUnit report carries each check's status as a property
    xml = (pytester.path / "out.xml").read_text()
    assert '<property name="kcert_check_bounds" value="fail"' in xml
    assert '<property name="kcert_verdict" value="pass"' in xml


def test_nothing_is_collected_unless_asked(pytester: pytest.Pytester,
                                           triton_specs: Path) -> None:  # fmt: skip
    plain = pytester.runpytest("-p", PLUGIN, "--co", "-q")
    assert plain.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    pytester.makeini("[pytest]\nkcert_collect = true\n")
    by_ini = pytester.runpytest("-p", PLUGIN, "--co", "-q")
    by_ini.stdout.fnmatch_lines(["kcert.toml::saxpy", "kcert.toml::saxpy_tail"])


def test_gpu_kernels_are_marked_and_skipped_without_a_gpu(
    pytester: pytest.Pytester, triton_specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcert.certify.executors.choice import gpu_visible

    if gpu_visible()[0]:
        pytest.skip("this machine has a GPU: the kernels would run")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda = pytester.mkdir("cuda")
    for name in ("saxpy.cu", "reference.py"):
        shutil.copy(EXAMPLES / "cuda" / name, cuda / name)
    (cuda / "kcert.toml").write_text(example_table("cuda", "saxpy"))
    result = pytester.runpytest("-p", PLUGIN, "--kcert", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines([
        "*needs a GPU: a CUDA C kernel*",
        "*needs a GPU: a Triton kernel (set TRITON_INTERPRET=1*",
    ])  # fmt: skip
    # every one is marked gpu: deselecting them leaves nothing
    no_gpu = pytester.runpytest("-p", PLUGIN, "--kcert", "-m", "not gpu", "--co", "-q")
    assert no_gpu.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    # on the interpreter a Triton kernel needs no GPU: no longer marked
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    selected = pytester.runpytest("-p", PLUGIN, "--kcert", "-m", "not gpu", "--co", "-q")
    selected.stdout.fnmatch_lines(["kcert.toml::saxpy", "kcert.toml::saxpy_tail"])
    assert "cuda/kcert.toml::saxpy" not in selected.stdout.str()


def test_a_bad_spec_is_a_collection_error_without_a_traceback(pytester: pytest.Pytester) -> None:
    (pytester.path / "kcert.toml").write_text('[[kernel]]\nname = "k"\nsource = "missing.py"\n')
    result = pytester.runpytest("-p", PLUGIN, "--kcert")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert "kernel 'k'" in out and "Traceback" not in out


def test_the_installed_entry_point_loads_the_plugin(
    pytester: pytest.Pytester, triton_specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a stand-in distribution holding kcert's pytest11 entry point, as pip would install it
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    site = pytester.mkdir("site")
    info = site / "kcert_plugin_check-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kcert-plugin-check\nVersion: 0\n")
    points = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["pytest11"].items())
    (info / "entry_points.txt").write_text("[pytest11]\n" + points)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    for extra in ((), ("-p", PLUGIN)):  # by the entry point alone, and both together
        result = pytester.runpytest_subprocess(*extra, "--kcert", "--co", "-q", "kcert.toml")
        assert result.ret == pytest.ExitCode.OK, result.stderr.str()
        result.stdout.fnmatch_lines(["kcert.toml::saxpy", "kcert.toml::saxpy_tail"])
