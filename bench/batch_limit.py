"""The limit for Level 2 (issue 40): a raw SQL loop doing a batch task's work, nothing more.

``python -m bench.batch_bench --libs shoal,rawjobs`` runs it beside shoal.
Its own task, item and job tables (bench_rawjobs); the same work shoal does
for a task, written as plainly as SQL allows:

- create: one transaction writes the task, its items and one job per item
  (one statement), and notifies the worker;
- work: one connection claims 100 jobs per statement (deleted, a one-shot
  delivery) and moves their items pending -> running in that statement (the
  phantom guard: an item not pending is skipped), runs the no-op handler,
  then writes each item's result to its own row in one statement per claim;
- close: when a claim comes back empty, one statement closes every task with
  nothing pending or running; then it waits for a notification (or 1 s).

No leases, retries, heartbeats, limits or history: the floor, not a queue.
Imported by the worker child too, so only the standard library and psycopg.
"""

from __future__ import annotations

from typing import Any

import psycopg

SCHEMA = "bench_rawjobs"
CHANNEL = "bench_rawjobs_items"
CLAIM_BATCH = 100

# Beside the baselines' task and item tables (batch_bench.BASELINE_SCHEMA_SQL).
JOB_TABLE_SQL = """
CREATE TABLE {schema}.job (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id    bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

CREATE = """
WITH t AS (
    INSERT INTO task (total) VALUES (%(total)s) RETURNING id
), i AS (
    INSERT INTO item (task_id, ref)
    SELECT t.id, u.ref FROM t, unnest(%(refs)s::text[]) WITH ORDINALITY AS u(ref, n)
    ORDER BY u.n
    RETURNING id
), j AS (
    INSERT INTO job (item_id) SELECT id FROM i ORDER BY id
)
SELECT id FROM t
"""

# The ids go through arrays (= ANY(ARRAY(...))) so that each statement finds
# its rows by primary key whatever the statistics say: written as joins, the
# planner (statistics of an empty table) scans every job and every pending
# item on each claim, and a claim costs O(N).
CLAIM = """
WITH taken AS (
    DELETE FROM job
    WHERE id = ANY(ARRAY(SELECT id FROM job ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED))
    RETURNING item_id
)
UPDATE item i SET status = 'running', started_at = now(), updated_at = now()
WHERE i.id = ANY(ARRAY(SELECT item_id FROM taken)) AND i.status = 'pending'
RETURNING i.id, i.ref
"""

RECORD = """
UPDATE item i
SET status = 'completed', result = u.result, finished_at = now(), updated_at = now()
FROM unnest(%(ids)s::bigint[], %(results)s::jsonb[]) AS u(id, result)
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status = 'running'
"""

SETTINGS = (
    f"one transaction creates the task, its items and their jobs (one statement); one "
    f"connection claims {CLAIM_BATCH} jobs per statement (DELETE ... = ANY(ARRAY(SELECT ... SKIP "
    "LOCKED))) guarding their "
    "items pending -> running, writes each item's result to its row in one statement per "
    "claim, and closes every task with nothing pending or running when a claim comes back "
    "empty; LISTEN for new tasks"
)


async def create(conn: psycopg.AsyncConnection[Any], refs: list[str]) -> Any:
    """The task, its items and their jobs in one transaction; returns the task's id."""
    async with conn.transaction():
        cur = await conn.execute(CREATE, {"total": len(refs), "refs": refs})
        row = await cur.fetchone()
        assert row is not None
        await conn.execute(f"NOTIFY {CHANNEL}")
    return row[0]


async def work(url: str, close_tasks: str, ready: Any) -> None:
    """The worker loop, until cancelled; ``url`` resolves names in SCHEMA."""
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as listen,
    ):
        await listen.execute(f"LISTEN {CHANNEL}")
        ready()
        while True:
            cur = await conn.execute(CLAIM, (CLAIM_BATCH,))
            rows = await cur.fetchall()
            if rows:
                results = []
                for _id, _ref in rows:
                    results.append("null")  # the no-op handler's result
                await conn.execute(RECORD, {"ids": [r[0] for r in rows], "results": results})
                continue
            await conn.execute(close_tasks)
            async for _ in listen.notifies(timeout=1.0, stop_after=1):
                pass
