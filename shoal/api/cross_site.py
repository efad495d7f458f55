"""Requests a web page on another site makes a browser send: refused before any route.

An API on 127.0.0.1 without a token trusts every process on the machine, and
a browser on the machine is one: any page it shows can send requests to the
API, and two kinds of them must not work.

- **A cross-site write.** A form on ``http://evil.example`` posting to
  ``http://127.0.0.1:8000/v1/queues/email/pause`` (or a ``fetch`` in
  ``no-cors`` mode) reaches the route; the browser only hides the answer. So a
  write (any method but GET, HEAD, OPTIONS) is refused when the browser says
  it comes from another site (``Sec-Fetch-Site`` other than ``same-origin``
  or ``none``), when its ``Origin`` is not the API's own, and when it is
  neither JSON (``Content-Type: application/json``) nor carries a header no
  form can send (``X-Shoal-Request``, or ``Authorization: Bearer``). The last
  rule alone stops forms even in a browser that sends neither of the others:
  a page can set those headers on a cross-origin request only after a CORS
  preflight, which this API never approves.
- **DNS rebinding.** A page on ``evil.example`` whose name then resolves to
  127.0.0.1 is, to the browser, same-origin with itself: it can read every
  route. Its requests still say ``Host: evil.example``, so every request (reads
  too) whose ``Host`` is not one of the API's names is refused: a loopback
  name or address (``localhost``, ``127.0.0.1``, ``::1``), the address the
  connection arrived on, or a name the operator configured (``allowed_hosts``,
  ``shoal api --allowed-host``). The port is not compared: rebinding changes
  the name a page uses, never the port, and a port differs only behind a
  proxy or forward the operator set up.

Refusals answer shoal's JSON error body (421 for the host, 403 for the
rest) naming the header at fault, and the route never runs. A request with no
``Host`` header at all (no browser sends one) is not a rebinding and passes.

>>> api.add_middleware(CrossSiteGuard, allowed_hosts=["shoal.example.com"])  # doctest: +SKIP
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shoal.api.auth import READ_METHODS, is_loopback
from shoal.api.errors import error_body
from shoal.api.hosts import allowed_host_names, host_name, host_port
from shoal.api.limits import ASGIApp, Receive, Scope, Send

# The header shoal's pages send with every call. A form cannot send it, and a
# page on another origin can only after a CORS preflight nobody here answers.
REQUEST_HEADER = "X-Shoal-Request"
JSON_TYPE = "application/json"
# Sec-Fetch-Site values a write may carry: the API's own page, or the user
# acting directly (a bookmark, the address bar). "same-site" is refused: a page
# on another port of localhost is same-site, and no more trusted than any other.
WRITE_FETCH_SITES = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the answer's status, code and the header at fault."""

    status: int
    code: str
    field: str
    message: str


def _headers(scope: Scope) -> dict[str, str]:
    # The first value of each header wins: a second Host or Origin adds nothing.
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(text)
    # A dual-stack socket (bound to ::) names an IPv4 client's connection
    # ::ffff:10.0.0.5, while the client's Host says 10.0.0.5.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _same_address(name: str, address: str) -> bool:
    try:
        return _ip(name) == _ip(address)
    except ValueError:
        return False


class CrossSiteGuard:
    """Refuse DNS-rebinding requests and cross-site writes; see the module docstring.

    Pure ASGI middleware: it judges the request head alone, reads no body, and
    answers a refusal itself (the app never sees the request).
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed_hosts = allowed_host_names(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.judge(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            # Before accepting: the server answers the handshake 403. A close
            # reason is at most 123 bytes of UTF-8.
            reason = refusal.message.encode()[:120].decode(errors="ignore")
            await send({"type": "websocket.close", "code": 1008, "reason": reason})
        else:
            await _answer(send, refusal)

    def judge(self, scope: Scope) -> Refusal | None:
        """The reason to refuse this request, or None to serve it."""
        headers = _headers(scope)
        host = headers.get("host")
        if host is not None and not self.is_own_host(host, scope.get("server")):
            return Refusal(
                421,
                "misdirected_request",
                "host",
                f"host: {host!r:.200} is not a name this API answers to (a page whose "
                "name was pointed at this machine, DNS rebinding, sends that); serve it "
                "under another name with shoal api --allowed-host NAME",
            )
        writes = scope["type"] == "websocket" or scope.get("method", "GET") not in READ_METHODS
        if not writes:
            return None
        return self._judge_write(headers, is_http=scope["type"] == "http")

    def is_own_host(self, host: str, server: Any) -> bool:
        """True for a loopback name, the connection's own address, or a configured name."""
        name = host_name(host)
        if is_loopback(name) or name in self.allowed_hosts:
            return True
        # The address the connection arrived on (uvicorn's socket name): an
        # IP literal, never a name, so a client cannot choose it.
        return (
            isinstance(server, list | tuple)
            and bool(server)
            and _same_address(name, str(server[0]))
        )

    def _judge_write(self, headers: Mapping[str, str], *, is_http: bool) -> Refusal | None:
        site = headers.get("sec-fetch-site")
        if site is not None and site.strip().lower() not in WRITE_FETCH_SITES:
            return Refusal(
                403,
                "cross_site",
                "sec-fetch-site",
                f"sec-fetch-site: the browser says this write comes from another site "
                f"({site!r:.40}); this API takes writes only from its own pages",
            )
        origin = headers.get("origin")
        if origin is not None and not self.is_own_origin(origin, headers.get("host")):
            return Refusal(
                403,
                "cross_site",
                "origin",
                f"origin: {origin!r:.200} is not this API's own origin; this API takes "
                "writes only from its own pages",
            )
        if is_http and not _cannot_come_from_a_form(headers):
            given = headers.get("content-type")
            return Refusal(
                403,
                "cross_site",
                "content-type",
                f"content-type: a write must be JSON ('Content-Type: {JSON_TYPE}') or carry "
                f"an '{REQUEST_HEADER}: 1' header, which no web form can send; got "
                + ("no Content-Type" if given is None else f"{given!r:.80}"),
            )
        return None

    def is_own_origin(self, origin: str, host: str | None) -> bool:
        """True when ``origin`` is the origin the request was sent to (scheme's default
        port filled in), or names one of the configured hosts (behind a proxy that
        rewrites ``Host``)."""
        try:
            parts = urlsplit(origin.strip())
            origin_port = parts.port
        except ValueError:
            return False  # "null" (a sandboxed page, a file) parses; garbage does not
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            return False
        name = parts.hostname.lower().rstrip(".")
        if name in self.allowed_hosts:
            return True
        if host is None:
            return False
        own = (host_name(host), host_port(host) or DEFAULT_PORTS[scheme])
        return (name, origin_port or DEFAULT_PORTS[scheme]) == own


def _cannot_come_from_a_form(headers: Mapping[str, str]) -> bool:
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type == JSON_TYPE or REQUEST_HEADER.lower() in headers:
        return True
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and bool(credentials.strip())


async def _answer(send: Send, refusal: Refusal) -> None:
    body = json.dumps(error_body(refusal.code, refusal.message, refusal.field)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": refusal.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The body (if any) was never read: the connection carries nothing more.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = ["JSON_TYPE", "REQUEST_HEADER", "WRITE_FETCH_SITES", "CrossSiteGuard", "Refusal"]
