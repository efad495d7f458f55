"""Leadership hand-over: how long a duty goes without a leader when its leader goes.

    .venv/bin/python bench/leadership_bench.py                 # about 2 minutes
    .venv/bin/python bench/leadership_bench.py --kills 10 --no-freeze

Starts ``--processes`` (3) processes, each an ``Elector`` with the defaults
(retry 5 s, depose_after 30 s) contending for one duty on DATABASE_URL (a
database ``shoal_leadership_bench`` is created and dropped), and watches who
leads through ``leaders()`` every 10 ms. Then, on the leader each time, and
starting a fresh contender after each:

- ``--kills`` times SIGKILL (the kernel closes its socket, the server ends its
  session and frees the lock; a follower takes it at its next try);
- ``--stops`` times SIGTERM (it resigns: the followers are notified and try
  at once);
- once SIGSTOP (a frozen process: connected, running nothing), unless
  ``--no-freeze``: a follower deposes it after ``depose_after``.

It prints, per way of going, the gap from the signal to the moment another
process leads (min / median / max). The gap after a SIGKILL is bounded by
the retry, spread by where each follower was in its wait. This is a
measurement script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

if not __package__:  # run as a file: make ``bench`` and ``shoal`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from shoal.db import Database, migrate
from shoal.db.leadership import Elector, leaders

DUTY = "bench.duty"
DB_NAME = "shoal_leadership_bench"
POLL_S = 0.01
# After every elector is connected, before the leader is signalled.
SETTLE_S = 2.0
GIVE_UP_S = 120.0


async def contend(url: str) -> None:
    """A child: contend for DUTY until killed, or until SIGTERM (then resign, as shoal worker)."""
    db = Database(url, max_size=1)
    elector = Elector(db, identity=f"bench:{os.getpid()}")
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await elector.lead(DUTY, asyncio.Event().wait)
    except asyncio.CancelledError:
        pass
    finally:
        await elector.close()


def spawn(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--child", url])


async def leader_pid(db: Database) -> int | None:
    (holder,) = await leaders(db, [DUTY])
    if holder.process is None:
        return None
    return int(holder.process.rsplit(":", 1)[1])


async def wait_leader(db: Database, other_than: int | None = None) -> tuple[int, float]:
    """The pid of the next leader (not ``other_than``), and when it was first seen."""
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        pid = await leader_pid(db)
        if pid is not None and pid != other_than:
            return pid, time.monotonic()
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"no new leader within {GIVE_UP_S:g}s")


async def settled(db: Database, n: int) -> None:
    """Until ``n`` electors are connected, then a little more: every follower is in its
    wait between tries, at a phase of its own, when the leader goes."""
    query = sql.Composed(
        [sql.SQL("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %(name)s")]
    )
    deadline = time.monotonic() + GIVE_UP_S
    while (await db.fetch(query, {"name": "shoal-elector bench:%"}))[0][0] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} electors not connected within {GIVE_UP_S:g}s")
        await asyncio.sleep(POLL_S)
    await asyncio.sleep(SETTLE_S)


async def hand_over(
    url: str, db: Database, procs: dict[int, subprocess.Popen[bytes]], sig: signal.Signals
) -> float:
    """Signal the leader; seconds until another leads. The leader is replaced by a fresh one."""
    await settled(db, len(procs))
    pid, _ = await wait_leader(db)
    old = procs.pop(pid)
    at = time.monotonic()
    old.send_signal(sig)
    _, seen = await wait_leader(db, other_than=pid)
    if sig == signal.SIGSTOP:
        old.send_signal(signal.SIGKILL)
        old.send_signal(signal.SIGCONT)
    old.wait()
    fresh = spawn(url)
    procs[fresh.pid] = fresh
    return seen - at


def summary(gaps: list[float]) -> str:
    if not gaps:
        return "-"
    return (
        f"{min(gaps) * 1000:.0f} / {statistics.median(gaps) * 1000:.0f} / "
        f"{max(gaps) * 1000:.0f} ms (n={len(gaps)})"
    )


async def main(args: argparse.Namespace) -> None:
    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    admin = make_conninfo(base, dbname=conninfo_to_dict(base).get("dbname") or "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    url = make_conninfo(base, dbname=DB_NAME)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        async with Database(url, max_size=2) as db:
            await migrate(db)
            for _ in range(args.processes):
                proc = spawn(url)
                procs[proc.pid] = proc
            ways = [
                ("SIGKILL", signal.SIGKILL, args.kills),
                ("SIGTERM", signal.SIGTERM, args.stops),
            ]
            if args.freeze:
                ways.append(("SIGSTOP", signal.SIGSTOP, 1))
            for name, sig, times in ways:
                gaps = [await hand_over(url, db, procs, sig) for _ in range(times)]
                print(f"{name:8} leader -> another leads: min / median / max {summary(gaps)}")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME))
            )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        asyncio.run(contend(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--stops", type=int, default=8)
    parser.add_argument("--no-freeze", dest="freeze", action="store_false")
    asyncio.run(main(parser.parse_args()))
