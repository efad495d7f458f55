"""Each public package declares what it exports in ``__all__``, and exports nothing else.

A name in ``__all__`` is importable (``from shoal.db import free_port``), and
every public attribute of the package, eager or imported on first use (its
``__dir__``), is in ``__all__``: a name cannot become public by accident, nor
stay listed after it moved. The packages are found by walking ``shoal``, so a
new one is checked without being named here. The modules an application
imports beside them (shoal.cli, shoal.metrics, shoal.tracing, and the
pytest plugin shoal.testing.pytest_plugin, whose __all__ lists its fixtures) have an
``__all__`` whose names import; their other names are the module's own.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import shoal


def public_packages() -> list[str]:
    found = ["shoal"]
    for info in pkgutil.walk_packages(shoal.__path__, prefix="shoal."):
        parts = info.name.split(".")
        private = any(part.startswith("_") for part in parts)
        data = parts[-1] == "migrations"  # a layer's SQL files, read by shoal.db.migrate
        if info.ispkg and not private and not data:
            found.append(info.name)
    return sorted(found)


PACKAGES = public_packages()
MODULES = ["shoal.cli", "shoal.metrics", "shoal.testing.pytest_plugin", "shoal.tracing"]


def test_the_walk_finds_the_packages_users_import() -> None:
    assert {"shoal", "shoal.api", "shoal.db", "shoal.ingest", "shoal.testing"} <= set(PACKAGES)


def public_attributes(package: ModuleType) -> set[str]:
    """What ``dir(package)`` shows but underscores and the package's own submodules."""
    names = set()
    for name in dir(package):
        if name.startswith("_"):
            continue
        value = getattr(package, name)
        if isinstance(value, ModuleType) and value.__name__ == f"{package.__name__}.{name}":
            continue  # a submodule, bound on the package by its import
        names.add(name)
    return names


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_exports_exactly_its_all(name: str) -> None:
    package = importlib.import_module(name)
    exported = package.__dict__.get("__all__")
    assert isinstance(exported, list), f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for member in exported:
        assert getattr(package, member) is not None  # imported on first use, if lazy
    assert public_attributes(package) == set(exported)


@pytest.mark.parametrize("name", MODULES)
def test_a_public_module_exports_names_it_has(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__dict__.get("__all__")
    assert isinstance(exported, list), f"{name} has no __all__"
    missing = [member for member in exported if not hasattr(module, member)]
    assert missing == []


def test_a_star_import_gives_the_root_all() -> None:
    namespace: dict[str, object] = {}
    exec("from shoal import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(shoal.__all__)


def test_the_root_all_is_sorted() -> None:
    assert list(shoal.__all__) == sorted(shoal.__all__)
