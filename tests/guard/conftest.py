"""Fixtures of the guard tests: saxpy's spec, a signed certificate for it, guards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from guard_factory import CERTIFIED_MAX, certificate_for, saxpy_spec

from kcert.attest.dsse import Envelope
from kcert.certify.spec import KernelSpec
from kcert.guard import Guard, ListReporter


@pytest.fixture(scope="session")
def spec() -> KernelSpec:
    return saxpy_spec()


@pytest.fixture(scope="session")
def certificate(spec: KernelSpec) -> Envelope:
    return certificate_for(spec, {"n": (1, CERTIFIED_MAX)})


@pytest.fixture
def make_guard(spec: KernelSpec, certificate: Envelope) -> Iterator[Callable[..., Guard]]:
    made: list[Guard] = []

    def make(**options: Any) -> Guard:
        options.setdefault("reporter", ListReporter(target="test"))
        guard = Guard.from_certificate(certificate, spec, **options)
        made.append(guard)
        return guard

    yield make
    for guard in made:
        guard.close()
