"""Bearer-token auth, and the rule for when it is required.

An API reachable only from this machine (bound to a loopback address) may run
without a token: only local processes can reach it (a browser is one, so pages
of other sites are refused by :mod:`shoal.api.cross_site`). Bound to anything else it
must have one; ``shoal api`` refuses to start otherwise. With a token
configured, every ``/v1`` route and ``/metrics`` need
``Authorization: Bearer <token>``; ``/healthz`` and ``/readyz`` stay open for
load balancers and orchestrators, and the dashboard page itself holds no data
(it asks for the token and sends it with each call).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shoal.api.errors import ApiError

TOKEN_ENV = "SHOAL_API_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

# Declares the scheme in the OpenAPI document; the check below answers 401/403
# itself so that both carry shoal's error body.
bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <token>")


def is_loopback(host: str) -> bool:
    """True when an API bound to ``host`` is reachable only from this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison: the time taken tells nothing about the token."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


def require_token(token: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency: passes everything when ``token`` is None."""

    async def open_access() -> None:
        return None

    if token is None:
        return open_access

    async def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        challenge = {"WWW-Authenticate": 'Bearer realm="shoal"'}
        if credentials is None:
            raise ApiError(
                401,
                "authorization: this API needs an 'Authorization: Bearer <token>' header",
                field="authorization",
                headers=challenge,
            )
        if not token_matches(credentials.credentials, token):
            raise ApiError(
                403,
                "authorization: the bearer token is not valid for this API",
                field="authorization",
            )

    return check


# Methods that change nothing: all a read-only API answers.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refuse_writes(read_only: bool) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency: with ``read_only``, any request that could change
    something (any method but GET, HEAD, OPTIONS) is answered 403."""

    async def check(request: Request) -> None:
        if read_only and request.method not in READ_METHODS:
            raise ApiError(
                403,
                f"method: this API is read-only (shoal api --read-only); "
                f"{request.method} {request.url.path!r:.200} changes state",
                field="method",
                code="read_only",
            )

    return check


__all__ = ["TOKEN_ENV", "is_loopback", "refuse_writes", "require_token", "token_matches"]
