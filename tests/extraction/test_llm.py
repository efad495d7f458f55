"""End to end with the llm extractor against a local fake endpoint that misbehaves on script.

429 bursts and 5xx are retried, a timed-out call is retried, a malformed answer
is repaired once, an answer that stays malformed and a 400 fail for good;
tokens are recorded per call. Duplicate deliveries of finished items are
skipped by the phantom guard without a model call. Nothing reaches beyond
127.0.0.1.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.batch.states import TaskStatus
from shoal_extract.evaluate import load_key
from shoal_extract.extractors.llm import LlmSettings
from shoal_extract.worker import KIND
from tests.conftest import wait_for

from .conftest import FAST, Bench, open_bench
from .fake_llm import FakeModel, Script, serve_fake

SLOW = {"paper-02.pdf", "paper-09.pdf", "paper-13.txt"}
MALFORMED_ONCE = {"paper-03.pdf", "paper-14.md"}
MALFORMED_ALWAYS = {"paper-04.pdf"}
REJECTED = {"paper-05.pdf"}
BURST = {1: 429, 2: 429, 3: 429, 4: 429, 5: 429, 6: 429, 20: 503, 21: 502}
PRICE_IN, PRICE_OUT = 0.5, 1.5  # USD per million tokens


def llm_settings(url: str) -> LlmSettings:
    return LlmSettings(
        base_url=url,
        model="fake-model",
        api_key="sk-test",
        # Generous: only the held calls time out, however busy the machine.
        timeout_s=5.0,
        price_in_per_mtok=PRICE_IN,
        price_out_per_mtok=PRICE_OUT,
    )


async def run_until_closed(bench: Bench, task_id: str, timeout_s: float = 40) -> None:
    stop = asyncio.Event()
    runner = asyncio.create_task(
        bench.extraction.app.run(bench.boss, stop=stop, grace=timedelta(seconds=1))
    )
    try:

        async def closed() -> bool:
            return (await bench.bench.batches.get(task_id)).status is not TaskStatus.PROCESSING

        await wait_for(closed, timeout_s=timeout_s)
    finally:
        stop.set()
        await runner


async def test_llm_extraction_survives_bursts_timeouts_and_bad_answers(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    fake = FakeModel(
        key,
        Script(
            burst=BURST,
            slow=SLOW,
            malformed_once=MALFORMED_ONCE,
            malformed_always=MALFORMED_ALWAYS,
            reject=REJECTED,
        ),
    )
    with serve_fake(fake) as url:
        bench = await open_bench(boss, replace(FAST, llm=llm_settings(url)))
        try:
            imported = await bench.bench.import_folder(corpus_dir)
            created = await bench.bench.start(
                [d.id for d in imported.documents], "clinical_trial", extractor="llm"
            )
            await run_until_closed(bench, created.task_id)
            page = await bench.bench.all_results(created.task_id)
            lines = {line.file: line for line in page.lines}
            broken = {d["file"] for d in key["documents"] if d["expected"] == "error"}
            failing = broken | MALFORMED_ALWAYS | REJECTED

            # Every document ended exactly once, completed or error, and the task closed.
            view = await bench.bench.batches.get(created.task_id)
            assert view.status is TaskStatus.COMPLETED
            assert len(lines) == len(key["documents"])
            assert {f for f, line in lines.items() if line.status == "error"} == failing
            assert all(line.status == "completed" for f, line in lines.items() if f not in failing)
            assert "invalid after a repair attempt" in (lines["paper-04.pdf"].error or "")
            assert "refused the request (400)" in (lines["paper-05.pdf"].error or "")
            assert all("ParseError" in (lines[f].error or "") for f in broken)

            # Transient failures were retried; the slow ones timed out once first.
            assert all(lines[f].attempts >= 2 for f in SLOW), {f: lines[f].attempts for f in SLOW}
            calls = fake.snapshot()
            assert sum(c.outcome == "rate_limited" for c in calls) == 6
            assert sum(c.outcome == "late" for c in calls) == len(SLOW)

            # The answers are the truth, so the llm extractor scores 100% here.
            report = await bench.bench.evaluate(created.task_id, load_key(corpus_dir / "key.json"))
            for score in report.fields:
                assert score.correct == score.total - len(MALFORMED_ALWAYS | REJECTED), score

            # Each completed item was answered exactly once, by the answer its result names.
            for line in page.lines:
                answers = fake.answers_for(line.item_id)
                if line.status == "completed":
                    assert [a.response_id for a in answers] == [line.response_id], line.file
                else:
                    assert answers == [], line.file

            # Usage: every call recorded, tokens and cost per item.
            usage = await bench.bench.usage(created.task_id)
            assert usage.calls == sum(1 for c in calls if c.item is not None)
            for line in page.lines:
                assert line.usage.calls == sum(c.item == line.item_id for c in calls), line.file
            repaired = lines["paper-03.pdf"]
            outcomes = [c.outcome for c in calls if c.item == repaired.item_id]
            assert outcomes[-2:] == ["malformed", "answered"] and repaired.usage.tokens > 0
            expected_cost = round(
                (usage.prompt_tokens * PRICE_IN + usage.completion_tokens * PRICE_OUT) / 1e6, 6
            )
            assert usage.cost_usd == pytest.approx(expected_cost, abs=1e-5)

            # Duplicate deliveries of finished items (a lease expiring, a redelivered
            # job) are phantom skips: the model is not called, no token is spent.
            before = len(fake.snapshot())
            skips = await bench.bench.batches.phantom_skips()
            completed = [line for line in page.lines if line.status == "completed"]
            for line in completed:
                await boss.send(f"batch.{KIND}", {"item": line.item_id})
            stop = asyncio.Event()
            runner = asyncio.create_task(bench.extraction.app.run(boss, stop=stop))
            try:

                async def skipped() -> bool:
                    return await bench.bench.batches.phantom_skips() >= skips + len(completed)

                await wait_for(skipped, timeout_s=20)
                # Retrying the failed items runs only those; completed ones stay answered once.
                assert await bench.bench.batches.retry_failed(created.task_id) == len(failing)

                async def closed_again() -> bool:
                    view = await bench.bench.batches.get(created.task_id)
                    return view.status is TaskStatus.COMPLETED

                await wait_for(closed_again, timeout_s=20)
            finally:
                stop.set()
                await runner
            after = fake.snapshot()[before:]
            assert {c.file for c in after} <= (MALFORMED_ALWAYS | REJECTED)
            for line in completed:
                assert len(fake.answers_for(line.item_id)) == 1, line.file
        finally:
            await bench.extraction.close()
