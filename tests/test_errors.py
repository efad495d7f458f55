"""The exception tree: every error shoal raises to its callers is a ShoalError,
drawn in ``shoal.errors``'s tree under its real parent, and importable from
``shoal``; caller mistakes are InvalidInput, which is also a ValueError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from datetime import timedelta

import pytest

import shoal
import shoal.errors
from shoal import App, FakeClock, InvalidInput, ShoalError

# Exception classes of the package that are not errors shoal raises to callers.
NOT_CALLER_ERRORS = {
    # A handler raises these to tell the worker what to do; they are not failures.
    "shoal.errors.Snooze",
    "shoal.errors.RetryAfter",
    "shoal.errors.Cancel",
    "shoal.errors.JobCancelled",
    # Raised and answered inside the HTTP API: callers see an HTTP error body.
    "shoal.api.errors.ApiError",
    "shoal.api.limits.LimitExceeded",
    "shoal.api.server.HeadTooLarge",
    # The demo's handler failing on purpose.
    "shoal.demo.FlakyGateway",
    # Raised and caught inside a workflow's runner: they unwind a run's code
    # (BaseExceptions, so its `except Exception` cannot stop them).
    "shoal.workflow.runtime.Suspended",
    "shoal.workflow.runtime.Superseded",
    "shoal.workflow.runtime.MachineryFailed",
}


def public_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in a shoal module, by dotted name."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(shoal.__path__, "shoal."):
        module = importlib.import_module(info.name)
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{obj.__module__}.{name}"] = obj
    return found


def documented_tree() -> dict[str, str | None]:
    """The tree in ``shoal.errors``'s docstring: each name and its parent's."""
    assert shoal.errors.__doc__ is not None
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in shoal.errors.__doc__.splitlines():
        if line.strip() == "ShoalError":
            parents["ShoalError"], stack = None, ["ShoalError"]
            continue
        match = re.match(r"^(\s*(?:[│ ]   )*)[├└]── (\w+)", line)
        if match is None:
            continue
        depth = 1 + (len(match[1]) - 4) // 4
        del stack[depth:]
        parents[match[2]] = stack[-1]
        stack.append(match[2])
    return parents


def test_every_public_exception_is_a_documented_shoal_error() -> None:
    tree = documented_tree()
    found = public_exceptions()
    assert {"PublishError", "UnsafeDurability", "MigrationChanged"} <= {
        cls.__name__ for cls in found.values()
    }
    for dotted, cls in found.items():
        if dotted in NOT_CALLER_ERRORS:
            continue
        name = cls.__name__
        assert issubclass(cls, ShoalError), f"{dotted} is not a ShoalError"
        assert name in tree, f"{dotted} is missing from the tree in shoal.errors"
        assert getattr(shoal, name) is cls, f"{name} is not importable from shoal"
        assert name in shoal.__all__
        parent = tree[name]
        if parent is not None:
            assert cls.__mro__[1] is getattr(shoal, parent), f"{name} is drawn under {parent}"
    # Nothing in the tree that the package does not define.
    assert set(tree) == {cls.__name__ for d, cls in found.items() if d not in NOT_CALLER_ERRORS}


def test_invalid_input_is_a_value_error() -> None:
    assert issubclass(InvalidInput, ValueError)


def test_caller_mistakes_raise_invalid_input() -> None:
    app = App()
    app.handler("q")(_noop)
    with pytest.raises(InvalidInput, match="queue: 'q' already has a handler"):
        app.handler("q")
    app.batch("k")(_noop)
    with pytest.raises(InvalidInput, match="kind: batch kind 'k' is already declared"):
        app.batch("k")
    with pytest.raises(InvalidInput, match="delta: a clock does not go backwards"):
        FakeClock().advance(timedelta(seconds=-1))


async def _noop(_: object) -> None:
    return None
