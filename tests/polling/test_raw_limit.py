"""The gateway's raw answer travels cut to 4 KB of UTF-8, never inside a character."""

from __future__ import annotations

from datetime import UTC, datetime

from shoal_polling import domain
from shoal_polling.domain import OBSERVATIONS, RAW_LIMIT, Observation


def _observation(raw: str) -> Observation:
    return Observation(
        observation_id="obs-1",
        card_id="card-1",
        account_id="acct-1",
        kind="card_status",
        observed_at=datetime(2026, 12, 1, tzinfo=UTC),
        status="active",
        raw=raw,
    )


def test_a_multi_byte_answer_is_cut_to_4096_bytes_of_utf8() -> None:
    raw = '{"status": "' + "€" * 3000 + '"}'  # 3 bytes a character: 9,000+ bytes
    body = OBSERVATIONS.encode(_observation(raw))
    decoded = OBSERVATIONS.decode(body)
    cut = decoded.raw.encode("utf-8")
    assert len(cut) <= RAW_LIMIT
    assert len(cut) > RAW_LIMIT - 4  # only the character that did not fit is gone
    assert raw.startswith(decoded.raw)


def test_the_cut_never_splits_a_character() -> None:
    for width_text in ("é", "€", "𝄞"):  # 2, 3 and 4 bytes
        for shift in range(4):
            text = "a" * shift + width_text * 3000
            cut = domain.cut_utf8(text, RAW_LIMIT)
            assert text.startswith(cut)
            assert len(cut.encode("utf-8")) <= RAW_LIMIT
            assert len(cut.encode("utf-8")) > RAW_LIMIT - len(width_text.encode("utf-8"))


def test_an_answer_within_the_limit_is_kept_whole() -> None:
    raw = "€" * (RAW_LIMIT // 3)
    assert domain.cut_utf8(raw, RAW_LIMIT) == raw
    assert OBSERVATIONS.decode(OBSERVATIONS.encode(_observation(raw))).raw == raw
