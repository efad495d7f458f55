"""Model calls across workers: a 429 with Retry-After pauses them (the document is not
failed, its retries are not spent), a result is reused for the same content, template
version and model (a cache hit, no call), and the requests and tokens per minute are
shared through PostgreSQL. Time is driven by a fake clock; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from shoal import Shoal
from shoal.batch.states import TaskStatus
from shoal.clock import FakeClock
from shoal_extract.budget import ModelGate, Rates
from shoal_extract.workbench import Upload
from shoal_extract.worker import ExtractionApp
from tests.conftest import wait_for

from .conftest import FAST, Bench, open_bench
from .fake_llm import FakeModel, Script, serve_fake
from .test_llm import llm_settings, run_until_closed

PAPERS = ("paper-01.pdf", "paper-06.txt")


async def _upload(bench: Bench, corpus_dir: Path, names: tuple[str, ...]) -> list[int]:
    stored = await bench.bench.upload([Upload(n, (corpus_dir / n).read_bytes()) for n in names])
    return [d.id for d in stored]


async def test_a_429_with_retry_after_pauses_the_calls_without_spending_a_retry(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    fake = FakeModel(key, Script(retry_after={1: 30}))
    clock = FakeClock()
    with serve_fake(fake) as url:
        extraction = ExtractionApp(replace(FAST, llm=llm_settings(url)), clock=clock)
        store = await extraction.attach(boss)
        bench = Bench(extraction, (await open_bench(boss)).bench, boss)
        (doc,) = await _upload(bench, corpus_dir, ("paper-01.pdf",))
        created = await bench.bench.start([doc], "clinical_trial", extractor="llm")
        stop = asyncio.Event()
        runner = asyncio.create_task(
            extraction.app.run(boss, stop=stop, grace=timedelta(seconds=1))
        )
        try:
            gate = ModelGate(store, clock)

            async def paused() -> bool:
                return any(s.paused_for_s > 0 for s in await gate.states())

            await wait_for(paused)
            (state,) = await gate.states()
            assert state.model == "fake-model" and state.paused_for_s == 30
            # Paused, not failed: the item is still in its first run.
            (item,) = (await bench.bench.batches.items(created.task_id)).items
            assert item.status.value == "running" and item.attempts == 1 and not item.errors
            # Another worker's call to the model waits for the pause too.
            assert await gate.take("fake-model", 100) == 30
            clock.advance(timedelta(seconds=30))

            async def closed() -> bool:
                view = await bench.bench.batches.get(created.task_id)
                return view.status is not TaskStatus.PROCESSING

            await wait_for(closed)
        finally:
            stop.set()
            await runner
            await extraction.close()
    (line,) = (await bench.bench.all_results(created.task_id)).lines
    assert line.status == "completed" and line.attempts == 1 and line.failed_runs == 0
    assert (
        line.fields["title"]
        == {d["file"]: d for d in key["documents"]}["paper-01.pdf"]["fields"]["title"]
    )
    outcomes = [c.outcome for c in fake.snapshot()]
    assert outcomes[0] == "rate_limited" and set(outcomes[1:]) == {"answered"}
    # The ledger: the paused call is counted (it was a request), the pause said so.
    assert line.usage.paused == 1 and line.usage.calls == len(outcomes)


async def test_the_same_document_template_version_and_model_reuse_the_answer(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    fake = FakeModel(key, Script())
    with serve_fake(fake) as url:
        bench = await open_bench(boss, replace(FAST, llm=llm_settings(url)))
        try:
            ids = await _upload(bench, corpus_dir, PAPERS)
            first = await bench.bench.start(ids, "clinical_trial", extractor="llm")
            await run_until_closed(bench, first.task_id)
            calls = len(fake.snapshot())
            assert calls >= 2
            # A re-run of one document with the same template version and model: no call.
            again, _ = await bench.bench.rerun(first.task_id, [ids[0]])
            await run_until_closed(bench, again.task_id)
            # Another template version is another question: the model is asked.
            other = await bench.bench.start(ids[:1], "metadata", extractor="llm")
            await run_until_closed(bench, other.task_id)
        finally:
            await bench.extraction.close()
    assert len(fake.snapshot()) == calls + 1
    before = {r.file: r for r in (await bench.bench.all_results(first.task_id)).lines}
    (hit,) = (await bench.bench.all_results(again.task_id)).lines
    assert hit.status == "completed" and hit.fields == before[hit.file].fields
    assert hit.evidence == before[hit.file].evidence
    usage = await bench.bench.usage(again.task_id)
    assert usage.cached == 1 and usage.calls == 0 and usage.tokens == 0 and usage.cost_usd == 0
    assert (await bench.bench.usage(other.task_id)).cached == 0


async def test_requests_and_tokens_per_minute_are_shared_through_postgres(
    rules_bench: Bench,
) -> None:
    clock = FakeClock()
    store = rules_bench.extraction.store
    assert store is not None
    one = ModelGate(store, clock, Rates(requests_per_minute=2, tokens_per_minute=1_000))
    other = ModelGate(store, clock, Rates(requests_per_minute=2, tokens_per_minute=1_000))
    assert await one.take("m", 300) == 0
    assert await other.take("m", 300) == 0
    # Two requests a minute: the third waits half a minute, whichever worker asks.
    assert await one.take("m", 300) == 30
    clock.advance(timedelta(seconds=30))
    assert await other.take("m", 300) == 0
    # The answer used more tokens than estimated: the bucket is charged the rest.
    # (1,000 - 2 x 300, refilled by 500 in the half minute, less 300: 600 left.)
    await other.settle("m", 300, 1_500)
    (state,) = await one.states()
    assert state.tokens is not None and round(state.tokens) == 600 - 1_200
    # In debt: 900 tokens short of the next call's 300, at 1,000 a minute: 54 s.
    assert round(await one.take("m", 300)) == 54
    # A pause outranks the buckets and is never shortened by a later, shorter one.
    await one.pause("m", 120)
    await other.pause("m", 5)
    assert await other.take("m", 1) == 120
