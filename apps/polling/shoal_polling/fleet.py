"""A fleet of carrier accounts, plans and cards to poll, created in a few statements.

``create_fleet`` is what ``shoal-polling seed`` runs and what the tests use:
``accounts`` accounts of ``cards_per_account`` cards each, every card on one
plan, and a due row per card and step, due now.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal import Database
from shoal_polling.domain import STEPS, AsyncConn

DEFAULT_QUOTA_KB = 1024 * 1024  # 1 GB
DEFAULT_RESET_DAY = 1


@dataclass(frozen=True, slots=True)
class FleetSpec:
    accounts: int = 3
    cards_per_account: int = 10
    quota_kb: int = DEFAULT_QUOTA_KB
    reset_day: int = DEFAULT_RESET_DAY
    # Stop a card at this share of its quota (None: no channel threshold).
    stop_percent: int | None = 100
    # First due times spread evenly over this many seconds (0: every step due now),
    # as a running system's schedule is, rather than all at once: the gateway
    # steps over spread_s, the plan step over plan_spread_s.
    spread_s: float = 0.0
    plan_spread_s: float = 0.0


def account_id(index: int) -> str:
    return f"acct{index:03d}"


def card_id(account: int, index: int) -> str:
    return f"8986{account:03d}{index:08d}"


async def create_fleet(db: Database, spec: FleetSpec) -> int:
    """Create the fleet's rows (idempotent); how many cards it has."""
    accounts = [account_id(a) for a in range(spec.accounts)]
    cards = [
        (card_id(a, c), account_id(a))
        for a in range(spec.accounts)
        for c in range(spec.cards_per_account)
    ]

    async def run(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO shoal_polling.plan (id, quota_kb, reset_day) VALUES ('standard', %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET quota_kb = EXCLUDED.quota_kb,"
            " reset_day = EXCLUDED.reset_day",
            (spec.quota_kb, spec.reset_day),
        )
        await conn.execute(
            "INSERT INTO shoal_polling.account (id) SELECT unnest(%s::text[])"
            " ON CONFLICT DO NOTHING",
            (accounts,),
        )
        if spec.stop_percent is not None:
            await conn.execute(
                "INSERT INTO shoal_polling.channel_threshold (account_id, stop_percent)"
                " SELECT unnest(%s::text[]), %s ON CONFLICT (account_id)"
                " DO UPDATE SET stop_percent = EXCLUDED.stop_percent",
                (accounts, spec.stop_percent),
            )
        await conn.execute(
            "INSERT INTO shoal_polling.card (id, account_id, plan_id)"
            " SELECT c, a, 'standard' FROM unnest(%s::text[], %s::text[]) AS x(c, a)"
            " ON CONFLICT DO NOTHING",
            ([c for c, _ in cards], [a for _, a in cards]),
        )
        # The n-th of a step's N cards is first due at now + spread * n / N.
        await conn.execute(
            "INSERT INTO shoal_polling.due (card_id, step, due_at)"
            " SELECT c, s, now() + make_interval(secs =>"
            "   CASE WHEN s = 'plan' THEN %(plan)s ELSE %(steps)s END"
            "   * (row_number() OVER (PARTITION BY s) - 1) / (count(*) OVER (PARTITION BY s)))"
            " FROM unnest(%(cards)s::text[]) c, unnest(%(names)s::text[]) s"
            " ON CONFLICT DO NOTHING",
            {
                "plan": spec.plan_spread_s,
                "steps": spec.spread_s,
                "cards": [c for c, _ in cards],
                "names": list(STEPS),
            },
        )

    await db.run(run)
    return len(cards)
