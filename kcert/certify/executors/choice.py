"""Which executor runs a kernel, and whether it can run on this machine.

Checked in the parent before any child process starts, so that a machine
without a GPU or without Triton gets a :class:`~kcert.errors.KcertError` that
says what to do (``kcert lint`` still works without a GPU), not a failed run.
"""

from __future__ import annotations

import importlib.util

from kcert.certify.errors import ExecutorUnavailable, NoDeviceError
from kcert.certify.execution import EXECUTORS
from kcert.certify.spec import KernelSpec
from kcert.errors import UsageError


def gpu_visible() -> tuple[bool, str]:
    """Whether CuPy sees a CUDA device here, and why not when it does not."""
    try:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except (ImportError, OSError, RuntimeError) as exc:  # no driver, libcuda or device: no GPU
        return False, f"CUDA reports: {exc}".strip()
    if count < 1:
        return False, "CUDA sees no device"
    return True, f"{count} device(s)"


def default_executor(kernel: KernelSpec) -> str:
    """What ``--executor auto`` means: CUDA C on the GPU; Triton on the GPU if any, else the CPU."""
    if kernel.language == "cuda":
        return "cuda"
    if not gpu_visible()[0] or importlib.util.find_spec("torch") is None:
        return "triton-interpreter"
    # lazy: torch is heavy and optional; only this path needs it
    import torch  # only here: a GPU is visible, and only a CUDA build of torch can use it

    return "triton" if torch.version.cuda is not None else "triton-interpreter"


def device_arch() -> str:
    """The ``sm_XX`` architecture of device 0."""
    # lazy: CuPy needs the CUDA stack; only a GPU path imports it
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    return f"sm_{props['major']}{props['minor']}"


def check_executor(kernel: KernelSpec, executor: str) -> None:
    """Raise when ``executor`` cannot run ``kernel`` on this machine."""
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor '{executor}'; pick one of auto, {', '.join(EXECUTORS)}")
    wants = "cuda" if executor == "cuda" else "triton"
    if kernel.language != wants:
        raise UsageError(
            f"kernel '{kernel.name}' is {'CUDA C' if kernel.language == 'cuda' else 'Triton'}; "
            f"executor '{executor}' runs {'CUDA C' if wants == 'cuda' else 'Triton'} kernels"
        )
    if wants == "triton":
        missing = [m for m in ("triton", "torch") if importlib.util.find_spec(m) is None]
        if missing:
            raise ExecutorUnavailable(
                f"executor '{executor}' needs {' and '.join(missing)}; "
                "install them with: pip install 'kcert[triton]'"
            )
    if executor != "triton-interpreter":
        visible, detail = gpu_visible()
        if not visible:
            raise NoDeviceError(executor, detail)
