"""Old spellings of public names keep working, with a DeprecationWarning that
names the new one (docs/glossary.md). The nats-free ingest consumer's own
alias is tested in test_ingest.py."""

from __future__ import annotations

import pytest

from shoal import App, InvalidInput, Topic
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.testing import run_item


async def _noop(_: object) -> None:
    return None


def test_batch_kind_max_attempts_is_retry_limit_plus_one() -> None:
    kind = BatchKind("extract", _noop, retry_limit=2)
    with pytest.warns(DeprecationWarning, match=r"BatchKind\.retry_limit \+ 1"):
        assert kind.max_attempts == 3


async def test_an_item_says_its_retry_limit_and_keeps_max_attempts() -> None:
    seen: list[tuple[int, int, bool, int]] = []

    async def handler(item: Item) -> None:
        with pytest.warns(DeprecationWarning, match=r"Item\.retry_limit \+ 1"):
            max_attempts = item.max_attempts
        seen.append((item.attempt, item.retry_limit, item.is_last_attempt, max_attempts))

    kind = BatchKind("extract", handler, retry_limit=2)
    await run_item(kind, attempt=2)
    await run_item(kind, attempt=3)
    assert seen == [(2, 2, False, 3), (3, 2, True, 3)]


async def test_an_item_runs_status_is_its_outcome_as_the_items_next_status() -> None:
    async def flaky(item: Item) -> None:
        raise ConnectionError("timeout")

    kind = BatchKind("extract", flaky, retry_limit=1)
    retried = await run_item(kind)
    assert retried.outcome == "retried"
    with pytest.warns(
        DeprecationWarning, match=r"ItemRun\.status is deprecated; use ItemRun\.outcome"
    ) as warned:
        assert retried.status == "pending"
    assert warned[0].filename == __file__  # the warning points at the reader's line
    with pytest.warns(DeprecationWarning):
        assert (await run_item(kind, attempt=2)).status == "error"
    with pytest.warns(DeprecationWarning):
        assert (await run_item(BatchKind("extract", _noop))).status == "completed"


def test_app_consumer_and_sink_turn_max_attempts_into_retry_limit() -> None:
    app = App()
    topic: Topic[object] = Topic("readings")
    with pytest.warns(DeprecationWarning, match=r"retry_limit=N - 1") as warned:
        app.consumer(topic, max_attempts=4)(_noop)
    assert warned[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning):
        app.sink(topic, max_attempts=1)(_noop)
    assert [c.options for c in app.consumers] == [{"retry_limit": 3}]
    assert [s.options for s in app.sinks] == [{"retry_limit": 0}]
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInput, match="max_attempts"):
        app.consumer(topic, max_attempts=0)


def test_the_development_servers_are_still_found_where_they_were() -> None:
    import shoal.ingest
    import shoal.testing

    with pytest.warns(DeprecationWarning, match=r"moved to shoal\.testing\.NatsServer") as warned:
        from shoal.ingest import NatsServer
    assert NatsServer is shoal.testing.NatsServer
    assert {w.filename for w in warned} == {__file__}  # the warning points at the import
    with pytest.warns(DeprecationWarning, match=r"shoal\.ingest\.natsd\.NatsCluster"):
        from shoal.ingest.natsd import NatsCluster
    assert NatsCluster is shoal.testing.NatsCluster
    assert "NatsServer" not in dir(shoal.ingest)  # nor in its __all__ (test_public_api.py)
    with pytest.raises(AttributeError, match="no attribute 'NatsServe'"):
        _ = shoal.ingest.NatsServe
