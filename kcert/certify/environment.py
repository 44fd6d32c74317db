"""The environment a kernel was certified in, its drift fingerprint, and the ``--hw`` check.

The fields docs/certificate.md lists under ``environment`` are read through
CuPy (the CUDA runtime, NVRTC and cuBLAS) and NVML (nvidia-ml-py: the driver's
version string and ECC mode). A run on the CPU through the Triton interpreter
records the interpreter's stack instead, and its hardware class is ``cpu``.

The fingerprint is ``sha256:`` of the RFC 8785 canonical JSON of the object
``{field: value}`` over the drift fields. :func:`fingerprint` is pure and needs
no GPU: the registry calls it on the environment a target reports, with that
target's drift fields.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kcert.certify.errors import DriftFieldError, EnvironmentUnavailable, HardwareMismatch
from kcert.digest import Digest

#: What a GPU run records, in the order people read it.
GPU_FIELDS: tuple[str, ...] = (
    "device_kind", "gpu_name", "compute_capability", "sm_count", "memory_bytes",
    "driver_version", "cuda_driver_api", "cuda_runtime", "nvrtc", "cublas", "cupy", "numpy",
    "triton", "ecc", "os", "python",
)  # fmt: skip
#: What a CPU run through the Triton interpreter records.
CPU_FIELDS: tuple[str, ...] = (
    "device_kind", "executor", "triton", "torch", "numpy", "cpu_model", "os", "python",
)  # fmt: skip
KNOWN_FIELDS = frozenset(GPU_FIELDS) | frozenset(CPU_FIELDS)

DEFAULT_GPU_DRIFT: tuple[str, ...] = (
    "gpu_name", "compute_capability", "driver_version", "cuda_runtime", "nvrtc", "cublas",
)  # fmt: skip
DEFAULT_CPU_DRIFT: tuple[str, ...] = ("executor", "triton", "torch", "numpy", "cpu_model")

#: Hardware classes: a word the GPU's name must contain, and its compute capability.
#: The one table of hardware classes: the word the GPU's name must contain and its
#: compute capability. ``kcert.certify.build`` derives each class's ``sm_XX`` from it.
HW_CLASSES: Mapping[str, tuple[str, tuple[int, int]] | None] = {
    "H100": ("H100", (9, 0)),
    "H200": ("H200", (9, 0)),
    "GH200": ("GH200", (9, 0)),
    "H800": ("H800", (9, 0)),
    "H20": ("H20", (9, 0)),
    "A100": ("A100", (8, 0)),
    "A800": ("A800", (8, 0)),
    "A30": ("A30", (8, 0)),
    "A10": ("A10", (8, 6)),
    "A10G": ("A10G", (8, 6)),
    "A40": ("A40", (8, 6)),
    "A6000": ("A6000", (8, 6)),
    "RTX3090": ("RTX 3090", (8, 6)),
    "L4": ("L4", (8, 9)),
    "L40": ("L40", (8, 9)),
    "L40S": ("L40S", (8, 9)),
    "RTX4090": ("RTX 4090", (8, 9)),
    "RTX6000ADA": ("RTX 6000 Ada", (8, 9)),
    "B200": ("B200", (10, 0)),
    "GB200": ("GB200", (10, 0)),
    "B300": ("B300", (10, 3)),
    "GB300": ("GB300", (10, 3)),
    "RTX5090": ("RTX 5090", (12, 0)),
    "RTXPRO6000": ("RTX PRO 6000", (12, 0)),
    "cpu": None,  # the Triton interpreter only
}
EXECUTOR_CHOICES: tuple[str, ...] = ("auto", "cuda", "triton", "triton-interpreter")


@dataclass(frozen=True, slots=True)
class DeviceDescription:
    """What the ``--hw`` check needs to know about a GPU."""

    name: str
    compute_capability: tuple[int, int]

    def __str__(self) -> str:
        major, minor = self.compute_capability
        return f"{self.name} (compute capability {major}.{minor})"


@dataclass(frozen=True, slots=True)
class Environment:
    fields: Mapping[str, Any]
    #: A class of :data:`HW_CLASSES` when the device is one, else the GPU's name.
    hw_class: str
    #: None on the CPU interpreter path.
    device: DeviceDescription | None

    def fingerprint(self, drift_fields: Sequence[str] | None = None) -> Digest:
        return fingerprint(self.fields, drift_fields)

    def drift_fields(self) -> tuple[str, ...]:
        return default_drift_fields(self.fields)


# --------------------------------------------------------------------------- pure parts


def default_drift_fields(environment: Mapping[str, Any]) -> tuple[str, ...]:
    """The drift fields used when none are named: the GPU's or the CPU interpreter's."""
    kind = environment.get("device_kind")
    if kind is None:  # an environment reported without the marker: tell by its fields
        kind = "gpu" if "gpu_name" in environment else "cpu"
    if kind == "gpu":
        return DEFAULT_GPU_DRIFT
    if kind == "cpu":
        return DEFAULT_CPU_DRIFT
    raise DriftFieldError(f"environment field 'device_kind' is {kind!r}; expected 'gpu' or 'cpu'")


def check_drift_fields(names: Sequence[str]) -> tuple[str, ...]:
    """Validate a list of drift field names (no environment needed); returns them sorted."""
    if isinstance(names, str):
        raise DriftFieldError("drift fields must be a list of names, not one string")
    if not names:
        raise DriftFieldError("an empty list of drift fields would fingerprint nothing; "
                              "name at least one field or leave the list out")  # fmt: skip
    unknown = sorted({str(n) for n in names} - KNOWN_FIELDS)
    if unknown:
        raise DriftFieldError(
            f"unknown drift field(s) {', '.join(map(repr, unknown))}; "
            f"known fields are {', '.join(sorted(KNOWN_FIELDS))}"
        )
    return tuple(sorted(set(names)))


def fingerprint(
    environment: Mapping[str, Any], drift_fields: Sequence[str] | None = None
) -> Digest:
    """``sha256:`` of the canonical JSON of ``{field: value}`` over the drift fields."""
    names = default_drift_fields(environment) if drift_fields is None else drift_fields
    chosen = check_drift_fields(names)
    missing = [n for n in chosen if n not in environment]
    if missing:
        raise DriftFieldError(
            f"the environment has no field(s) {', '.join(map(repr, missing))}; "
            f"it has {', '.join(sorted(environment))}"
        )
    return Digest.of_json({name: environment[name] for name in chosen})


def hw_class_of(device: DeviceDescription | None) -> str | None:
    """The hardware class a device belongs to, if it is one of :data:`HW_CLASSES`."""
    if device is None:
        return "cpu"
    for name, rule in HW_CLASSES.items():
        if rule is not None and _matches(device, rule):
            return name
    return None


def check_hw_class(requested: str, device: DeviceDescription | None) -> str:
    """Check ``--hw CLASS`` against the device (None: the CPU interpreter); return the class."""
    canonical = {k.lower(): k for k in HW_CLASSES}.get(requested.strip().lower())
    if canonical is None:
        raise HardwareMismatch(
            f"unknown hardware class {requested!r}; known classes are {', '.join(HW_CLASSES)}"
        )
    rule = HW_CLASSES[canonical]
    if rule is None:
        if device is not None:
            raise HardwareMismatch(
                f"--hw cpu is only for the Triton interpreter on the CPU, but this run is on "
                f"{device}; use --hw {hw_class_of(device) or 'CLASS'} or "
                "--executor triton-interpreter"
            )
        return canonical
    if device is None:
        raise HardwareMismatch(
            f"--hw {canonical} needs that GPU, but this run uses the Triton interpreter on the "
            "CPU (hardware class 'cpu'); run on the GPU or use --hw cpu"
        )
    if not _matches(device, rule):
        major, minor = rule[1]
        raise HardwareMismatch(
            f"--hw {canonical} expects a GPU named '{rule[0]}' with compute capability "
            f"{major}.{minor}, but this device is {device}"
        )
    return canonical


def _matches(device: DeviceDescription, rule: tuple[str, tuple[int, int]]) -> bool:
    word, capability = rule
    # a whole word, so that "L4" does not match an L40S nor "H200" a GH200
    named = re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", device.name, re.I)
    return named is not None and device.compute_capability == capability


def version_text(encoded: int) -> str:
    """CUDA's ``1000 * major + 10 * minor`` integers as ``major.minor``."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def cublas_version_text(encoded: int) -> str:
    """cuBLAS's version integer: ``major*1000 + minor*100 + patch`` before 12, ``*10000`` after."""
    if encoded >= 100000:
        return f"{encoded // 10000}.{encoded % 10000 // 100}.{encoded % 100}"
    return f"{encoded // 1000}.{encoded % 1000 // 100}.{encoded % 100}"


