"""The HTTP API (FastAPI): ``/v1`` tasks and queues, health, ``/metrics``, the dashboard.

See ``docs/api.md`` for the contract; :func:`create_api` builds the app and
``shoal api --app module:attr`` serves it.
"""

from shoal.api.app import create_api
from shoal.api.auth import is_loopback
from shoal.api.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_REQUEST_DEADLINE_S

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_REQUEST_DEADLINE_S", "create_api", "is_loopback"]
