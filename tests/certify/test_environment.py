"""Environment fingerprints, drift fields and the ``--hw`` check, with no GPU needed."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from kcert.certify import environment as envmod
from kcert.certify.environment import DeviceDescription, check_hw_class, fingerprint
from kcert.certify.errors import DriftFieldError, HardwareMismatch
from kcert.digest import canonical_json

H100_ENV: dict[str, Any] = {
    "device_kind": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
    "sm_count": 132, "memory_bytes": 85_031_714_816, "driver_version": "580.65.06",
    "cuda_driver_api": "13.0", "cuda_runtime": "13.0", "nvrtc": "13.0", "cublas": "13.0.2",
    "cupy": "14.0.0", "numpy": "2.4.6", "triton": "3.9.0", "ecc": "enabled",
    "os": "Linux-6.8.0-x86_64-with-glibc2.39", "python": "CPython 3.12.3",
}  # fmt: skip


def test_fingerprint_is_sha256_of_canonical_json_of_the_default_drift_fields() -> None:
    expected = hashlib.sha256(canonical_json({
        "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
        "driver_version": "580.65.06", "cuda_runtime": "13.0", "nvrtc": "13.0",
        "cublas": "13.0.2",
    })).hexdigest()  # fmt: skip
    assert str(fingerprint(H100_ENV)) == f"sha256:{expected}"


def test_fingerprint_is_deterministic_and_ignores_key_order() -> None:
    shuffled = dict(reversed(list(H100_ENV.items())))
    assert fingerprint(H100_ENV) == fingerprint(shuffled) == fingerprint(dict(H100_ENV))


def test_only_drift_fields_move_the_fingerprint() -> None:
    base = fingerprint(H100_ENV)
    assert fingerprint({**H100_ENV, "python": "CPython 3.13.0", "ecc": "disabled"}) == base
    assert fingerprint({**H100_ENV, "driver_version": "580.95.05"}) != base
    assert fingerprint({**H100_ENV, "cublas": None}) != base


def test_a_caller_may_choose_other_drift_fields() -> None:
    narrow = fingerprint(H100_ENV, ["gpu_name", "compute_capability"])
    assert fingerprint({**H100_ENV, "driver_version": "999.1"}, ["gpu_name",
                       "compute_capability"]) == narrow  # fmt: skip
    assert narrow != fingerprint(H100_ENV)
    with_ecc = fingerprint(H100_ENV, ["gpu_name", "ecc"])
    assert fingerprint({**H100_ENV, "ecc": "disabled"}, ["gpu_name", "ecc"]) != with_ecc
    # order and repetition of the names do not matter
    assert fingerprint(H100_ENV, ["ecc", "gpu_name", "ecc"]) == with_ecc


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (["gpu_name", "gpu-name"], "unknown drift field"),
        ([], "empty"),
        (["torch"], "has no field"),
        ("gpu_name", "list of names"),
    ],
)
def test_bad_drift_fields_are_errors(fields: Any, message: str) -> None:
    with pytest.raises(DriftFieldError, match=message):
        fingerprint(H100_ENV, fields)


def test_cpu_environment_has_its_own_default_drift_fields() -> None:
    env = envmod.cpu_environment()
    assert env.hw_class == "cpu" and env.device is None
    assert env.fields["executor"] == "triton-interpreter"
    assert env.drift_fields() == envmod.DEFAULT_CPU_DRIFT
    assert set(envmod.DEFAULT_CPU_DRIFT) <= set(env.fields)
    changed = {**env.fields, "torch": "0.0.1"}
    assert fingerprint(changed) != env.fingerprint()
    assert fingerprint({**env.fields, "os": "elsewhere"}) == env.fingerprint()


def test_an_environment_without_the_kind_marker_is_recognised_by_its_fields() -> None:
    unmarked = {k: v for k, v in H100_ENV.items() if k != "device_kind"}
    assert fingerprint(unmarked) == fingerprint(H100_ENV)


def test_auto_without_a_gpu_falls_back_to_the_cpu_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envmod, "gpu_status", lambda: (False, "no driver"))
    assert envmod.collect_environment("auto").hw_class == "cpu"
    with pytest.raises(envmod.EnvironmentUnavailable, match="needs an NVIDIA GPU"):
        envmod.collect_environment("cuda")
    with pytest.raises(envmod.EnvironmentUnavailable, match="unknown executor"):
        envmod.collect_environment("opencl")


def test_version_integers_are_decoded() -> None:
    assert envmod.version_text(13000) == "13.0"
    assert envmod.version_text(12080) == "12.8"
    assert envmod.cublas_version_text(130002) == "13.0.2"
    assert envmod.cublas_version_text(120304) == "12.3.4"
    assert envmod.cublas_version_text(11502) == "11.5.2"


# --------------------------------------------------------------------------- --hw


H100 = DeviceDescription("NVIDIA H100 80GB HBM3", (9, 0))
A100 = DeviceDescription("NVIDIA A100-SXM4-80GB", (8, 0))


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [
        ("H100", H100, "H100"),
        ("h100", DeviceDescription("NVIDIA H100 PCIe", (9, 0)), "H100"),
        ("H200", DeviceDescription("NVIDIA H200", (9, 0)), "H200"),
        ("A100", A100, "A100"),
        ("L4", DeviceDescription("NVIDIA L4", (8, 9)), "L4"),
        ("B200", DeviceDescription("NVIDIA B200", (10, 0)), "B200"),
        ("cpu", None, "cpu"),
    ],
)
def test_matching_hardware_classes(
    requested: str, device: DeviceDescription | None, expected: str
) -> None:
    assert check_hw_class(requested, device) == expected


@pytest.mark.parametrize(
    ("requested", "device"),
    [
        ("H100", A100),
        ("H100", DeviceDescription("NVIDIA H100 80GB HBM3", (8, 0))),  # name right, cc wrong
        ("H200", DeviceDescription("NVIDIA GH200 480GB", (9, 0))),  # not a whole word
        ("L4", DeviceDescription("NVIDIA L40S", (8, 9))),
        ("A100", None),
        ("cpu", H100),
    ],
)
def test_mismatched_hardware_classes_say_what_the_device_is(
    requested: str, device: DeviceDescription | None
) -> None:
    with pytest.raises(HardwareMismatch) as caught:
        check_hw_class(requested, device)
    text = caught.value.diagnostics()
    assert (str(device) if device else "CPU") in text


def test_an_unknown_hardware_class_lists_the_known_ones() -> None:
    with pytest.raises(HardwareMismatch, match="known classes are H100"):
        check_hw_class("TPUv5", H100)


def test_hardware_class_mismatch_exits_2() -> None:
    from kcert.errors import KcertError

    assert issubclass(HardwareMismatch, KcertError)


def test_a_device_outside_the_classes_has_no_class() -> None:
    assert envmod.hw_class_of(DeviceDescription("NVIDIA GeForce GTX 1080", (6, 1))) is None
    assert envmod.hw_class_of(DeviceDescription("NVIDIA GeForce RTX 4090", (8, 9))) == "RTX4090"
    assert envmod.hw_class_of(H100) == "H100"
    assert envmod.hw_class_of(None) == "cpu"


def test_every_class_that_builds_is_a_class_the_device_check_knows() -> None:
    from kcert.certify.build import HW_ARCH

    assert set(HW_ARCH) == {name for name, rule in envmod.HW_CLASSES.items() if rule}
    for name, rule in envmod.HW_CLASSES.items():
        if rule is None:
            continue
        word, (major, minor) = rule
        device = DeviceDescription(f"NVIDIA {word} 80GB", (major, minor))
        assert envmod.check_hw_class(name, device) == name
        assert HW_ARCH[name] == f"sm_{major}{minor}"
