"""The commands that look and switch: ``status``, ``queue``, ``topic`` and ``config``."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import timedelta
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# The modules of the subcommands are imported by the commands that use them, so
# `shoal --help` and `shoal migrate` load neither the HTTP API nor the ingest
# supervisor, and a missing extra is an error of the one command that needs it.
from shoal.cli.common import connect_existing, console, ingest_transport
from shoal.errors import InvalidInput

if TYPE_CHECKING:
    from shoal.db.leadership import Holder
    from shoal.ingest.store import TopicState
    from shoal.queue.rows import QueueStateCount


async def cmd_status(args: argparse.Namespace, url: str) -> int:
    from shoal.app import DUTIES
    from shoal.db.leadership import leaders
    from shoal.ingest.store import IngestStore
    from shoal.internal import is_internal

    def shown(queue: str) -> bool:
        return args.internal or not is_internal(queue)

    boss = await connect_existing(args, url)
    try:
        while True:
            rows = [row for row in await boss.stats() if shown(row.queue)]
            paused = {queue for queue in await boss.paused_queues() if shown(queue)}
            topics = await IngestStore(boss.db).topic_states()
            holders = await leaders(boss.db, DUTIES)
            if args.watch:
                Console().clear()
            print_status(args, rows, paused, topics)
            print_leaders(holders)
            if not args.watch:
                return 0
            await asyncio.sleep(args.watch)  # until Ctrl-C
    finally:
        await boss.close()


def print_status(
    args: argparse.Namespace,
    rows: list[QueueStateCount],
    paused: set[str],
    topics: list[TopicState],
) -> None:
    from shoal.queue.states import JobState

    states = list(JobState)
    table = Table(title=f"shoal queues (schema {args.schema})")
    table.add_column("queue")
    for state in states:
        table.add_column(state.value, justify="right")
    table.add_column("oldest waiting", justify="right")
    table.add_column("paused")
    by_queue: dict[str, dict[JobState, int]] = {}
    oldest: dict[str, timedelta] = {}
    for row in rows:
        by_queue.setdefault(row.queue, {})[row.state] = row.count
        if row.oldest_waiting is not None:
            oldest[row.queue] = max(oldest.get(row.queue, timedelta(0)), row.oldest_waiting)
    for queue in sorted(by_queue.keys() | paused):
        counts = by_queue.get(queue, {})
        age = oldest.get(queue)
        table.add_row(
            queue,
            *(str(counts.get(state, 0)) for state in states),
            "-" if age is None else f"{age.total_seconds():.1f}s",
            "[yellow]paused[/yellow]" if queue in paused else "",
        )
    Console(width=max(120, Console().width)).print(table)
    if topics:
        print_topics(topics)


def print_leaders(holders: list[Holder]) -> None:
    """Who leads each of the cluster's duties: a process (``host:pid``), or nobody."""
    table = Table(title="duties (each run by the process that leads it)")
    for column in ("duty", "leader", "connected since"):
        table.add_column(column)
    for h in holders:
        if h.pid is None:
            leader = "nobody"
        else:  # an elector's process, or another session holding the lock (an old monitor)
            leader = escape(h.process or f"{h.application_name} (backend {h.pid})")
        since = "" if h.connected_at is None else h.connected_at.isoformat(timespec="seconds")
        table.add_row(h.duty, leader, since)
    Console(width=max(120, Console().width)).print(table)


def print_topics(topics: list[TopicState]) -> None:
    table = Table(title="ingest topics (as the backlog monitor last saw them)")
    for column in ("topic", "depth", "ready", "in flight", "delayed", "oldest", "wait", "paused"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for t in topics:
        table.add_row(
            t.topic,
            str(t.depth),
            str(t.ready),
            str(t.in_flight),
            str(t.delayed),
            "-" if t.oldest_age_s is None else f"{t.oldest_age_s:.1f}s",
            "-" if t.wait_s is None else f"{t.wait_s:.1f}s",
            "[yellow]paused[/yellow]" if t.paused else "",
        )
    Console(width=max(120, Console().width)).print(table)


async def cmd_queue(args: argparse.Namespace, url: str) -> int:
    from shoal.console.queues import QueueInspector

    boss = await connect_existing(args, url)
    try:
        # An unknown name is refused (listing the known ones), never created.
        inspector = QueueInspector(boss)
        await inspector.require_queue(args.name, "NAME")
        if args.action == "pause":
            await inspector.pause_queue(args.name)
            console.print(f"queue {args.name!r} paused in every process")
        elif args.action == "resume":
            await inspector.resume_queue(args.name)
            console.print(f"queue {args.name!r} resumed")
        else:
            moved = await boss.redrive(args.name)
            console.print(f"redrove {len(moved)} job(s) from {args.name!r}")
    finally:
        await boss.close()
    return 0


async def cmd_topic(args: argparse.Namespace, url: str) -> int:
    from shoal.console.topics import TopicInspector
    from shoal.ingest.pipeline import Pipeline

    transport = ingest_transport()
    boss = await connect_existing(args, url)
    try:
        # An unknown topic is refused (listing the known ones), as `queue` does:
        # an empty table or "published 0" would read as "nothing dead there".
        await TopicInspector(boss).require_topic(args.topic, "TOPIC")
    except BaseException:
        await boss.close()
        raise
    pipeline = Pipeline(boss, transport(boss))
    try:
        if args.action == "redrive":
            await pipeline.start()
            moved = await pipeline.redrive(args.topic, limit=args.limit)
            console.print(f"published {moved} dead letter(s) of {args.topic!r} again")
        else:
            letters = await pipeline.store.dead_letters(args.topic, limit=args.limit)
            table = Table(title=f"dead letters of {args.topic!r} waiting for a redrive")
            for column in ("id", "message", "reason", "attempt", "dead at", "error"):
                table.add_column(column)
            for letter in letters:
                table.add_row(
                    str(letter.id),
                    letter.message_id,
                    letter.reason,
                    str(letter.attempt),
                    letter.dead_at.isoformat(timespec="seconds"),
                    letter.error[:120],
                )
            Console(width=max(120, Console().width)).print(table)
    finally:
        await pipeline.close()
        await boss.close()
    return 0


async def cmd_config(args: argparse.Namespace, url: str) -> int:
    from shoal.ingest.config import RuntimeConfig, check_key_exists
    from shoal.ingest.store import IngestStore

    boss = await connect_existing(args, url)
    config = RuntimeConfig(IngestStore(boss.db))
    try:
        if args.action == "set":
            if args.value is None:
                raise InvalidInput("value", "config set needs a KEY and a VALUE")
            if not args.new:
                stored = [key for key, _, _ in await config.store.config_all()]
                check_key_exists(args.key, stored)
            try:
                value = json.loads(args.value)
            except ValueError:
                value = args.value  # a bare word: the string itself
            await config.set(args.key, value)
            console.print(f"{args.key} = {json.dumps(value)} (every process within 5 s)")
        elif args.action == "get":
            # What processes use: the stored value, else the default (stdout, for scripts).
            print(json.dumps((await config.entry(args.key)).value))
        else:
            out = Console(soft_wrap=True)
            for entry in await config.entries():
                source = "default" if entry.set_at is None else f"set {entry.set_at.isoformat()}"
                out.print(f"{escape(entry.key)} = {escape(json.dumps(entry.value))}  ({source})")
    finally:
        await boss.close()
    return 0
