"""The poller's client of the carrier gateway."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx

from shoal_polling.domain import ACCOUNT_CONCURRENCY, Kind

QUERY_PATH: dict[Kind, str] = {
    "traffic": "traffic",
    "card_status": "network-status",
    "real_name": "real-name",
}
DEFAULT_TIMEOUT = timedelta(seconds=10)


class GatewayError(Exception):
    """The gateway did not answer with an observation (error status, timeout, refused).

    ``retry_after``: seconds from a 429's ``Retry-After`` header (None without
    one, or when it is not a number of seconds).
    """

    def __init__(
        self, reason: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` of delay-seconds as a float; None for none, a date or garbage."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


@dataclass(frozen=True, slots=True)
class GatewayAnswer:
    observation_id: str
    observed_at: datetime
    used_kb: int | None
    status: str | None
    raw: str


class GatewayClient:
    """Queries go through one small connection pool per carrier account.

    The poller runs up to 20 queries per account at once (D1). One shared
    pool with hundreds of connections made httpx's connection assignment,
    which scans every connection for every waiting request, the poller's
    main CPU cost; per-account pools of 20 keep that scan short.
    ``http`` is a separate client for the gateway's other endpoints.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        per_account: int = ACCOUNT_CONCURRENCY,
    ) -> None:
        self._base_url = base_url
        self._timeout_s = timeout.total_seconds()
        self._transport = transport
        self._per_account = per_account
        self.http = self._client(per_account)
        self._accounts: dict[str, httpx.AsyncClient] = {}

    def _client(self, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self._base_url,
            timeout=self._timeout_s,
            transport=self._transport,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def close(self) -> None:
        clients = [self.http, *self._accounts.values()]
        self._accounts.clear()
        for client in clients:
            await client.aclose()

    async def query(self, account: str, card: str, kind: Kind) -> GatewayAnswer:
        try:
            client = self._accounts.get(account)
            if client is None:
                client = self._accounts[account] = self._client(self._per_account)
            response = await client.get(f"/v1/accounts/{account}/cards/{card}/{QUERY_PATH[kind]}")
        except httpx.HTTPError as exc:
            raise GatewayError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise GatewayError(
                f"gateway {response.status_code}: {response.text[:200]}",
                status=response.status_code,
                retry_after=retry_after_seconds(response.headers.get("retry-after")),
            )
        doc: dict[str, Any] = response.json()
        return GatewayAnswer(
            observation_id=str(doc["observation_id"]),
            observed_at=datetime.fromisoformat(doc["observed_at"]),
            used_kb=None if doc.get("used_kb") is None else int(doc["used_kb"]),
            status=doc.get("status"),
            raw=response.text,
        )

    async def submit_action(
        self, account: str, card: str, action: str, request: str, *, callback: str | None
    ) -> dict[str, Any]:
        """Ask the gateway to ``action`` the card: the request's view (``pending`` at first)."""
        return await self._action(
            "POST",
            f"/v1/accounts/{account}/cards/{card}/actions",
            {"action": action, "request": request, "callback": callback},
        )

    async def action_status(self, request: str) -> dict[str, Any]:
        """Where action ``request`` stands: ``status`` is ``pending`` or ``confirmed``."""
        return await self._action("GET", f"/v1/actions/{request}", None)

    async def acknowledge(self, request: str) -> dict[str, Any]:
        """Tell the gateway the confirmation of ``request`` was taken."""
        return await self._action("POST", f"/v1/actions/{request}/ack", None)

    async def _action(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            response = await self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise GatewayError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code not in (200, 202):
            raise GatewayError(
                f"gateway {response.status_code}: {response.text[:200]}",
                status=response.status_code,
                retry_after=retry_after_seconds(response.headers.get("retry-after")),
            )
        doc: dict[str, Any] = response.json()
        return doc

    async def served(self) -> list[dict[str, Any]]:
        """Every answer the gateway served, in order."""
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            response = await self.http.get("/v1/served", params={"offset": offset})
            response.raise_for_status()
            page = response.json()
            out.extend(page["served"])
            if page["next"] >= page["total"] or not page["served"]:
                return out
            offset = page["next"]
