"""A worker process running llm extractions is killed with SIGKILL mid-batch; another finishes.

Each document still ends completed or error exactly once, the task closes,
and the fake endpoint never answered an item after the answer its result
records: items whose worker died mid-call are answered again (the
at-least-once window), items whose result was recorded never are.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.batch.states import TaskStatus

from .conftest import FAST, open_bench
from .fake_llm import FakeModel, Script, serve_fake
from .test_llm import llm_settings

ROOT = Path(__file__).parent.parent.parent


def start_worker(db_url: str, llm_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal_extract.cli",
            "--database-url",
            db_url,
            "worker",
            "--concurrency",
            "6",
            "--retry-delay",
            "0.05",
            "--zombie-timeout",
            "2",
            "--grace",
            "2",
            "--llm-base-url",
            llm_url,
            "--llm-model",
            "fake-model",
            "--llm-timeout",
            "5",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
async def test_a_worker_killed_mid_batch_leaves_every_document_done_exactly_once(
    boss: Shoal, db_url: str, corpus_dir: Path, key: dict[str, Any]
) -> None:
    fake = FakeModel(key, Script(delay_s=0.4, burst={3: 429, 4: 503}))
    with serve_fake(fake) as url:
        # This process only creates the task (its zombie timeout, 2 s, goes with it).
        settings = replace(FAST, zombie_timeout=timedelta(seconds=2), llm=llm_settings(url))
        bench = await open_bench(boss, settings)
        imported = await bench.bench.import_folder(corpus_dir)
        created = await bench.bench.start(
            [d.id for d in imported.documents], "clinical_trial", extractor="llm"
        )
        batches = bench.bench.batches
        first = start_worker(db_url, url)
        second: subprocess.Popen[bytes] | None = None
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            # Kill once some items are done and others are waiting on the model
            # (calls inside the endpoint's delay: a running item may still be
            # parsing, and a kill then interrupts no model call).
            while True:
                progress = (await batches.get(created.task_id)).progress
                if progress.completed >= 8 and fake.in_delay() >= 2:
                    break
                assert loop.time() < deadline, f"the first worker never got going: {progress}"
                await asyncio.sleep(0.02)  # noqa: TID251 - polls a worker process (killed below)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            second = start_worker(db_url, url)
            deadline = loop.time() + 60
            while (await batches.get(created.task_id)).status is TaskStatus.PROCESSING:
                if loop.time() > deadline:
                    stuck = await batches.items(created.task_id, status="running")
                    pending = await batches.items(created.task_id, status="pending")
                    raise AssertionError(
                        f"the task never closed after the kill: second worker "
                        f"{'alive' if second.poll() is None else f'exited {second.returncode}'}; "
                        f"running {[(i.id, i.attempts, i.updated_at) for i in stuck.items]}; "
                        f"pending {[(i.id, i.attempts, i.errors) for i in pending.items]}"
                    )
                await asyncio.sleep(0.1)  # noqa: TID251 - polls the restarted worker process
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(15)
            await bench.extraction.close()

        view = await batches.get(created.task_id)
        broken = {d["file"] for d in key["documents"] if d["expected"] == "error"}
        assert view.status is TaskStatus.COMPLETED
        assert (view.progress.completed, view.progress.error) == (
            len(key["documents"]) - len(broken),
            len(broken),
        )
        page = await bench.bench.all_results(created.task_id)
        assert len(page.lines) == len(key["documents"])
        rerun = []
        for line in page.lines:
            answers = fake.answers_for(line.item_id)
            if line.file in broken:
                assert line.status == "error" and answers == []
                continue
            assert line.status == "completed", line
            # The recorded answer is the last one the endpoint gave for this item.
            assert answers and answers[-1].response_id == line.response_id, line.file
            if len(answers) > 1:
                rerun.append(line.file)
        assert rerun, "the kill interrupted no model call; the test proved nothing"
        # Usage holds every call a worker saw the end of; a call in flight when its
        # worker died is the endpoint's to count (its tokens never came back).
        usage = await bench.bench.usage(created.task_id)
        served = [c for c in fake.snapshot() if c.item is not None]
        assert len(page.lines) - len(broken) <= usage.calls <= len(served)
        assert all(line.usage.calls >= 1 for line in page.lines if line.status == "completed")
