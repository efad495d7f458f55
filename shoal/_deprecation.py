"""Old spellings and old places of public names, kept working with a DeprecationWarning.

Each old spelling maps onto the one name ``docs/glossary.md`` gives the idea;
each name that moved to another module is still found at its old path.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from typing import Any

from shoal.errors import InvalidInput


def warn_renamed(old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn that ``old`` is the deprecated spelling of ``new``.

    ``stacklevel`` counts from the function calling this one (1): the
    default, 2, points the warning at the line that called that function.
    """
    warnings.warn(
        f"{old} is deprecated; use {new} (see docs/glossary.md)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def moved_attribute(
    module: str, name: str, moves: Mapping[str, str], *, stacklevel: int = 2
) -> Any:
    """``name`` of ``module`` from where it moved (``moves[name]``), with a DeprecationWarning.

    For a module's ``__getattr__``, which Python calls only for a name the
    module lacks: a name not in ``moves`` is an AttributeError, as without
    it. The new module is imported on first use (the old one must not import
    it: it may be a layer above). ``stacklevel`` as for :func:`warn_renamed`.
    In ``shoal/ingest/natsd.py``::

        def __getattr__(name: str) -> Any:
            return moved_attribute(__name__, name, {"NatsServer": "shoal.testing"})
    """
    new_module = moves.get(name)
    if new_module is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated: it moved to {new_module}.{name}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return getattr(importlib.import_module(new_module), name)


def retry_limit_from_max_attempts(
    retry_limit: int | None, max_attempts: int | None, *, stacklevel: int = 2
) -> int | None:
    """``retry_limit``, or the one a deprecated ``max_attempts=`` means (one run less).

    ``stacklevel`` as for :func:`warn_renamed`, counted from the caller.

    ``max_attempts`` counted every run, the first included; ``retry_limit``
    counts the runs after the first, as everywhere else in shoal.
    """
    if max_attempts is None:
        return retry_limit
    warn_renamed("max_attempts=N", "retry_limit=N - 1", stacklevel=stacklevel + 1)
    if retry_limit is not None:
        raise InvalidInput("max_attempts", "is the old spelling of retry_limit: pass only one")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidInput("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
    return max_attempts - 1


def check_retry_limit(retry_limit: object) -> None:
    """InvalidInput unless ``retry_limit`` is None (no cap) or an integer >= 0."""
    if retry_limit is not None and (
        isinstance(retry_limit, bool) or not isinstance(retry_limit, int) or retry_limit < 0
    ):
        raise InvalidInput("retry_limit", f"must be an integer >= 0, got {retry_limit!r}")
