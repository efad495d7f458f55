"""``shoal jobs``, ``shoal job``, ``shoal schedule``, and the refusal of unknown
names by ``shoal queue`` and ``shoal config`` (exit 2, nothing stored)."""

from __future__ import annotations

import asyncio

import pytest

from shoal import PermanentError, Shoal
from shoal.ingest.config import RuntimeConfig
from shoal.ingest.store import IngestStore
from shoal.queue.job import Job
from shoal.queue.states import JobState
from shoal.testing import drain
from tests.cli_helpers import shoal, with_boss


async def _fail(job: Job) -> None:
    raise PermanentError("mailbox full")


async def _failed_job(boss: Shoal) -> int:
    job_id = await boss.send("email_send", {"to": "a@example.com"}, retry_limit=0)
    await drain(boss, "email_send", _fail)
    assert job_id is not None
    return job_id


def test_queue_pause_of_an_unknown_queue_exits_2_and_creates_nothing(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_boss(db_url, lambda boss: boss.send("email_send", {}))
    assert shoal(db_url, "queue", "pause", "nosuchqueue") == 2
    err = capsys.readouterr().err
    assert "no queue 'nosuchqueue'" in err and "known queues: email_send" in err
    assert with_boss(db_url, lambda boss: boss.paused_queues()) == []
    assert shoal(db_url, "queue", "pause", "email_send") == 0
    assert with_boss(db_url, lambda boss: boss.paused_queues()) == ["email_send"]


def test_config_set_of_an_unknown_key_exits_2_and_stores_nothing(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shoal(db_url, "config", "set", "ingest.mdoe", "async") == 2
    err = capsys.readouterr().err
    assert "unknown config key 'ingest.mdoe'" in err and "ingest.mode" in err
    assert with_boss(db_url, lambda boss: IngestStore(boss.db).config_all()) == []
    assert shoal(db_url, "config", "set", "ingest.mode", "async") == 0
    config = with_boss(db_url, lambda boss: RuntimeConfig(IngestStore(boss.db)).get("ingest.mode"))
    assert config == "async"
    # An application's own key: refused until created deliberately, then known.
    assert shoal(db_url, "config", "set", "polling.plan_interval_s", "30") == 2
    assert shoal(db_url, "config", "set", "polling.plan_interval_s", "30", "--new") == 0
    assert shoal(db_url, "config", "set", "polling.plan_interval_s", "45") == 0
    capsys.readouterr()
    assert shoal(db_url, "config", "set", "ingest.mdoe", "async") == 2
    assert "known keys: ingest.mode, polling.plan_interval_s" in capsys.readouterr().err


def test_jobs_and_job_commands(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    job_id = with_boss(db_url, _failed_job)
    assert shoal(db_url, "jobs", "--state", "failed") == 0
    out = capsys.readouterr().out
    assert str(job_id) in out and "mailbox full" in out
    assert shoal(db_url, "job", str(job_id)) == 0
    out = capsys.readouterr().out
    assert "attempt 1 at" in out and "PermanentError: mailbox full" in out

    assert shoal(db_url, "job", "retry", str(job_id)) == 0
    state = with_boss(db_url, lambda boss: boss.get_job(job_id))
    assert state.state is JobState.RETRY
    assert shoal(db_url, "job", "cancel", str(job_id)) == 0
    cancelled = with_boss(db_url, lambda boss: boss.get_job(job_id))
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.errors[-1].message == "cancelled by cli"
    assert shoal(db_url, "job", "rm", str(job_id)) == 0
    capsys.readouterr()
    assert shoal(db_url, "job", str(job_id)) == 2
    assert f"job {job_id} does not exist" in capsys.readouterr().err
    assert shoal(db_url, "jobs", "--queue", "nope") == 2
    assert "no queue 'nope'; there are no queues" in capsys.readouterr().err
    assert shoal(db_url, "job", "explode", "3") == 2


def test_schedule_commands(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with_boss(db_url, lambda boss: boss.schedule("digest", "*/10 * * * * *", queue="mail"))
    assert shoal(db_url, "schedule", "list") == 0
    assert "digest" in capsys.readouterr().out
    assert shoal(db_url, "schedule", "pause", "digest") == 0
    assert with_boss(db_url, lambda boss: boss.schedules()) == []  # paused: not ticking
    assert shoal(db_url, "schedule", "resume", "digest") == 0
    assert len(with_boss(db_url, lambda boss: boss.schedules())) == 1
    capsys.readouterr()
    assert shoal(db_url, "schedule", "pause", "nope") == 2
    assert "known schedules: digest" in capsys.readouterr().err
    assert shoal(db_url, "schedule", "rm", "digest") == 0
    assert with_boss(db_url, lambda boss: boss.schedules()) == []
    assert shoal(db_url, "schedule", "rm", "digest") == 2


async def test_status_watch_redraws_until_interrupted(db_url: str) -> None:
    import signal
    import sys

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shoal.cli",
        "--database-url",
        db_url,
        "status",
        "--watch",
        "0.2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    frames = 0
    async with asyncio.timeout(60):
        while frames < 2:
            line = await process.stdout.readline()
            assert line, "status --watch ended by itself"
            frames += b"shoal queues" in line
        process.send_signal(signal.SIGINT)
        assert await process.wait() == 130
