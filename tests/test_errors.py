"""The error tree: one root, unique ``kind`` slugs, drawn in ``kcert/errors.py``'s docstring."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kcert
import kcert.errors
from kcert.errors import KcertError


def _import_everything() -> None:
    for module in pkgutil.walk_packages(kcert.__path__, "kcert."):
        importlib.import_module(module.name)


def _classes() -> list[type[KcertError]]:
    _import_everything()
    found: list[type[KcertError]] = []
    pending: list[type[KcertError]] = [KcertError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _tree(cls: type[KcertError] = KcertError, depth: int = 0) -> list[str]:
    lines = [f"{'  ' * depth}* {cls.__name__} ({cls.kind})"]
    for sub in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
        lines.extend(_tree(sub, depth + 1))
    return lines


def test_every_error_class_has_its_own_kind() -> None:
    by_kind: dict[str, list[str]] = {}
    for cls in _classes():
        by_kind.setdefault(cls.kind, []).append(f"{cls.__module__}.{cls.__qualname__}")
    assert {kind: names for kind, names in by_kind.items() if len(names) > 1} == {}


@pytest.mark.parametrize("package", ["certify", "attest", "log", "registry", "guard"])
def test_each_package_keeps_its_errors_in_one_module(package: str) -> None:
    homes = {
        cls.__module__ for cls in _classes() if cls.__module__.startswith(f"kcert.{package}.")
    }
    assert homes == {f"kcert.{package}.errors"}


def test_the_docstring_draws_the_real_tree() -> None:
    drawn = [
        line.strip("\n")[4:] for line in (kcert.errors.__doc__ or "").splitlines()
        if line.lstrip().startswith("* ")
    ]  # fmt: skip
    _import_everything()
    assert drawn == _tree(), "\n".join(["redraw kcert/errors.py's tree as:", *_tree()])
