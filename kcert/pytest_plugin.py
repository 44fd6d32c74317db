"""A pytest plugin: every kernel of a ``kcert.toml`` is a test that passes when it certifies.

Registered through the ``pytest11`` entry point, so installing kcert makes it
available; it collects nothing until asked, with ``--kcert`` on the command
line or ``kcert_collect = true`` in the ini file (pytest.ini, or
``[tool.pytest.ini_options]``). Then each ``kcert.toml`` under the paths pytest
collects gives one test per ``[[kernel]]``, marked ``kcert``. A failing kernel
shows why: the failing checks with their messages, probes, smallest failing
shapes and compiler log. The kernel runs sandboxed; its reference is the
user's own code and is imported and run in the pytest process (as ``kcert
certify`` runs it in the certifier's), so ``--kcert`` is for trusted specs.

Kernels that need a GPU are marked ``gpu`` and skipped with the reason when
none is visible: CUDA C kernels, and Triton kernels unless they run on the
Triton interpreter (``TRITON_INTERPRET=1`` in the environment, or
``--kcert-executor triton-interpreter``). Nothing of kcert's certifier is
imported until a spec is collected, so the plugin costs nothing elsewhere.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kcert.certify.ci import KernelOutcome
    from kcert.certify.spares import WorkerPool
    from kcert.certify.spec import KernelSpec

SPEC_NAME = "kcert.toml"
#: The session's sandbox workers, made when the first kernel runs and closed with the session.
_POOL = pytest.StashKey["WorkerPool"]()
_EXECUTORS = ("auto", "cuda", "triton", "triton-interpreter")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kcert", "kernel certification (kcert)")
    group.addoption("--kcert", action="store_true", default=None, dest="kcert_collect",
                    help=f"collect {SPEC_NAME} files: one test per kernel")  # fmt: skip
    group.addoption("--kcert-executor", choices=_EXECUTORS, default=None,
                    help="executor for the kernels (default: the ini's kcert_executor, auto)")
    group.addoption("--kcert-max-probes", type=int, default=None,
                    help="cap each kernel's fixed probe set (default: the spec's)")
    parser.addini("kcert_collect", type="bool", default=False,
                  help=f"collect {SPEC_NAME} files as tests (like --kcert)")  # fmt: skip
    parser.addini("kcert_executor", default="auto",
                  help="executor: auto, cuda, triton or triton-interpreter")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kcert: a kernel certified from a kcert.toml (kcert)")
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped when none is visible")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name != SPEC_NAME or not _collecting(parent.config):
        return None
    spec_file: KcertFile = KcertFile.from_parent(parent, path=file_path)
    return spec_file


def pytest_sessionfinish(session: pytest.Session) -> None:
    pool = session.config.stash.get(_POOL, None)
    if pool is not None:  # a kernel ran: leave no worker behind
        pool.close()


def _pool(item: KcertItem) -> WorkerPool:
    """The session's pool, keeping a warm worker ahead while another kernel follows ``item``."""
    # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
    from kcert.certify.spares import WorkerPool

    pool = item.config.stash.get(_POOL, None)
    if pool is None:
        pool = item.config.stash[_POOL] = WorkerPool()
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    pool.spares = int(any(isinstance(i, KcertItem) for i in later))
    return pool


def _collecting(config: pytest.Config) -> bool:
    flag = config.getoption("kcert_collect")
    return bool(flag) if flag is not None else bool(config.getini("kcert_collect"))


def _executor(config: pytest.Config) -> str:
    chosen = config.getoption("kcert_executor") or str(config.getini("kcert_executor") or "auto")
    if chosen not in _EXECUTORS:
        raise pytest.UsageError(f"kcert_executor = {chosen!r}; pick one of {', '.join(_EXECUTORS)}")
    return chosen


def _interpreted(kernel: KernelSpec, executor: str) -> bool:
    """Whether the kernel runs on the CPU: Triton on the interpreter."""
    if kernel.language != "triton":
        return False
    return executor == "triton-interpreter" or (
        executor == "auto" and os.environ.get("TRITON_INTERPRET") == "1")  # fmt: skip


@functools.cache
def _gpu() -> tuple[bool, str]:
    # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
    from kcert.certify.executors.choice import gpu_visible

    return gpu_visible()


class KernelFailed(Exception):
    """A kernel whose certification came out ``fail``."""

    def __init__(self, outcome: KernelOutcome) -> None:
        super().__init__(outcome.kernel.name)
        self.outcome = outcome


class KcertFile(pytest.File):
    """One ``kcert.toml``: a test per ``[[kernel]]``."""

    def collect(self) -> Iterator[KcertItem]:
        # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
        from kcert.certify.spec import load_spec

        executor = _executor(self.config)
        for kernel in load_spec(self.path).kernels:
            item: KcertItem = KcertItem.from_parent(self, name=kernel.name, kernel=kernel,
                                                    executor=executor)  # fmt: skip
            item.add_marker("kcert")
            if not _interpreted(kernel, executor):
                item.add_marker("gpu")
            yield item

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
        from kcert.errors import KcertError

        if isinstance(excinfo.value, KcertError):  # a bad spec: say what, without a traceback
            return excinfo.value.diagnostics()
        return super().repr_failure(excinfo)


class KcertItem(pytest.Item):
    """One kernel: certified in the sandbox, passes when the verdict is ``pass``."""

    def __init__(self, *, kernel: KernelSpec, executor: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kernel, self.executor = kernel, executor
        self.outcome: KernelOutcome | None = None

    def setup(self) -> None:
        if _interpreted(self.kernel, self.executor):
            return
        visible, detail = _gpu()
        if not visible:
            what = "a CUDA C kernel" if self.kernel.language == "cuda" else (
                "a Triton kernel (set TRITON_INTERPRET=1 to run it on the CPU through the "
                "Triton interpreter)")  # fmt: skip
            pytest.skip(f"needs a GPU: {what}; {detail}")

    def runtest(self) -> None:
        # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
        from kcert.certify.ci import KernelOutcome
        from kcert.certify.pipeline import CertifyOptions, certify

        executor = "triton-interpreter" if _interpreted(self.kernel, self.executor) \
            else self.executor  # fmt: skip
        options = CertifyOptions(executor=executor,
                                 max_probes=self.config.getoption("kcert_max_probes"))
        started = time.monotonic()
        report = certify(self.kernel, options, pool=_pool(self))
        self.outcome = KernelOutcome.certified(self.kernel, report, time.monotonic() - started)
        self.user_properties.append(("kcert_verdict", self.outcome.verdict))
        for check in report.checks:
            self.user_properties.append((f"kcert_check_{check.name}", str(check.status)))
        if self.outcome.verdict != "pass":
            raise KernelFailed(self.outcome)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> Any:  # fmt: skip
        # lazy: this plugin loads in every pytest run; kcert's modules only when it collects
        from kcert.errors import KcertError

        if isinstance(excinfo.value, KernelFailed):
            return (f"kernel '{self.kernel.name}' failed certification\n"
                    + excinfo.value.outcome.failure_text())  # fmt: skip
        if isinstance(excinfo.value, KcertError):
            return f"kernel '{self.kernel.name}': {excinfo.value.diagnostics()}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"kcert: {self.kernel.name} ({self.kernel.source.name})"
