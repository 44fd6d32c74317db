"""Shared fixtures and hardware markers for the whole suite."""

from __future__ import annotations

import functools

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none is visible to CuPy here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
