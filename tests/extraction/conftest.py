"""Fixtures of the extraction workbench's tests: the sample corpus, and a workbench on a test DB."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal_extract.corpus import KEY_FILE, write_corpus
from shoal_extract.workbench import Workbench
from shoal_extract.worker import ExtractionApp, WorkerSettings

# Short waits so retries and reaping happen within a test's time.
FAST = WorkerSettings(
    concurrency=8,
    retry_limit=5,
    retry_delay=timedelta(milliseconds=50),
    zombie_timeout=timedelta(seconds=2),
)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    return folder


@pytest.fixture(scope="session")
def key(corpus_dir: Path) -> dict[str, Any]:
    return json.loads((corpus_dir / KEY_FILE).read_text())


@dataclass
class Bench:
    extraction: ExtractionApp
    bench: Workbench
    boss: Shoal


async def open_bench(boss: Shoal, settings: WorkerSettings = FAST) -> Bench:
    extraction = ExtractionApp(settings)
    store = await extraction.attach(boss)
    return Bench(extraction, Workbench(extraction.app.batches(boss), store), boss)


@pytest.fixture
async def rules_bench(boss: Shoal) -> AsyncIterator[Bench]:
    bench = await open_bench(boss)
    try:
        yield bench
    finally:
        await bench.extraction.close()