# --------------------------------------------------------------------------- reading the machine


def collect_environment(executor: str = "auto", *, device: int = 0) -> Environment:
    """This machine's environment for ``executor`` (auto: the GPU when there is one)."""
    if executor not in EXECUTOR_CHOICES:
        raise EnvironmentUnavailable(
            f"unknown executor {executor!r}; choose one of {', '.join(EXECUTOR_CHOICES)}"
        )
    if executor == "triton-interpreter":
        return cpu_environment()
    found, reason = gpu_status()
    if found:
        return gpu_environment(device)
    if executor == "auto":
        return cpu_environment()
    raise EnvironmentUnavailable(
        f"executor '{executor}' needs an NVIDIA GPU and none was found ({reason}); "
        "use --executor triton-interpreter to see the CPU stack"
    )


def gpu_status() -> tuple[bool, str]:
    """Whether CuPy sees a CUDA device, and if not, why not."""
    try:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except (ImportError, OSError, RuntimeError) as exc:  # no CuPy, driver or device: no GPU here
        return False, f"{type(exc).__name__}: {exc}"
    return (count > 0, f"{count} CUDA device(s)")


def cpu_environment(executor: str = "triton-interpreter") -> Environment:
    fields: dict[str, Any] = {
        "device_kind": "cpu",
        "executor": executor,
        "triton": _dist_version("triton"),
        "torch": _dist_version("torch"),
        "numpy": _dist_version("numpy"),
        "cpu_model": cpu_model(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    return Environment(fields=fields, hw_class="cpu", device=None)


def gpu_environment(device: int = 0) -> Environment:
    """Read the fields of CUDA device ``device`` through CuPy and NVML."""
    # lazy: CuPy needs the CUDA stack; only a GPU path imports it
    import cupy

    runtime = cupy.cuda.runtime
    try:
        props = runtime.getDeviceProperties(device)
        name = _text(props["name"])
        capability = (int(props["major"]), int(props["minor"]))
        sm_count = int(runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device))
        memory = int(props["totalGlobalMem"])
        ecc_attribute = int(runtime.deviceGetAttribute(runtime.cudaDevAttrEccEnabled, device))
        driver_api = version_text(int(runtime.driverGetVersion()))
        cuda_runtime = version_text(int(runtime.runtimeGetVersion()))
        bus_id = str(runtime.deviceGetPCIBusId(device))
    except runtime.CUDARuntimeError as exc:
        raise EnvironmentUnavailable(f"cannot read CUDA device {device}: {exc}") from exc
    nvml = _nvml_facts(bus_id)
    nvrtc_major, nvrtc_minor = cupy.cuda.nvrtc.getVersion()
    fields: dict[str, Any] = {
        "device_kind": "gpu",
        "gpu_name": name,
        "compute_capability": f"{capability[0]}.{capability[1]}",
        "sm_count": sm_count,
        "memory_bytes": memory,
        "driver_version": nvml.get("driver_version") or _proc_driver_version(),
        "cuda_driver_api": driver_api,
        "cuda_runtime": cuda_runtime,
        "nvrtc": f"{nvrtc_major}.{nvrtc_minor}",
        "cublas": _cublas_version(),
        "cupy": str(cupy.__version__),
        "numpy": _dist_version("numpy"),
        "triton": _dist_version("triton"),
        "ecc": nvml.get("ecc") or ("enabled" if ecc_attribute else "disabled"),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    described = DeviceDescription(name, capability)
    return Environment(fields=fields, hw_class=hw_class_of(described) or name, device=described)


def _nvml_facts(bus_id: str) -> dict[str, str]:
    """The driver's version string and the ECC mode from NVML; empty where NVML fails."""
    facts: dict[str, str] = {}
    try:
        # lazy: NVML is there only where an NVIDIA driver is
        import pynvml
    except ImportError:  # no nvidia-ml-py: the CUDA runtime's answers stand
        return facts
    try:
        pynvml.nvmlInit()
    except (OSError, pynvml.NVMLError):  # no NVML library or no driver: the same
        return facts
    try:
        facts["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            current, _pending = pynvml.nvmlDeviceGetEccMode(handle)
            facts["ecc"] = "enabled" if current else "disabled"
        except pynvml.NVMLError_NotSupported:
            facts["ecc"] = "unsupported"
    except pynvml.NVMLError:
        pass  # partial facts are still facts
    finally:
        pynvml.nvmlShutdown()
    return facts


def _proc_driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\w.]*)", text)
    return found.group(1) if found else None


def _cublas_version() -> str | None:
    """cuBLAS's version as CuPy loads it; None where cuBLAS is not installed."""
    try:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy
        from cupy_backends.cuda.libs import cublas

        return cublas_version_text(int(cublas.getVersion(cupy.cuda.device.get_cublas_handle())))
    except (ImportError, OSError, RuntimeError):  # cuBLAS missing or unloadable (CUBLASError):
        # recorded as absent, which is drift too
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass  # not Linux: fall back on what the platform module knows
    return platform.processor() or platform.machine() or "unknown"


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
