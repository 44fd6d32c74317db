"""Shared fixtures and hardware markers for the whole suite."""

from __future__ import annotations

import functools
import importlib.util

import pytest

#: Database fixtures (SQLite and PostgreSQL per test) for the registry and API tests.
pytest_plugins = ("registry_db",)


@functools.cache
def gpu_present() -> bool:
    """True when CuPy can see at least one CUDA device."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # any failure to reach a driver means: no GPU here
        return False


@functools.cache
def triton_present() -> bool:
    """True when the ``[triton]`` extra (Triton and torch) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("triton", "torch"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not gpu_present():
        skips["gpu"] = pytest.mark.skip(reason="needs an NVIDIA GPU; none is visible to CuPy here")
    if not triton_present():
        skips["triton"] = pytest.mark.skip(
            reason="needs Triton and torch (pip install 'kcert[triton]'); they are not installed"
        )
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
