"""Fixtures of the extraction workbench's tests: the sample corpus, and a workbench on a test DB."""

from __future__ import annotations

import json
import os
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
from tests.conftest import PROGRAM_SKIP, REQUIRE_PROGRAMS

# Short waits so retries and reaping happen within a test's time.
FAST = WorkerSettings(
    concurrency=8,
    retry_limit=5,
    retry_delay=timedelta(milliseconds=50),
    # Far above any stall of a busy machine: a live run is never reaped (and
    # run twice). The test that kills a worker sets a short one of its own.
    zombie_timeout=timedelta(minutes=2),
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


@pytest.fixture(scope="session")
def hard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hard corpus, one paper per layout."""
    from shoal_extract.hard_corpus import write_hard_corpus

    folder = tmp_path_factory.mktemp("hard")
    write_hard_corpus(folder, per_layout=1)
    return folder


@pytest.fixture(scope="session")
def hard_key(hard_dir: Path) -> dict[str, Any]:
    return json.loads((hard_dir / KEY_FILE).read_text())


@pytest.fixture
def tesseract() -> str:
    """Tesseract's English model's folder: tests whose documents include scans need it.

    Skipped (failed where the CI sets REQUIRE_PROGRAMS) when Debian's
    tesseract-ocr-eng is missing, as for a program.
    """
    from shoal_extract.ocr import OcrUnavailable, tessdata_dir

    try:
        return tessdata_dir()
    except OcrUnavailable as exc:
        if os.environ.get(REQUIRE_PROGRAMS):
            pytest.fail(f"{exc} ({REQUIRE_PROGRAMS} is set)")
        pytest.skip(f"{PROGRAM_SKIP}{exc}")
