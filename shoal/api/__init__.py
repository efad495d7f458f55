"""The HTTP API (FastAPI): ``/v1`` tasks and queues, health, ``/metrics``, the dashboard.

See ``docs/api.md`` for the contract; :func:`create_api` builds the app,
:func:`api_config` the uvicorn configuration that serves it, and
``shoal api --app module:attr`` does both. It needs the ``api`` extra
(``pip install 'shoal[api]'``); importing this package alone loads no web
framework, and a name below is imported on first use, where a missing extra
is one line naming it.
"""

import typing as _typing

from shoal.api.defaults import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_DEADLINE_S,
)

if _typing.TYPE_CHECKING:
    from shoal.api.app import create_api
    from shoal.api.auth import is_loopback
    from shoal.api.server import api_config

# Each lazy name -> the module that defines it.
_LAZY = {
    "api_config": "shoal.api.server",
    "create_api": "shoal.api.app",
    "is_loopback": "shoal.api.auth",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal.api' has no attribute {name!r}")
    import importlib

    from shoal.extras import require

    require("api", "shoal's HTTP API")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REQUEST_DEADLINE_S",
    "api_config",
    "create_api",
    "is_loopback",
]
