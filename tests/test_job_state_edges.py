"""Every state change the SQL makes to a job is an edge of the declared state machine.

A trigger records each change of a job's state (and the state each job is
inserted in) while one scenario drives every statement that moves a job:
claim, complete, fail (retry, failed), release, cancel, resume, retry,
redrive, lease expiry, the batch layer's take of item jobs and the ingest
claim. The recorded edges must be declared in ``TRANSITIONS``, and every
declared edge must be recorded: the diagram neither lacks an edge the SQL
uses nor draws one it never takes.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.states import ItemStatus
from shoal.queue.states import TRANSITIONS, JobState

from .batch_helpers import make_batches

RECORDER = """
CREATE TABLE public.job_edge (src text, dst text NOT NULL);
CREATE FUNCTION public.record_job_edge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.job_edge VALUES (NULL, NEW.state::text);
    ELSIF OLD.state IS DISTINCT FROM NEW.state THEN
        INSERT INTO public.job_edge VALUES (OLD.state::text, NEW.state::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER record_job_edge AFTER INSERT OR UPDATE ON shoal.job
    FOR EACH ROW EXECUTE FUNCTION public.record_job_edge();
"""


async def test_every_state_change_the_sql_makes_is_a_declared_edge_and_each_edge_is_made(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    boss = fake_boss
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(RECORDER)

    # claim, complete
    await boss.send("edges", {"n": 1})
    (job,) = await boss.fetch("edges")
    assert await boss.complete(job)
    # fail with attempts left, claim the retry, fail for good, retry(), cancel
    # the retry, resume it
    await boss.send("edges.flaky", {"n": 2}, retry_limit=1)
    (job,) = await boss.fetch("edges.flaky")
    assert await boss.fail(job, "first") is JobState.RETRY
    (job,) = await boss.fetch("edges.flaky")
    assert await boss.fail(job, "second") is JobState.FAILED
    assert await boss.retry(job.id) == {job.id}
    assert await boss.cancel(job.id) == {job.id}
    assert await boss.resume(job.id) == {job.id}
    # cancel a waiting job and an active one
    waiting = await boss.send("edges.cancel", {"n": 3})
    assert waiting is not None and await boss.cancel(waiting) == {waiting}
    await boss.send("edges.cancel", {"n": 4})
    (job,) = await boss.fetch("edges.cancel")
    assert await boss.cancel(job.id) == {job.id}
    # release (snooze, shutdown hand-back)
    await boss.send("edges.release", {"n": 5})
    (job,) = await boss.fetch("edges.release")
    assert await boss.store.release([(job.id, job.attempt, timedelta(0), None)], now=clock.now())
    # lease expiry, by maintenance
    await boss.send("edges.expire", {"n": 6}, expire_in=1)
    (job,) = await boss.fetch("edges.expire")
    clock.advance(timedelta(seconds=2))
    assert (await boss.maintain()).retried == 1
    # a dead letter, redriven: the waiting copy is completed
    await boss.send("edges.dead", {"n": 7}, retry_limit=0, dead_letter="edges.dlq")
    (job,) = await boss.fetch("edges.dead")
    assert await boss.fail(job, "for good") is JobState.FAILED
    assert len(await boss.redrive("edges.dlq")) == 1
    # the batch layer's take: a waiting item job, and one in retry
    batches = make_batches(boss)
    runner = batches.runners["test.kind"]
    queue = batches.kind("test.kind").queue
    await batches.create("test.kind", ["taken"])
    assert len(await runner.claim(queue, 10, now=clock.now())) == 1
    retried = await batches.create("test.kind", ["retried"])
    (job,) = await boss.fetch(queue)  # a plain claim of an item job, then its failure
    assert await boss.fail(job, "plain worker failed") is JobState.RETRY
    clock.advance(timedelta(minutes=1))
    (taken,) = await runner.claim(queue, 10, now=clock.now())
    assert taken.id == job.id and taken.lease_expires_at is None
    (item,) = (await batches.items(retried.task_id)).items
    assert item.status is ItemStatus.RUNNING
    # (The ingest transport's messages are no jobs: they have a table of their own.)

    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT DISTINCT src, dst FROM public.job_edge")
        recorded = set(await cur.fetchall())
    inserted = {dst for src, dst in recorded if src is None}
    assert inserted == {JobState.CREATED.value}, "jobs are inserted waiting"
    made = {(src, dst) for src, dst in recorded if src is not None}
    declared = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert made - declared == set(), "the SQL makes edges the state machine lacks"
    assert declared - made == set(), "declared edges this scenario never made"
